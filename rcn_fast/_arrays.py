"""Array plumbing shared by the ops: which library an input comes from, its
device and dtype, argument checks with messages that name the argument, and
output allocation in the caller's library and device.

numpy arrays and torch tensors are accepted everywhere; bfloat16 numpy
arrays come from ``ml_dtypes``. torch is imported lazily, only when the
caller already passed a tensor.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def library(x: Any) -> str:
    return "torch" if is_torch(x) else "numpy"


def device_of(x: Any) -> str:
    """"cpu" or "cuda" (torch CUDA tensors); numpy arrays are "cpu"."""
    if is_torch(x):
        return x.device.type
    return "cpu"


def is_cuda(x: Any) -> bool:
    """Whether ``x`` is a torch tensor on a CUDA device (the CUDA code paths
    ask this; tests/cuda_standin.py answers yes for its stand-in tensors)."""
    return is_torch(x) and x.device.type == "cuda"


def on_device(x: Any) -> Any:
    """The context every launch of rcn_fast's CUDA code runs in:
    ``torch.cuda.device(x.device)`` for a CUDA tensor ``x`` (the launchers
    use the current device: its streams, scratch memory and properties), a
    no-op context for anything else. tests/test_cuda_devices.py checks that
    every launch site sits inside one."""
    if not is_cuda(x):
        from contextlib import nullcontext

        return nullcontext()
    return sys.modules["torch"].cuda.device(x.device)


def dtype_name(x: Any) -> str:
    if is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    return np.dtype(x.dtype).name


def as_array(x: Any, name: str) -> Any:
    """numpy arrays and torch tensors pass through; lists and other array-likes
    become numpy arrays; anything else is a TypeError naming ``name``."""
    if is_torch(x) or isinstance(x, np.ndarray):
        return x
    try:
        arr = np.asarray(x)
    except Exception as exc:
        raise TypeError(f"{name}: expected an array (numpy or torch), got {type(x).__name__}") from exc
    if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
        raise TypeError(
            f"{name}: expected an array of float32, float16 or bfloat16 values, "
            f"got {type(x).__name__} with dtype {arr.dtype}"
        )
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    return arr


def check_rank(x: Any, ndim: int, name: str, shape: str) -> None:
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array of shape {shape}, got shape {tuple(x.shape)}")


def check_same_place(x: Any, ref: Any, name: str, ref_name: str) -> None:
    """``x`` comes from the array library of ``ref`` (TypeError) and lives on
    its device (ValueError)."""
    if library(ref) != library(x):
        raise TypeError(f"{name}: expected the same array library as {ref_name} ({library(ref)}), got {library(x)}")
    if device_of(ref) != device_of(x):
        raise ValueError(f"{name}: expected the device of {ref_name} ({device_of(ref)}), got {device_of(x)}")


def check_float_dtype(x: Any, name: str, allowed: tuple[str, ...] = FLOAT_DTYPES) -> str:
    dt = dtype_name(x)
    if dt not in allowed:
        raise TypeError(f"{name}: expected dtype in {list(allowed)}, got {dt}")
    return dt


def inner_contiguous(x: Any) -> Any:
    """``x`` itself when its last axis has unit stride (and no stride is
    negative), else a contiguous copy."""
    if is_torch(x):
        if x.ndim and x.shape[-1] > 1 and x.stride(-1) != 1:
            return x.contiguous()
        if any(s < 0 for s in x.stride()):
            return x.contiguous()
        return x
    if x.ndim and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        return np.ascontiguousarray(x)
    if any(s < 0 for s in x.strides):
        return np.ascontiguousarray(x)
    return x


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view (or copy from the GPU); bfloat16 via ml_dtypes."""
    if not is_torch(x):
        return np.asarray(x)
    t = x.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype.__str__() == "torch.bfloat16":
        ml_dtypes = require("ml_dtypes", "pip install ml_dtypes")
        return t.view(dtype=_torch().int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def to_float32_numpy(x: Any) -> np.ndarray:
    return np.asarray(to_numpy(x), dtype=np.float32)


def query_matrix(q: Any, dim: int, name: str = "q") -> np.ndarray:
    """``q`` ([Q, dim] or one [dim] query) as a float32 numpy [Q, dim];
    a ValueError naming ``name`` for another rank or width."""
    arr = to_float32_numpy(as_array(q, name))
    if arr.ndim == 1:
        arr = arr[None, :]
    check_rank(arr, 2, name, f"[Q, {dim}]")
    if arr.shape[1] != dim:
        raise ValueError(f"{name}: expected {dim} columns, got shape {arr.shape}")
    return arr


def empty_like_lib(ref: Any, shape: tuple[int, ...], dtype: str) -> Any:
    """An uninitialised array in ``ref``'s library and on its device."""
    if is_torch(ref):
        torch = _torch()
        return torch.empty(shape, dtype=getattr(torch, dtype), device=ref.device)
    return np.empty(shape, dtype=dtype)


def from_numpy_like(ref: Any, arr: np.ndarray) -> Any:
    """``arr`` moved into ``ref``'s library and device."""
    if is_torch(ref):
        return _torch().from_numpy(np.ascontiguousarray(arr)).to(ref.device)
    return arr


#: How to install torch: any release the extras admit; on a machine without a GPU, the CPU build
#: (PyPI's Linux wheel is the CUDA one), as docs/gpu.md says.
TORCH_INSTALL = ("pip install 'torch>=2.11' (on a CPU-only machine the CPU build: "
                 "pip install torch --index-url https://download.pytorch.org/whl/cpu)")


def _torch() -> Any:
    return require("torch", TORCH_INSTALL)


def require(module: str, hint: str) -> Any:
    """Import an optional dependency or raise ImportError with the install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is needed for this feature: {hint}") from exc


def optional_available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def row_list(bad: np.ndarray, limit: int = 10) -> str:
    """The rows where bool ``bad`` [n] is True, for a message:
    ``"[3, 17, ...] (12 of 5000)"``."""
    rows = np.flatnonzero(bad)
    shown = ", ".join(str(int(r)) for r in rows[:limit])
    return f"[{shown}{', ...' if rows.size > limit else ''}] ({rows.size} of {bad.size})"


#: IEEE exponent bits of the float dtypes: all set means NaN or an infinity.
_EXPONENT = {"float16": (np.uint16, 0x7C00), "float32": (np.uint32, 0x7F800000),
             "float64": (np.uint64, 0x7FF0000000000000), "bfloat16": (np.uint16, 0x7F80)}


def nonfinite_rows(x: np.ndarray, block_bytes: int = 1 << 20) -> np.ndarray:
    """bool [n]: the rows of ``x`` [n, d] holding a NaN or an infinity,
    read about ``block_bytes`` at a time (a memory map is never loaded
    whole). Float dtypes are tested on their bits (exponent all ones),
    several times faster than ``np.isfinite`` on float16."""
    n = x.shape[0]
    bad = np.zeros(n, dtype=bool)
    block = max(1, block_bytes // max(1, x.itemsize * int(np.prod(x.shape[1:], dtype=np.int64))))
    spec = _EXPONENT.get(x.dtype.name)
    if spec is not None and np.dtype(spec[0]).itemsize != x.dtype.itemsize:
        spec = None
    for s in range(0, n, block):
        part = np.ascontiguousarray(x[s : s + block]).reshape(min(block, n - s), -1)
        if spec is not None:
            utype, mask = spec
            m = utype(mask)
            bad[s : s + block] = (np.bitwise_and(part.view(utype), m) == m).any(axis=1)
        else:
            bad[s : s + block] = ~np.isfinite(part).all(axis=1)
    return bad
