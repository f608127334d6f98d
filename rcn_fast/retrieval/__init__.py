"""The retrieval stack: encoders (torch / ONNX Runtime), the on-disk corpus
store and its resumable build, the :class:`Retriever`, and retriever
training. Heavy dependencies (torch, transformers, onnxruntime) are imported
only when a component that needs them is built.
"""

from __future__ import annotations

from rcn_fast.model_files import model_fingerprint
from rcn_fast.retrieval.encoder import Encoder, EncoderConfig, EncoderLike, TorchEncoder
from rcn_fast.retrieval.onnx_backend import OnnxEncoder, export_onnx
from rcn_fast.retrieval.build import BuildConfig, build_corpus, merge_shards
from rcn_fast.retrieval.retriever import Retriever, RetrieverLike
from rcn_fast.retrieval.store import CorpusStore, PassageStore
from rcn_fast.retrieval.types import Passage

__all__ = [
    "Encoder", "EncoderConfig", "EncoderLike", "OnnxEncoder", "TorchEncoder", "export_onnx",
    "model_fingerprint", "Passage", "BuildConfig", "build_corpus", "merge_shards", "CorpusStore",
    "PassageStore", "Retriever", "RetrieverLike",
]
