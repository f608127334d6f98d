"""The ONNX Runtime side of the encoders: export (once, cached) of a pooled
Hugging Face encoder to ONNX, optional int8 quantisation, the execution
providers actually used (logged, never a silent fallback), and
:class:`OnnxEncoder`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rcn_fast._arrays import optional_available, require
from rcn_fast._cache_dirs import cache_dir as folder_of_cache
from rcn_fast._cache_dirs import trusted_cache
from rcn_fast._files import Folder, read_text
from rcn_fast.model_files import model_fingerprint
from rcn_fast.retrieval.encoders.base import (
    DTYPE_ALIASES, EXPORT_VERSION, ONNX_HINT, POOLINGS, TORCH_HINT, Encoder, EncoderConfig,
)
from rcn_fast.retrieval.encoders.batching import cpu_workers
from rcn_fast.retrieval.encoders.torch import load_hf_model, model_inputs, pooled_module

logger = logging.getLogger("rcn_fast.retrieval")


def default_cache_dir() -> Path:
    """``<rcn_fast cache>/onnx`` (see :func:`rcn_fast._cache_dirs.cache_root`)."""
    return folder_of_cache("onnx")


def installed_torch_version() -> str:
    """The installed torch's version without its local suffix (``2.13.0``),
    read from the package metadata: a cached export is found without
    importing torch.

    Raises
    ------
    ImportError
        torch is not installed (with the install hint).
    """
    from importlib import metadata

    try:
        return metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        raise ImportError(f"torch is needed for this feature: {TORCH_HINT}") from None


def corpus_backend(device: str | None, quantize: str | None = None, dtype: str | None = None) -> str:
    """The backend a corpus build uses when none is named.

    ``"onnx"`` when ``quantize`` is set (int8 runs on ONNX Runtime only);
    else ``"torch"`` for a half-precision ``dtype`` (ONNX runs float32);
    else ``"onnx"`` on the CPU where ONNX Runtime and the exporter's
    packages (onnx, onnxscript, torch) are installed, otherwise ``"torch"``
    (always on CUDA, where the torch backend runs bfloat16 and unpadded
    attention).
    """
    if quantize:
        return "onnx"
    if DTYPE_ALIASES.get(dtype, dtype) not in (None, "float32"):
        return "torch"
    if str(device or "cpu").split(":")[0] != "cpu":
        return "torch"
    return "onnx" if all(optional_available(m) for m in ("onnxruntime", "onnx", "onnxscript", "torch")) else "torch"


# ------------------------------------------------------------ export checksums
#: written into every export folder: size and sha256 of each file of the export
EXPORT_CHECKSUMS = "checksums.json"
_CHECKSUMS_FORMAT = "rcn_fast.onnx_export/1"
# folders whose files were hashed in this process, keyed by their files' (name, size, mtime)
_HASHED: set[tuple[str, tuple[tuple[str, int, int], ...]]] = set()


def _file_records(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Size and sha256 of each file, opened beneath the folder's descriptor (no link followed)."""
    from rcn_fast._hashing import sha256_fd

    out = {}
    with Folder(folder, what="cache_dir") as root:
        for n in sorted(names):
            fd = root.open_fd(n, links=False)
            try:
                out[n] = {"size": os.fstat(fd).st_size, "sha256": sha256_fd(fd)}
            finally:
                os.close(fd)
    return out


def write_export_checksums(folder: str | os.PathLike[str], names: list[str] | None = None) -> dict[str, Any]:
    """Record size and sha256 of the export's files in ``folder/checksums.json``.

    Parameters
    ----------
    folder : an export folder
    names : file names to add to the record (default: every file of the
        folder, the record replaced)

    Returns
    -------
    the record written
    """
    from rcn_fast.retrieval.store import write_json_atomic

    folder = Path(folder)
    files: dict[str, Any] = {}
    if names is None:
        with Folder(folder, what="cache_dir") as root:
            names = [n for n in root.listdir() if n != EXPORT_CHECKSUMS and not n.startswith(".")
                     and stat.S_ISREG(root.stat(n, links=False).st_mode)]
    else:
        files = dict(_read_checksums(folder).get("files", {}))
    files.update(_file_records(folder, names))
    rec = {"format": _CHECKSUMS_FORMAT, "files": files}
    write_json_atomic(folder / EXPORT_CHECKSUMS, rec)
    _HASHED.add(_signature(folder, files))
    return rec


def _read_checksums(folder: Path) -> dict[str, Any]:
    from rcn_fast._stamped_json import read_stamped_json

    return read_stamped_json(folder / EXPORT_CHECKSUMS, _CHECKSUMS_FORMAT, what="an rcn_fast ONNX export",
                             arg="cache_dir")


def _signature(folder: Path, files: dict[str, Any]) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    sig = []
    with Folder(folder, what="cache_dir") as root:
        for name in sorted(files):
            st = root.stat(name, links=False)
            sig.append((name, st.st_size, st.st_mtime_ns))
        return str(root.anchors[-1]), tuple(sig)


