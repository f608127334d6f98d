"""llama.cpp's C API as rcn_fast uses it (through llama-cpp-python's ctypes
bindings, imported when first needed): a model, a context whose key/value
memory is shared by many sequences, and batches of tokens that each name
their sequence (``llama_batch`` / ``llama_decode``, as llama.cpp's
``examples/batched`` drives them).

Nothing of llama-cpp-python's high-level ``Llama`` class is used: no chat
formats (its Jinja), no sampler, no cache of its own. llama.cpp's log lines
go to the ``rcn_fast.llm.llamacpp`` logger (debug level); the ones of a
failed load are kept and named in its error.

``OMP_WAIT_POLICY`` is set to ``PASSIVE`` before llama.cpp is first
imported, unless the environment sets it: llama.cpp's OpenMP threads
otherwise spin at every barrier, which on a machine with more runnable
threads than cores stalls each op behind descheduled spinners (measured on
a loaded 2-core machine: SmolLM2-135M at 2 threads, 1.6 tok/s spinning,
12-14 tok/s passive). ``OMP_WAIT_POLICY=ACTIVE`` restores llama.cpp's
own behaviour (for a dedicated machine).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rcn_fast import _arrays as A

HINT = ("pip install 'rcn_fast[llamacpp]' (llama-cpp-python>=0.3.36,<0.4; it compiles llama.cpp on install: "
        "CMAKE_ARGS='-DGGML_NATIVE=OFF' builds a portable library)")
#: the llama-cpp-python versions this module is written against (its C API changes between releases)
SUPPORTED = ((0, 3, 36), (0, 4, 0))
#: the C functions used (the check that an installed version has them)
_NEEDED = ("llama_model_load_from_file", "llama_init_from_model", "llama_get_memory", "llama_memory_seq_cp",
           "llama_memory_seq_rm", "llama_batch_init", "llama_decode", "llama_get_logits_ith", "llama_tokenize",
           "llama_detokenize", "llama_vocab_get_text", "llama_vocab_get_attr", "llama_model_get_vocab")
#: key/value cache element types by name (GGML type ids)
KV_TYPES = {"f32": 0, "f16": 1}
logger = logging.getLogger("rcn_fast.llm.llamacpp")

_lib: Any = None
_lock = threading.Lock()
_log_lines: dict[int, list[str]] = {}  # thread id -> the log lines of a load in progress on it


def installed() -> bool:
    """Whether llama-cpp-python is importable (without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def require() -> Any:
    """The ``llama_cpp`` module, checked and initialised once.

    Raises
    ------
    ImportError
        llama-cpp-python is missing, outside :data:`SUPPORTED` or lacks a C
        function used here (the message says what to install).
    """
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            # llama.cpp's OpenMP threads spin at every barrier by default: on a machine with more runnable
            # threads than cores each op then waits for descheduled spinners (SmolLM2, 2 threads on a loaded
            # 2-core machine: 1.6 -> 12-14 tok/s passive). Read once, when llama.cpp's libgomp loads; a
            # setting of the caller's own wins.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            mod = A.require("llama_cpp", HINT)
            have = _version(getattr(mod, "__version__", "0"))
            if not SUPPORTED[0] <= have < SUPPORTED[1]:
                raise ImportError(f"llama-cpp-python {mod.__version__} is installed; rcn_fast's llamacpp backend is "
                                  f"written against >=0.3.36,<0.4: {HINT}")
            missing = [f for f in _NEEDED if not hasattr(mod, f)]
            if missing:
                raise ImportError(f"llama-cpp-python {mod.__version__} lacks {missing}: {HINT}")
            mod.llama_backend_init()
            mod.llama_log_set(_LOG_CALLBACK_HOLDER.make(mod), ctypes.c_void_p())
            _lib = mod
    return _lib


class _LogCallback:
    """llama.cpp's log lines to the Python logger (the callback object is
    kept alive here: llama.cpp holds only its address)."""

    def __init__(self) -> None:
        self.fn: Any = None

    def make(self, mod: Any) -> Any:
        def log(level: int, text: bytes, user: Any) -> None:
            line = text.decode("utf-8", "replace").rstrip("\n") if text else ""
            if not line:
                return
            lines = _log_lines.get(threading.get_ident())
            if lines is not None and len(lines) < 200:
                lines.append(line)
            logger.debug("%s", line)

        self.fn = mod.llama_log_callback(log)
        return self.fn


_LOG_CALLBACK_HOLDER = _LogCallback()


def version() -> str:
    """llama-cpp-python's version (the one loaded)."""
    return str(require().__version__)


def system_info() -> str:
    """llama.cpp's own account of the CPU features its build uses."""
    raw = require().llama_print_system_info()
    return raw.decode("utf-8", "replace") if raw else ""


def threads(n: int) -> int:
    """``n`` threads, or (0) those of ``RCN_FAST_NUM_THREADS``, else the CPUs this process may run on."""
    if n > 0:
        return n
    env = os.environ.get("RCN_FAST_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"RCN_FAST_NUM_THREADS: expected a positive int, got {env!r}") from None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _set(struct: Any, **fields: Any) -> None:
    """Set fields of a ctypes structure, refusing a name it lacks (ctypes
    would keep it as a plain attribute, silently)."""
    names = {f[0] for f in type(struct)._fields_}
    for k, v in fields.items():
        if k not in names:
            raise ImportError(f"llama-cpp-python's {type(struct).__name__} has no field {k!r}: {HINT}")
        setattr(struct, k, v)


class LoadError(RuntimeError):
    """llama.cpp did not load a file (its log lines say why)."""


class _Owned:
    """A llama.cpp object freed by :meth:`close`, at the latest when collected."""

    ptr: Any = None

    def live(self) -> Any:
        """The pointer; a RuntimeError once closed (never a call on freed memory)."""
        if not self.ptr:
            raise RuntimeError(f"this llama.cpp {type(self).__name__.lower()} was closed")
        return self.ptr

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


class Model(_Owned):
    """A model loaded by llama.cpp from a ``.gguf`` file (CPU only, the
    weights memory-mapped as llama.cpp maps them).

    Parameters
    ----------
    path : Path
    vocab_only : bool
        Load the vocabulary and the sizes only (a probe: no weights read).
    """

    def __init__(self, path: Path, *, vocab_only: bool = False) -> None:
        lib = self.lib = require()
        params = lib.llama_model_default_params()
        _set(params, n_gpu_layers=0, vocab_only=bool(vocab_only))
        me = threading.get_ident()
        _log_lines[me] = []
        try:
            ptr = lib.llama_model_load_from_file(os.fsencode(str(path)), params)
            lines = _log_lines[me]
        finally:
            _log_lines.pop(me, None)
        if not ptr:
            errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()] or lines[-3:]
            raise LoadError("; ".join(e.strip() for e in errors[-4:]) or "llama.cpp gave no reason")
        self.ptr = ptr
        self.vocab = lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(lib.llama_model_n_embd(ptr))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(ptr))

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_model_free(self.ptr)
            self.ptr = None


