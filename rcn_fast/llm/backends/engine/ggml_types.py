"""The GGML tensor types, read from the one table of their facts
(csrc/llm/ggml_types.h, exported by ``rcn_fast._C.ggml_type_table``): the
GGUF reader sizes tensors with it, the engine knows from it which types its
kernels multiply, and the C++ kernels compile from the same rows.

Sizes are Python ints (never numpy products, which wrap at 2**63), and a
size a signed 64-bit offset cannot hold is refused, as gguf.cpp refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

#: sizes and offsets must stay below this (gguf.cpp's int64 / size_t limits)
MAX_SIZE = (1 << 63) - 1


@dataclass(frozen=True)
class GGMLType:
    """One GGML tensor type: ``block`` elements take ``block_bytes`` bytes;
    ``matmul``: the engine's kernels multiply it in place."""

    name: str
    id: int
    block: int
    block_bytes: int
    matmul: bool


@lru_cache(maxsize=1)
def table() -> dict[int, GGMLType]:
    """Type id -> :class:`GGMLType` (every type GGML defines; retired ids absent).

    Raises
    ------
    ImportError
        rcn_fast's native module is missing (the reason says how to rebuild).
    """
    from rcn_fast import _native

    mod, err = _native.cpu_module()
    if mod is None or not hasattr(mod, "ggml_type_table"):
        raise ImportError(f"the GGUF reader needs rcn_fast's native module: {err or 'it lacks ggml_type_table (rebuild)'}")
    return {int(i): GGMLType(str(n), int(i), int(b), int(nb), bool(m)) for n, i, b, nb, m in mod.ggml_type_table()}


def by_name() -> dict[str, int]:
    """Type name -> id."""
    return {t.name: i for i, t in table().items()}


def matmul_types() -> dict[str, int]:
    """Name -> id of the types the engine multiplies (F32, F16, Q4_0, Q4_1, Q8_0)."""
    return {t.name: i for i, t in table().items() if t.matmul}


def type_name(t: int) -> str:
    """``"Q4_1"`` for GGML type id 3 (``"type <t>"`` for an id GGML does not define)."""
    info = table().get(t)
    return info.name if info is not None else f"type {t}"


def tensor_nbytes(shape: tuple[int, ...], t: int) -> int:
    """Bytes of a tensor of ``shape`` (numpy order, rows last) and type ``t``:
    whole blocks of its rows, in Python ints.

    Raises
    ------
    ValueError
        An unknown type, rows that are not whole blocks, or a size of
        ``2**63`` bytes or more (the message says which).
    """
    info = table().get(t)
    if info is None:
        raise ValueError(f"unknown GGML type {t}")
    row = shape[-1] if shape else 1
    if row % info.block:
        raise ValueError(f"rows of {row} elements are not whole {info.name} blocks of {info.block}")
    count = 1
    for d in shape:
        count *= int(d)
    if count > MAX_SIZE:
        raise ValueError(f"{count} elements is more than a 64-bit size holds")
    nbytes = count // info.block * info.block_bytes
    if nbytes > MAX_SIZE:
        raise ValueError(f"{nbytes} bytes is more than a 64-bit size holds")
    return nbytes


__all__ = ["GGMLType", "table", "by_name", "matmul_types", "type_name", "tensor_nbytes", "MAX_SIZE"]
