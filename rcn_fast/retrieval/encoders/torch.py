"""The encoder run by PyTorch (CPU or CUDA), and the pooled module it runs
(the same module the ONNX side exports)."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoders.base import TORCH_HINT, Encoder, EncoderConfig

logger = logging.getLogger("rcn_fast.retrieval")


def pooled_module(model: Any, pooling: str, input_names: tuple[str, ...]) -> Any:
    """A torch module: (input_ids, attention_mask[, token_type_ids]) ->
    pooled float32 [B, d]. The same module is run by TorchEncoder and
    exported to ONNX."""
    torch = require("torch", TORCH_HINT)

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
            kw = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kw["token_type_ids"] = token_type_ids
            h = self.model(**kw).last_hidden_state.float()
            if pooling == "cls":
                return h[:, 0]
            if pooling == "lasttoken":  # rows are right-padded: the last attended token
                last = (attention_mask.sum(1) - 1).clamp(min=0)
                return h[torch.arange(h.shape[0], device=h.device), last]
            w = attention_mask.unsqueeze(-1).to(h.dtype)
            if pooling == "max":  # padded positions never win (sentence-transformers sets them to -1e9)
                return torch.where(w > 0, h, torch.full_like(h, -1e9)).max(1).values
            return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)

    return Pooled().eval()


def model_inputs(model: Any) -> tuple[str, ...]:
    """The input names a Hugging Face model's ``forward`` takes, of
    ``input_ids``, ``attention_mask`` and ``token_type_ids``."""
    params = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in params:
        names.append("token_type_ids")
    return tuple(names)


def load_hf_model(model_dir: Path) -> Any:
    """The Hugging Face ``AutoModel`` of ``model_dir`` (SDPA attention), in eval mode."""
    transformers = require("transformers", TORCH_HINT)
    require("torch", TORCH_HINT)
    model = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="sdpa", trust_remote_code=False)
    return model.eval()


class TorchEncoder(Encoder):
    """The encoder run by PyTorch (CPU or CUDA)."""

    backend = "torch"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        config = self.config  # with the folder's settings filled in
        torch = require("torch", TORCH_HINT)
        self.model = load_hf_model(self.model_dir)
        self.input_names = model_inputs(self.model)
        self.device = torch.device(config.device or "cpu")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {config.device!r} requested but torch sees no CUDA device")
        if config.dtype == "float16" and self.device.type != "cuda":
            raise ValueError("dtype: float16 needs a CUDA device; use 'bfloat16' or 'float32' on the CPU")
        self.model.to(device=self.device, dtype=getattr(torch, config.dtype))
        self.module = pooled_module(self.model, config.pooling, self.input_names)
        if config.intra_op_threads:
            torch.set_num_threads(config.intra_op_threads)
        logger.info("torch encoder %s on %s", config.model, self.device)

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        torch = require("torch", TORCH_HINT)
        with torch.inference_mode():
            args = [torch.from_numpy(feed[n]).to(self.device) for n in self.input_names]
            return self.module(*args).float().cpu().numpy()


__all__ = ["TorchEncoder", "load_hf_model", "model_inputs", "pooled_module"]