class Context(_Owned):
    """A llama.cpp context over a :class:`Model`: ``n_ctx`` key/value cells
    shared by up to ``n_seq`` sequences (llama.cpp's unified memory, where
    copying a sequence's prefix to another tags the same cells, no data is
    copied), ``n_batch`` tokens per decode.

    Parameters
    ----------
    model : Model
    n_ctx, n_batch, n_seq, n_threads : int
    kv_type : str
        ``"f32"`` or ``"f16"`` (:data:`KV_TYPES`).
    flash_attn : bool
    """

    def __init__(self, model: Model, *, n_ctx: int, n_batch: int, n_seq: int, n_threads: int, kv_type: str,
                 flash_attn: bool) -> None:
        lib = self.lib = model.lib
        self.model = model
        cp = lib.llama_context_default_params()
        _set(cp, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512), n_seq_max=n_seq, n_threads=n_threads,
             n_threads_batch=n_threads, type_k=KV_TYPES[kv_type], type_v=KV_TYPES[kv_type],
             flash_attn_type=lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED,
             kv_unified=True, no_perf=True, embeddings=False, offload_kqv=False, op_offload=False)
        ptr = lib.llama_init_from_model(model.ptr, cp)
        if not ptr:
            raise LoadError(f"llama.cpp could not make a context of {n_ctx} cells for {n_seq} sequences")
        self.ptr = ptr
        self.mem = lib.llama_get_memory(ptr)
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        self.n_batch = n_batch
        self.n_seq = n_seq
        self.n_vocab = model.n_vocab
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        self._logits = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._seq_ptrs = [self._batch.seq_id[i] for i in range(n_batch)]

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int],
               outputs: Sequence[int]) -> int:
        """One ``llama_decode`` of ``len(tokens)`` (<= ``n_batch``) tokens, each
        in its sequence at its position, with logits kept at the indices
        ``outputs``; returns llama.cpp's status (0: done; 1: no room in the
        key/value memory, which is left as it was)."""
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"tokens: expected 1..{self.n_batch} tokens per decode, got {n}")
        self._tok[:n] = tokens
        self._pos[:n] = positions
        self._nseq[:n] = 1
        self._logits[:n] = 0
        self._logits[np.asarray(outputs, dtype=np.int64)] = 1
        ptrs = self._seq_ptrs
        for i, s in enumerate(seqs):
            ptrs[i][0] = s
        self._batch.n_tokens = n
        return int(self.lib.llama_decode(self.live(), self._batch))

    def logits(self, indices: Sequence[int]) -> np.ndarray:
        """float32 [len(indices), n_vocab]: the logits at those batch indices of the last decode."""
        out = np.empty((len(indices), self.n_vocab), dtype=np.float32)
        for j, i in enumerate(indices):
            ptr = self.lib.llama_get_logits_ith(self.live(), int(i))
            if not ptr:
                raise RuntimeError(f"llama.cpp kept no logits at batch index {i}")
            out[j] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return out

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        """Drop sequence ``seq``'s cells at positions [p0, p1) (-1: open)."""
        self.live()
        if not self.lib.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise RuntimeError(f"llama.cpp could not drop positions [{p0}, {p1}) of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Give sequence ``dst`` the cells of ``src`` at positions [p0, p1)."""
        self.live()
        self.lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def clear(self) -> None:
        self.live()
        self.lib.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self.ptr)
            self.ptr = None


