"""Bi-encoders for dense retrieval: a Hugging Face BERT-family model run by
PyTorch (:mod:`~rcn_fast.retrieval.encoders.torch`) or by ONNX Runtime on
a graph rcn_fast exports itself (:mod:`~rcn_fast.retrieval.encoders.onnx`),
over the shared base (:mod:`~rcn_fast.retrieval.encoders.base`: config,
folder settings, tokenising and batching). :func:`load_encoder` is the one
place a config becomes an encoder (``Encoder.from_config`` and
``Encoder.from_pretrained`` call it).
"""

from __future__ import annotations

from typing import Any

from rcn_fast.retrieval.encoders.base import Encoder, EncoderConfig, folder_settings
from rcn_fast.retrieval.encoders.onnx import OnnxEncoder, export_onnx
from rcn_fast.retrieval.encoders.torch import TorchEncoder


def load_encoder(config: EncoderConfig | dict[str, Any], *, verify_export: bool = False) -> Encoder:
    """Build the encoder a config describes.

    Parameters
    ----------
    config : EncoderConfig or dict
        A dict is read with :meth:`EncoderConfig.from_dict` (unknown keys
        are an error).
    verify_export : bool
        ONNX: rehash every file of the cached export (see
        :func:`~rcn_fast.retrieval.encoders.onnx.export_onnx`).

    Returns
    -------
    Encoder
        A :class:`TorchEncoder` (``backend="torch"``) or an
        :class:`OnnxEncoder` (``backend="onnx"``).
    """
    if isinstance(config, dict):
        config = EncoderConfig.from_dict(config)
    if not isinstance(config, EncoderConfig):
        raise TypeError(f"config: expected EncoderConfig or dict, got {type(config).__name__}")
    if config.backend == "torch":
        return TorchEncoder(config)
    return OnnxEncoder(config, verify_export=verify_export)


__all__ = ["Encoder", "EncoderConfig", "OnnxEncoder", "TorchEncoder", "export_onnx", "folder_settings",
           "load_encoder"]
