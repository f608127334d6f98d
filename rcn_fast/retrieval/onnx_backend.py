"""The ONNX Runtime side of the encoders: export (once, cached) of a pooled
Hugging Face encoder to ONNX, optional int8 quantisation, the execution
providers actually used (logged, never a silent fallback), and
:class:`OnnxEncoder`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rcn_fast._arrays import require
from rcn_fast.model_files import model_fingerprint
from rcn_fast.retrieval.encoder import (
    _EXPORT_VERSION, _ONNX_HINT, _POOLINGS, _TORCH_HINT, Encoder, EncoderConfig, _load_hf_model, _model_inputs,
    _pooled_module,
)

logger = logging.getLogger("rcn_fast.retrieval")


def default_cache_dir() -> Path:
    """``<rcn_fast cache>/onnx`` (see :func:`rcn_fast._cache_dirs.cache_root`)."""
    from rcn_fast._cache_dirs import cache_root

    return cache_root() / "onnx"


def export_onnx(model_dir: str | os.PathLike[str], *, pooling: str = "mean",
                cache_dir: str | os.PathLike[str] | None = None, quantize: str | None = None) -> Path:
    """Export (once) the pooled encoder to ONNX and return the ``.onnx`` path.

    The graph takes int64 ``input_ids``, ``attention_mask`` (and
    ``token_type_ids`` when the model has them) of shape [batch, seq] (both
    axes dynamic) and returns ``embeddings`` float32 [batch, d] (pooled, not
    normalised). Exports are cached under a key made of the model
    fingerprint, pooling, torch version and export version; the first call
    exports (tens of seconds on CPU for a base-size model, logged), later
    calls reuse the file. ``quantize="int8"`` adds a dynamically quantised
    copy (per-channel int8 MatMul weights) next to it; its embeddings keep a
    per-row cosine >= 0.98 to the fp32 ones (the tolerance the tests hold
    it to).
    """
    torch = require("torch", _TORCH_HINT)
    require("onnx", _ONNX_HINT)
    require("onnxscript", _ONNX_HINT)
    model_dir = Path(model_dir)
    if pooling not in _POOLINGS:
        raise ValueError(f"pooling: expected one of {list(_POOLINGS)}, got {pooling!r}")
    fp = model_fingerprint(model_dir)
    key_src = json.dumps({"fp": fp, "pooling": pooling, "torch": torch.__version__.split("+")[0],
                          "export": _EXPORT_VERSION}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    if cache_dir is None:
        root = default_cache_dir()
    elif str(cache_dir) == "model":
        root = model_dir / "onnx"
    else:
        root = Path(cache_dir)
    target = root / f"{model_dir.name}-{pooling}-{key}"
    onnx_path = target / "model.onnx"
    if not onnx_path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        logger.warning("exporting %s to ONNX (one time; cached at %s) ...", model_dir, target)
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            model = _load_hf_model(model_dir)
            names = _model_inputs(model)
            module = _pooled_module(model, pooling, names)
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(3, min(int(model.config.vocab_size), 1000), (2, 8), generator=gen)
            mask = torch.ones(2, 8, dtype=torch.long)
            mask[1, 5:] = 0
            parts = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
            example = tuple(parts[n] for n in names)
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            dyn = tuple({0: batch, 1: seq} for _ in names)
            import warnings

            noisy = [logging.getLogger(n) for n in ("onnx_ir", "onnxscript", "torch.onnx", "torch.export")]
            levels = [lg.level for lg in noisy]
            for lg in noisy:
                lg.setLevel(logging.WARNING)
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.onnx.export(module, example, str(tmp / "model.onnx"), input_names=list(names),
                                  output_names=["embeddings"], dynamo=True, dynamic_shapes=dyn,
                                  verbose=False)
            for lg, lv in zip(noisy, levels):
                lg.setLevel(lv)
            (tmp / "export.json").write_text(json.dumps(
                {"model_dir": str(model_dir), "key": json.loads(key_src), "inputs": list(names),
                 "output": "embeddings", "pooling": pooling}, indent=2) + "\n")
            try:
                os.replace(tmp, target)
            except OSError:  # another process finished first
                if not onnx_path.is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logger.warning("ONNX export done in %.1f s", time.perf_counter() - t0)
    if quantize is None:
        return onnx_path
    if quantize != "int8":
        raise ValueError(f"quantize: expected None or 'int8', got {quantize!r}")
    q_path = target / "model.int8.onnx"
    if not q_path.is_file():
        qmod = require("onnxruntime.quantization", _ONNX_HINT)
        tmp_q = target / f".model.int8.{os.getpid()}.onnx"
        logger.warning("quantising %s to int8 (one time) ...", onnx_path)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger().disabled, prev = True, logging.getLogger().disabled
            try:
                qmod.quantize_dynamic(str(onnx_path), str(tmp_q), weight_type=qmod.QuantType.QInt8,
                                      per_channel=True, op_types_to_quantize=["MatMul"])
            finally:
                logging.getLogger().disabled = prev
        os.replace(tmp_q, q_path)
    return q_path


# ops that carry the encoder's FLOPs: one of these on another provider
# than the requested one means that part runs at that provider's speed
_COMPUTE_OPS = frozenset({
    "MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
    "Attention", "MultiHeadAttention", "QAttention", "Softmax", "LayerNormalization", "SkipLayerNormalization",
    "EmbedLayerNormalization", "Gelu", "FastGelu", "BiasGelu", "Conv",
})


def node_assignment(session: Any) -> dict[str, dict[str, int]] | None:
    """Which execution provider each node of a session runs on.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        Created with the session config entry
        ``session.record_ep_graph_assignment_info = 1``.

    Returns
    -------
    dict or None
        ``{provider: {op_type: node count}}``; None when this onnxruntime
        cannot report assignments (``get_provider_graph_assignment_info``
        is missing or returned nothing).
    """
    get = getattr(session, "get_provider_graph_assignment_info", None)
    if get is None:
        return None
    try:
        subgraphs = get()
    except Exception:  # recording not enabled / unsupported build
        return None
    out: dict[str, dict[str, int]] = {}
    for sg in subgraphs:
        ops = out.setdefault(str(sg.ep_name), {})
        for node in sg.get_nodes():
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return out or None


def report_providers(assignment: dict[str, dict[str, int]] | None, wanted: str, what: str) -> str:
    """Log where the nodes of ``what`` run; return the INFO line.

    All nodes on ``wanted``: one INFO line. Some nodes elsewhere (a partial
    fallback, e.g. shape ops that onnxruntime keeps on the CPU, or kernels
    the provider lacks): a WARNING naming the providers and op types, and
    saying when compute ops are among them.
    """
    if assignment is None:
        line = (f"{what} runs on {wanted} (this onnxruntime does not report per-node assignment; its own "
                "warnings about nodes placed on other providers are shown)")
        logger.info(line)
        return line
    total = sum(sum(ops.values()) for ops in assignment.values())
    on_wanted = sum(assignment.get(wanted, {}).values())
    line = f"{what} runs on {wanted} ({on_wanted} of {total} nodes)"
    logger.info(line)
    others = {ep: ops for ep, ops in assignment.items() if ep != wanted and ops}
    if others:
        parts = []
        heavy: list[str] = []
        for ep, ops in sorted(others.items()):
            listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
            parts.append(f"{sum(ops.values())} on {ep} ({listed})")
            heavy += [op for op in ops if op in _COMPUTE_OPS]
        msg = f"{what}: partial fallback: {total - on_wanted} of {total} nodes do not run on {wanted}: " + \
              "; ".join(parts)
        if heavy:
            msg += (f"; these include compute ops ({', '.join(sorted(set(heavy)))}), so part of the encoder "
                    f"runs at the other provider's speed")
        logger.warning(msg)
    return line


class OnnxEncoder(Encoder):
    """The encoder run by ONNX Runtime on a graph rcn_fast exported.

    The execution provider that actually runs is logged at INFO and kept in
    :attr:`provider`; when the requested provider is not the one running,
    construction fails (no silent fallback to CPU). Nodes placed on another
    provider than the requested one (a partial fallback) are logged at
    WARNING with their op types (:attr:`node_providers` holds the counts);
    onnxruntime's own warnings stay visible, and its run-time fallback (a
    failed CUDA run retried on the CPU) is switched off, so such a failure
    raises.
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        config = self.config  # with the folder's settings filled in
        ort = require("onnxruntime", _ONNX_HINT)
        dev = (config.device or "cpu").split(":")[0]
        if dev not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]' for the onnx backend, got {config.device!r}")
        available = ort.get_available_providers()
        if config.providers:
            providers: list[Any] = list(config.providers)
        elif dev == "cuda":
            dev_id = int(config.device.split(":")[1]) if ":" in config.device else 0
            providers = [("CUDAExecutionProvider", {"device_id": dev_id}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        wanted = providers[0][0] if isinstance(providers[0], tuple) else providers[0]
        if wanted not in available:
            raise RuntimeError(
                f"providers: {wanted} was requested but this onnxruntime offers only {available}"
                + (" (install onnxruntime-gpu for CUDA)" if wanted == "CUDAExecutionProvider" else ""))
        if config.quantize and wanted != "CPUExecutionProvider":
            raise ValueError("quantize: int8 dynamic quantisation runs on the CPU provider only; use device='cpu'")
        self.onnx_path = export_onnx(self.model_dir, pooling=config.pooling, cache_dir=config.cache_dir,
                                     quantize=config.quantize)
        meta = json.loads((self.onnx_path.parent / "export.json").read_text())
        self.input_names = tuple(meta["inputs"])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if config.intra_op_threads:
            so.intra_op_num_threads = config.intra_op_threads
        # 2 = warnings: onnxruntime's own notice that nodes went to another
        # provider than the preferred one is printed, not hidden
        so.log_severity_level = 2
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        self.session = ort.InferenceSession(str(self.onnx_path), sess_options=so, providers=providers)
        if hasattr(self.session, "disable_fallback"):
            self.session.disable_fallback()  # a failed CUDA run raises instead of silently rerunning on CPU
        running = self.session.get_providers()
        self.provider = running[0]
        if self.provider != wanted:
            raise RuntimeError(f"providers: asked onnxruntime for {wanted} but the session runs on {running}; "
                               "refusing to fall back silently")
        self.node_providers = node_assignment(self.session)
        report_providers(self.node_providers, self.provider, f"onnx encoder {config.model} ({self.onnx_path.name})")

    def _forward(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(["embeddings"], {n: feed[n] for n in self.input_names})[0].astype(np.float32, copy=False)


__all__ = ["OnnxEncoder", "export_onnx", "node_assignment", "report_providers", "default_cache_dir"]
