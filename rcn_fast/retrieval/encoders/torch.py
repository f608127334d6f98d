"""The encoder run by PyTorch (CPU or CUDA), the pooled module the ONNX
side exports, and the asynchronous device loop.

BERT models run the native BERT of :mod:`~rcn_fast.retrieval.encoders.bert`
(torch and safetensors imported, nothing else); other models run
transformers' own model class for their ``model_type``
(:func:`load_hf_model`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.retrieval.encoders.base import TORCH_HINT, Encoder, EncoderConfig
from rcn_fast.retrieval.encoders.batching import (
    Pending, PreparedTexts, Tokenized, batch_progress, device_batch_tokens, pack_batch, plan_buckets,
)
from rcn_fast.retrieval.encoders.bert import bert_unsupported, load_native_bert
from rcn_fast.retrieval.encoders.loading import read_model_config
from rcn_fast.retrieval.encoders.unpadded import choose_kernel, packed_attention, segment_pool, warm_jagged

logger = logging.getLogger("rcn_fast.retrieval")


def pool_padded(h: Any, attention_mask: Any, pooling: str) -> Any:
    """Pool right-padded token states: float [b, L, d] -> float32 [b, d]
    (``attention_mask`` [b, L], 1 = a token)."""
    torch = require("torch", TORCH_HINT)
    h = h.float()
    if pooling == "cls":
        return h[:, 0]
    if pooling == "lasttoken":  # rows are right-padded: the last attended token
        last = (attention_mask.sum(1) - 1).clamp(min=0)
        return h[torch.arange(h.shape[0], device=h.device), last]
    w = attention_mask.unsqueeze(-1).to(h.dtype)
    if pooling == "max":  # padded positions never win (sentence-transformers sets them to -1e9)
        return torch.where(w > 0, h, torch.full_like(h, -1e9)).max(1).values
    return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)


def pooled_module(model: Any, pooling: str, input_names: tuple[str, ...]) -> Any:
    """A torch module: (input_ids, attention_mask[, token_type_ids]) ->
    pooled float32 [B, d] of a transformers model. The ONNX side exports
    it; the torch encoder runs it for models the native BERT does not."""
    torch = require("torch", TORCH_HINT)

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
            kw = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kw["token_type_ids"] = token_type_ids
            return pool_padded(self.model(**kw).last_hidden_state, attention_mask, pooling)

    return Pooled().eval()


def model_inputs(model: Any) -> tuple[str, ...]:
    """The input names a Hugging Face model's ``forward`` takes, of
    ``input_ids``, ``attention_mask`` and ``token_type_ids``."""
    params = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in params:
        names.append("token_type_ids")
    return tuple(names)


def hf_model_class(model_dir: Path) -> Any:
    """transformers' base model class for the folder: the class of its
    ``config.json``'s ``architectures`` ending in ``Model`` from the
    module of its ``model_type`` (imported alone), else ``AutoModel``."""
    transformers = require("transformers", TORCH_HINT)
    cfg = read_model_config(model_dir)
    names = [a for a in (cfg.get("architectures") or []) if isinstance(a, str) and a.endswith("Model")]
    if cfg.model_type and names:
        try:
            package = importlib.import_module(f"transformers.models.{cfg.model_type.replace('-', '_')}")
            cls = getattr(package, names[0], None)
        except ImportError:
            cls = None
        if cls is not None:
            return cls
    return transformers.AutoModel


def load_hf_model(model_dir: Path) -> Any:
    """transformers' model of ``model_dir`` (:func:`hf_model_class`; SDPA
    attention, ``trust_remote_code=False``), in eval mode."""
    require("torch", TORCH_HINT)
    cls = hf_model_class(Path(model_dir))
    model = cls.from_pretrained(str(model_dir), attn_implementation="sdpa", trust_remote_code=False)
    return model.eval()


class CudaQueue:
    """What the asynchronous loop of :meth:`TorchEncoder.run` asks of a
    device: page-locked host copies of a batch's inputs (made in the
    prepare threads), copies to the device that do not block, and a copy
    back whose wait is deferred to :meth:`Pending.result`. Nothing here
    waits for the device but that deferred wait."""

    def __init__(self, device: Any) -> None:
        self.torch = require("torch", TORCH_HINT)
        self.device = device

    def pin(self, x: np.ndarray) -> Any:
        """A page-locked host tensor holding ``x``."""
        return self.torch.from_numpy(x).pin_memory()

    def upload(self, t: Any) -> Any:
        return t.to(self.device, non_blocking=True)

    def download(self, out: Any) -> Pending:
        """``out`` copied to the host once the device gets there; the
        Pending waits for that copy."""
        host = self.torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)  # on the current stream of out's device
        done = self.torch.cuda.Event()
        # recorded on that stream: Event.record() alone records on the current
        # device's stream, which never sees this copy when the encoder runs on
        # another GPU (issue 55, W3)
        done.record(self.torch.cuda.current_stream(out.device))

        def wait() -> np.ndarray:
            done.synchronize()
            return host.numpy()

        return Pending(wait=wait)


class TorchEncoder(Encoder):
    """The encoder run by PyTorch (CPU or CUDA).

    BERT models run the native BERT (padded on the CPU, as transformers'
    ``BertModel`` computes it; packed with variable-length attention on
    CUDA or with ``unpadded=True``:
    :mod:`~rcn_fast.retrieval.encoders.unpadded`). On CUDA: bfloat16
    unless another dtype is set; the token budget of a batch from the free
    device memory; padded batches (``unpadded=False``) cut into length
    buckets of static shapes; each batch's inputs pinned in host memory (in
    :meth:`prepare`, so in the corpus build's background threads) and
    copied without blocking; the outputs pooled, normalised and copied back
    on the device's stream, with one wait per :meth:`run` (in
    :meth:`Pending.result`): the loop never reads a device value.
    """

    backend = "torch"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        config = self.config  # with the folder's settings filled in
        torch = require("torch", TORCH_HINT)
        self.device = torch.device(config.device or "cpu")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device: {config.device!r} requested but torch sees no CUDA device")
        if config.dtype == "float16" and self.device.type != "cuda":
            raise ValueError("dtype: float16 needs a CUDA device; use 'bfloat16' or 'float32' on the CPU")
        dtype = getattr(torch, config.dtype)
        #: why the native BERT does not run this model (None: it does)
        self.native_unsupported = bert_unsupported(self.model_config, self.model_dir)
        if self.native_unsupported is None:
            self.model = load_native_bert(self.model_dir, self.model_config, device=self.device, dtype=dtype)
            self.input_names = ("input_ids", "attention_mask")
            self.module = None
        else:
            self.model = load_hf_model(self.model_dir).to(device=self.device, dtype=dtype)
            self.input_names = model_inputs(self.model)
            self.module = pooled_module(self.model, config.pooling, self.input_names)
        #: the packed-attention kernel (:data:`~rcn_fast.retrieval.encoders.unpadded.KERNELS`), None: padded
        self.kernel = self._packed_kernel(dtype)
        if self.kernel == "jagged":
            warm_jagged()  # its first use imports torch's nested tensors: now, beside the loading
        #: padded batches in length buckets of static shapes
        self.buckets = self.kernel is None and (config.buckets if config.buckets is not None
                                                else self.device.type == "cuda")
        #: the asynchronous device loop (None: batches run one after another, results read at once)
        self.queue: Any = CudaQueue(self.device) if self.device.type == "cuda" else None
        if config.intra_op_threads:
            torch.set_num_threads(config.intra_op_threads)
        if self.device.type == "cuda" and config.batch_tokens is None:
            c = self.model_config
            self.batch_tokens = device_batch_tokens(
                torch.cuda.mem_get_info(self.device)[0], hidden=c.hidden_size, intermediate=c.intermediate_size,
                heads=c.num_attention_heads, max_length=self.max_length,
                dtype_bytes=2 if config.dtype != "float32" else 4)
        how = f"packed, {self.kernel} attention" if self.kernel else \
            "padded SDPA" + (", length buckets" if self.buckets else "")
        logger.info("torch encoder %s on %s (%s, %s, %s, %d tokens a batch)", config.model, self.device,
                    config.dtype, "native BERT" if self.module is None else type(self.model).__name__, how,
                    self.batch_tokens)

    def _packed_kernel(self, dtype: Any) -> str | None:
        """The packed-attention kernel the ``unpadded`` setting asks for, or
        None for padded batches (the CPU's default: the bytes of
        transformers' ``BertModel``)."""
        want = self.config.unpadded
        if want is False:
            return None
        if self.native_unsupported is not None:
            if want:
                raise ValueError(f"unpadded: this model cannot run unpadded: {self.native_unsupported}; "
                                 "pass unpadded=False")
            return None
        if want is None and self.device.type != "cuda":
            return None
        return choose_kernel(self.device, dtype, self.model.head_dim)

    # ------------------------------------------------------------- batches
    def _plan(self, lengths: np.ndarray, batch_size: int) -> list[tuple[np.ndarray, tuple[int, int] | None]]:
        if not self.buckets:
            return super()._plan(lengths, batch_size)
        return [(b.rows, b.shape) for b in plan_buckets(lengths, self.batch_tokens, batch_size, self.max_length)]

    def _feed(self, tok: Tokenized, rows: np.ndarray, shape: tuple[int, int] | None = None) -> Any:
        feed = pack_batch(tok, rows) if self.kernel is not None else super()._feed(tok, rows, shape)
        if self.queue is None:
            return feed
        out = {k: self.queue.pin(v) if v.ndim else v.item() for k, v in feed.items()}
        out["rows"] = self.queue.pin(np.ascontiguousarray(rows, dtype=np.int64))
        return out

    def _pooled(self, feed: dict[str, Any]) -> Any:
        """float32 [R, d] pooled outputs of one batch (R: its rows with any
        filler rows), on the device; inputs numpy arrays or pinned tensors
        (moved without blocking). Reads no device value."""
        torch = require("torch", TORCH_HINT)

        def dev(x: Any) -> Any:
            x = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
            return self.queue.upload(x) if self.queue is not None else x.to(self.device)

        if self.kernel is not None:
            cu = dev(feed["cu_seqlens"])
            attend = packed_attention(self.kernel, cu, int(feed["max_seqlen"]), int(feed["min_seqlen"]),
                                      self.model.scale)
            h = self.model.packed(dev(feed["input_ids"]), dev(feed["position_ids"]), attend)
            return segment_pool(h, cu, self.config.pooling)
        if self.module is not None:
            return self.module(*(dev(feed[n]) for n in self.input_names))
        mask = dev(feed["attention_mask"])
        h = self.model(dev(feed["input_ids"]), mask, padded=bool(feed["padded"]))
        return pool_padded(h, mask, self.config.pooling)

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        torch = require("torch", TORCH_HINT)
        with torch.inference_mode():
            return self._pooled(feed).float().cpu().numpy()

    def _run_batches(self, batches: list[tuple[np.ndarray, Any]], out: np.ndarray,
                     tick: Callable[[], None]) -> None:
        for rows, feed in batches:  # filler rows of a bucket's static shape dropped
            out[rows] = self._forward(feed)[:len(rows)]
            tick()

    def run(self, prepared: PreparedTexts, *, show_progress: bool = False) -> Pending:
        """See :meth:`Encoder.run`; on CUDA every batch is queued on the
        device and the result copied to pinned host memory without a wait:
        ``.result()`` waits for it (the bar of ``show_progress`` counts
        batches queued)."""
        if self.queue is None or prepared.n == 0:
            return super().run(prepared, show_progress=show_progress)
        torch = require("torch", TORCH_HINT)
        with torch.inference_mode(), batch_progress(len(prepared.batches), show_progress) as tick:
            out = torch.empty((prepared.n, self.dim), dtype=torch.float32, device=self.device)
            for rows, feed in prepared.batches:
                pooled = self._pooled(feed)[:len(rows)]  # a host count: filler rows dropped without a wait
                out.index_copy_(0, self.queue.upload(feed["rows"]), pooled.float())
                tick()
            if self.config.normalize:  # as normalize_rows: rows of norm 0 stay 0
                norms = out.norm(dim=1, keepdim=True)
                out /= torch.where(norms > 0, norms, torch.ones_like(norms))
            return self.queue.download(out)


__all__ = ["TorchEncoder", "CudaQueue", "hf_model_class", "load_hf_model", "model_inputs", "pool_padded",
           "pooled_module"]
