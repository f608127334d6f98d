"""Bi-encoders for dense retrieval: a Hugging Face BERT-family model run by
PyTorch (:mod:`~rcn_fast.retrieval.encoders.torch`) or by ONNX Runtime on
a graph rcn_fast exports itself (:mod:`~rcn_fast.retrieval.encoders.onnx`),
over the shared base (:mod:`~rcn_fast.retrieval.encoders.base`: config,
folder settings, tokenising and batching, and :func:`load_encoder`, the one
place a config becomes an encoder), the batching of tokenised texts to a
token budget or into length buckets of static shapes
(:mod:`~rcn_fast.retrieval.encoders.batching`), a model folder's config,
tokenizer and weights read with the fewest imports
(:mod:`~rcn_fast.retrieval.encoders.loading`), the torch backend's own
BERT (:mod:`~rcn_fast.retrieval.encoders.bert`: transformers'
``BertModel`` to the bit on the CPU, without its import chain) and the
attention kernels of its packed forward
(:mod:`~rcn_fast.retrieval.encoders.unpadded`). Each backend's class registers its
``backend`` name with the base when defined; importing this package
defines both.
"""

from __future__ import annotations

from rcn_fast.retrieval.encoders.base import Encoder, EncoderConfig, folder_settings, load_encoder
from rcn_fast.retrieval.encoders.onnx import OnnxEncoder, export_onnx
from rcn_fast.retrieval.encoders.torch import TorchEncoder

__all__ = ["Encoder", "EncoderConfig", "OnnxEncoder", "TorchEncoder", "export_onnx", "folder_settings",
           "load_encoder"]
