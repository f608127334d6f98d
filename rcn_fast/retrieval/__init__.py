"""The retrieval stack, as leaves: encoders (``encoders/``: base, torch,
ONNX Runtime, one :func:`load_encoder`), indexes (``index.py``:
:class:`FlatIndex`, :class:`FaissIndex`), the on-disk corpus store (its
reader and writer in ``store.py``) and its resumable build, the
:class:`Retriever` (encoder + store + an index passed in), retriever
training, and every protocol in ``protocols.py``. Heavy dependencies
(torch, transformers, onnxruntime, faiss) are imported only when a
component that needs them is built.
"""

from __future__ import annotations

from rcn_fast.model_files import model_fingerprint
from rcn_fast.retrieval.encoders import Encoder, EncoderConfig, OnnxEncoder, TorchEncoder, export_onnx, load_encoder
from rcn_fast.retrieval.build import BuildConfig, build_corpus, merge_shards
from rcn_fast.retrieval.index import FaissIndex, FlatIndex
from rcn_fast.retrieval.memory import InMemoryRetriever
from rcn_fast.retrieval.protocols import EmbeddingRetriever, EncoderLike, PassageStore, RetrieverLike, VectorIndex
from rcn_fast.retrieval.retriever import Retriever
from rcn_fast.retrieval.store import CorpusStore
from rcn_fast.retrieval.types import Passage

__all__ = [
    "Encoder", "EncoderConfig", "EncoderLike", "OnnxEncoder", "TorchEncoder", "export_onnx",
    "model_fingerprint", "Passage", "BuildConfig", "build_corpus", "merge_shards", "CorpusStore",
    "PassageStore", "Retriever", "RetrieverLike", "load_encoder", "FlatIndex", "FaissIndex", "VectorIndex",
    "EmbeddingRetriever", "InMemoryRetriever",
]