def quantize(src: Path, dst: Path, ftype: str, *, threads_: int = 0) -> None:
    """Quantize ``src`` to ``dst`` with llama.cpp's own quantizer
    (``llama_model_quantize``), e.g. ``ftype="Q4_K_M"``: what
    ``llama-quantize`` writes (its mixes of types per tensor included).

    Raises
    ------
    ValueError
        ``ftype`` is not a llama.cpp file type.
    RuntimeError
        llama.cpp failed (its log says why).
    """
    lib = require()
    code = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{ftype}", None) if ftype != "F32" else lib.LLAMA_FTYPE_ALL_F32
    if code is None:
        kinds = sorted(k[len("LLAMA_FTYPE_MOSTLY_"):] for k in dir(lib) if k.startswith("LLAMA_FTYPE_MOSTLY_"))
        raise ValueError(f"ftype: expected one of llama.cpp's file types {kinds}, got {ftype!r}")
    params = lib.llama_model_quantize_default_params()
    _set(params, ftype=code, nthread=threads(threads_))
    rc = lib.llama_model_quantize(os.fsencode(str(src)), os.fsencode(str(dst)), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama.cpp's quantizer failed ({rc}) on {src} -> {ftype}")


__all__ = ["HINT", "SUPPORTED", "KV_TYPES", "installed", "require", "version", "system_info", "threads", "Model",
           "Context", "LoadError", "quantize"]
