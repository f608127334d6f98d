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
from rcn_fast.retrieval.encoders.batching import (
    Pending, PreparedTexts, Tokenized, batch_progress, device_batch_tokens, pack_batch,
)
from rcn_fast.retrieval.encoders.unpadded import (
    UnpaddedBert, flash_varlen, segment_pool, unpadded_supported, varlen_attention_reference,
)

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
    """The encoder run by PyTorch (CPU or CUDA).

    On CUDA: bfloat16 unless another dtype is set; the token budget of a
    batch from the free device memory; each batch's inputs pinned in host
    memory (in :meth:`prepare`, so in the corpus build's background
    threads) and copied without blocking; the outputs pooled, normalised
    and copied back on the device's stream, with one wait per
    :meth:`run` (in :meth:`Pending.result`). With flash-attn installed, BERT
    models run unpadded (:mod:`~rcn_fast.retrieval.encoders.unpadded`).
    """

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
        self.unpadded = self._unpadded_runner()
        if config.intra_op_threads:
            torch.set_num_threads(config.intra_op_threads)
        if self.device.type == "cuda" and config.batch_tokens is None:
            c = self.hf_config
            self.batch_tokens = device_batch_tokens(
                torch.cuda.mem_get_info(self.device)[0], hidden=int(c.hidden_size),
                intermediate=int(getattr(c, "intermediate_size", 4 * c.hidden_size)),
                heads=int(c.num_attention_heads), max_length=self.max_length,
                dtype_bytes=2 if config.dtype != "float32" else 4)
        logger.info("torch encoder %s on %s (%s, %s attention, %d tokens a batch)", config.model, self.device,
                    config.dtype, "unpadded" if self.unpadded is not None else "padded SDPA", self.batch_tokens)

    def _unpadded_runner(self) -> Any:
        """The packed-token runner the ``unpadded`` setting asks for, or None."""
        want = self.config.unpadded
        if want is False:
            return None
        why = unpadded_supported(self.model)
        flash = flash_varlen() if self.device.type == "cuda" and self.config.dtype != "float32" else None
        if want is None:
            return UnpaddedBert(self.model, flash) if flash is not None and why is None else None
        if why is not None:
            raise ValueError(f"unpadded: this model cannot run unpadded: {why}; pass unpadded=False")
        return UnpaddedBert(self.model, flash or varlen_attention_reference)  # flash-attn only where it runs

    def _feed(self, tok: Tokenized, rows: np.ndarray) -> Any:
        feed = pack_batch(tok, rows) if self.unpadded is not None else super()._feed(tok, rows)
        if self.device.type != "cuda":
            return feed
        torch = require("torch", TORCH_HINT)
        out = {k: torch.from_numpy(v).pin_memory() if v.ndim else int(v) for k, v in feed.items()}
        out["rows"] = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).pin_memory()
        return out

    def _pooled(self, feed: dict[str, Any]) -> Any:
        """float32 [b, d] pooled outputs of one batch, on the device (inputs
        numpy arrays or pinned tensors, moved without blocking)."""
        torch = require("torch", TORCH_HINT)

        def dev(x: Any) -> Any:
            x = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
            return x.to(self.device, non_blocking=True)

        if self.unpadded is None:
            return self.module(*(dev(feed[n]) for n in self.input_names))
        cu = dev(feed["cu_seqlens"])
        h = self.unpadded(dev(feed["input_ids"]), dev(feed["position_ids"]), cu, int(feed["max_seqlen"]))
        return segment_pool(h, cu, self.config.pooling)

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        torch = require("torch", TORCH_HINT)
        with torch.inference_mode():
            return self._pooled(feed).float().cpu().numpy()

    def run(self, prepared: PreparedTexts, *, show_progress: bool = False) -> Pending:
        """See :meth:`Encoder.run`; on CUDA every batch is queued on the
        device and the result copied to pinned host memory without a wait:
        ``.result()`` waits for it (the bar of ``show_progress`` counts
        batches queued)."""
        if self.device.type != "cuda" or prepared.n == 0:
            return super().run(prepared, show_progress=show_progress)
        torch = require("torch", TORCH_HINT)
        with torch.inference_mode(), batch_progress(len(prepared.batches), show_progress) as tick:
            out = torch.empty((prepared.n, self.dim), dtype=torch.float32, device=self.device)
            for _, feed in prepared.batches:
                out.index_copy_(0, feed["rows"].to(self.device, non_blocking=True), self._pooled(feed).float())
                tick()
            if self.config.normalize:  # as normalize_rows: rows of norm 0 stay 0
                norms = out.norm(dim=1, keepdim=True)
                out /= torch.where(norms > 0, norms, torch.ones_like(norms))
            host = torch.empty(out.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(out, non_blocking=True)
            done = torch.cuda.Event()
            done.record()

        def wait() -> np.ndarray:
            done.synchronize()
            return host.numpy()

        return Pending(wait=wait)


__all__ = ["TorchEncoder", "load_hf_model", "model_inputs", "pooled_module"]