def export_problem(folder: str | os.PathLike[str], *, verify: bool = False) -> str | None:
    """What is wrong with an export folder, or None when it matches its
    ``checksums.json``.

    File sizes are always compared; sha256 when ``verify`` or the first
    time this process sees the folder with these file sizes and mtimes.

    Returns
    -------
    None, or a phrase naming the first damaged or missing file.
    """
    folder = Path(folder)
    try:
        rec = _read_checksums(folder)
    except FileNotFoundError:
        return f"it has no {EXPORT_CHECKSUMS} (exported by an older rcn_fast, so it cannot be checked)"
    except ValueError as exc:
        return str(exc)
    files = rec.get("files")
    if not isinstance(files, dict) or "model.onnx" not in files:
        return f"its {EXPORT_CHECKSUMS} does not list model.onnx"
    for name, want in sorted(files.items()):
        if not isinstance(want, dict) or Path(name).name != name or name.startswith("."):
            return f"its {EXPORT_CHECKSUMS} has a bad entry {name!r}"
    with Folder(folder, what="cache_dir") as root:  # each file beneath the folder's descriptor, no link followed
        fds: dict[str, int] = {}
        try:
            for name, want in sorted(files.items()):
                try:
                    fds[name] = root.open_fd(name, links=False)
                except OSError:  # missing, a link or not a regular file
                    return f"{name} is missing"
                size = os.fstat(fds[name]).st_size
                if size != want.get("size"):
                    return f"{name} is {size} bytes, {want.get('size')} were exported (truncated or overwritten)"
            sig = (str(root.anchors[-1]), tuple((n, os.fstat(fds[n]).st_size, os.fstat(fds[n]).st_mtime_ns)
                                                for n in sorted(files)))
            if verify or sig not in _HASHED:
                from rcn_fast._hashing import sha256_fd

                for name, want in sorted(files.items()):
                    if sha256_fd(fds[name]) != want.get("sha256"):
                        return f"{name} does not match its sha256 (damaged on disk)"
                _HASHED.add(sig)
        finally:
            for fd in fds.values():
                os.close(fd)
    return None


def verify_export(folder: str | os.PathLike[str]) -> None:
    """Check every file of an export folder against its sha256.

    Raises
    ------
    ValueError
        A file is missing, of another size or content; the message names
        the folder to delete.
    """
    problem = export_problem(folder, verify=True)
    if problem is not None:
        raise ValueError(_damaged_message(Path(folder), problem))


def _damaged_message(folder: Path, problem: str) -> str:
    return (f"cache_dir: the ONNX export in {folder} is damaged: {problem}; delete the folder {folder} and rerun "
            "(the model is exported again)")


def _reusable(target: Path, *, owned: bool, verify: bool) -> bool:
    """Whether ``target`` holds an intact export. A damaged one is removed
    (``owned``: rcn_fast's cache, so it is exported again) or refused with
    the folder to delete."""
    if not target.exists():
        return False
    problem = export_problem(target, verify=verify)
    if problem is None:
        return True
    if not owned:
        raise ValueError(_damaged_message(target, problem))
    logger.warning("the ONNX export in %s is damaged (%s); exporting it again", target, problem)
    aside = target.with_name(f".{target.name}.damaged.{os.getpid()}")
    try:
        os.replace(target, aside)
    except FileNotFoundError:  # another process removed it first
        return False
    except OSError as exc:
        raise ValueError(_damaged_message(target, f"{problem}; it could not be moved aside: {exc}")) from None
    shutil.rmtree(aside, ignore_errors=True)
    return False


def export_onnx(model_dir: str | os.PathLike[str], *, pooling: str = "mean",
                cache_dir: str | os.PathLike[str] | None = None, quantize: str | None = None,
                verify: bool = False) -> Path:
    """Export (once) the pooled encoder to ONNX and return the ``.onnx`` path.

    The graph takes int64 ``input_ids``, ``attention_mask`` (and
    ``token_type_ids`` when the model has them) of shape [batch, seq] (both
    axes dynamic) and returns ``embeddings`` float32 [batch, d] (pooled, not
    normalised). Exports are cached under a key made of the model
    fingerprint, pooling, torch version and export version; the first call
    exports (tens of seconds on CPU for a base-size model, logged), later
    calls reuse the file without importing torch or the exporter.
    ``quantize="int8"`` adds a dynamically quantised
    copy (per-channel int8 MatMul weights) next to it; its embeddings keep a
    per-row cosine >= 0.98 to the fp32 ones (the tolerance the tests hold
    it to).

    Every export folder records the size and sha256 of its files
    (``checksums.json``, written with the export). A cached export is
    checked before use: sizes always, sha256 the first time a process uses
    the folder (or every time with ``verify=True``). A damaged export in a
    cache folder is exported again (logged); one inside the model folder
    (``cache_dir="model"``) is refused with a ValueError naming the folder
    to delete. A cache folder another user owns or could write is not used
    (one warning, :func:`rcn_fast._cache_dirs.trusted_cache`): the model is
    exported afresh into a private temporary folder for this process.
    """
    model_dir = Path(model_dir)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling: expected one of {list(POOLINGS)}, got {pooling!r}")
    fp = model_fingerprint(model_dir)
    key_src = json.dumps({"fp": fp, "pooling": pooling, "torch": installed_torch_version(),
                          "export": EXPORT_VERSION}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    if cache_dir is None:
        root = default_cache_dir()
    elif str(cache_dir) == "model":
        root = model_dir / "onnx"
    else:
        root = Path(cache_dir)
    target = root / f"{model_dir.name}-{pooling}-{key}"
    if str(cache_dir) != "model" and not trusted_cache(target, None if cache_dir is None else root,
                                                        what="ONNX export cache"):
        # another user could have written it: export afresh into a private folder, for this process
        root = Path(tempfile.mkdtemp(prefix="rcn_fast-onnx-"))
        atexit.register(shutil.rmtree, root, True)
        target = root / target.name
    onnx_path = target / "model.onnx"
    if not _reusable(target, owned=str(cache_dir) != "model", verify=verify):
        torch = require("torch", TORCH_HINT)  # the exporter's packages: only to export
        require("onnx", ONNX_HINT)
        require("onnxscript", ONNX_HINT)
        root.mkdir(parents=True, exist_ok=True)
        logger.warning("exporting %s to ONNX (one time; cached at %s) ...", model_dir, target)
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            model = load_hf_model(model_dir)
            names = model_inputs(model)
            module = pooled_module(model, pooling, names)
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
            files = write_export_checksums(tmp)["files"]
            try:
                os.replace(tmp, target)
                _HASHED.add(_signature(target, files))  # just hashed: the first use need not rehash
            except OSError:  # another process finished first
                if not _reusable(target, owned=False, verify=True):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logger.warning("ONNX export done in %.1f s", time.perf_counter() - t0)
    if quantize is None:
        return onnx_path
    if quantize != "int8":
        raise ValueError(f"quantize: expected None or 'int8', got {quantize!r}")
    q_path = target / "model.int8.onnx"
    if not q_path.is_file() or q_path.name not in _read_checksums(target).get("files", {}):
        qmod = require("onnxruntime.quantization", ONNX_HINT)
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
        write_export_checksums(target, [q_path.name])
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

    The export is checked against its recorded checksums before the session
    opens (see :func:`export_onnx`; ``verify_export=True`` rehashes every
    file).
    """

    backend = "onnx"

    @classmethod
    def open(cls, config: EncoderConfig, *, verify_export: bool = False) -> "OnnxEncoder":
        """See :meth:`Encoder.open`; ``verify_export``: rehash the export."""
        return cls(config, verify_export=verify_export)

    def __init__(self, config: EncoderConfig, *, verify_export: bool = False) -> None:
        super().__init__(config)
        config = self.config  # with the folder's settings filled in
        ort = require("onnxruntime", ONNX_HINT)
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
                                     quantize=config.quantize, verify=verify_export)
        meta = json.loads(read_text(self.onnx_path.parent, "export.json", what="cache_dir", limit=1 << 20))
        self.input_names = tuple(meta["inputs"])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        #: batches run at once: on the CPU provider without intra_op_threads, one single-threaded
        #: session call per core (data-parallel batches, no per-operator barrier between cores)
        self.workers = cpu_workers() if wanted == "CPUExecutionProvider" and not config.intra_op_threads else 1
        if config.intra_op_threads or self.workers > 1:
            so.intra_op_num_threads = config.intra_op_threads or 1
        self._pool: ThreadPoolExecutor | None = None
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

    def _run_batches(self, batches: list[tuple[np.ndarray, Any]], out: np.ndarray,
                     tick: Callable[[], None]) -> None:
        """Up to :attr:`workers` batches at once (``session.run`` releases
        the GIL and is thread-safe); each batch's rows are written by the
        thread that ran it, so the order of completion does not matter;
        ``tick()`` in this thread as each batch, in order, is done."""
        if self.workers <= 1 or len(batches) <= 1:
            return super()._run_batches(batches, out, tick)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="rcn_fast-onnx")

        def one(batch: tuple[np.ndarray, Any]) -> None:
            out[batch[0]] = self._forward(batch[1])

        futures = [self._pool.submit(one, b) for b in batches]
        try:
            for f in futures:
                f.result()  # re-raises a worker's error
                tick()
        except BaseException:
            for f in futures:
                f.cancel()
            raise

__all__ = ["OnnxEncoder", "corpus_backend", "installed_torch_version", "export_onnx", "node_assignment", "report_providers", "default_cache_dir",
           "export_problem", "verify_export", "write_export_checksums", "EXPORT_CHECKSUMS"]
