"""GGUF files byte by byte, right or wrong on purpose, for the format tests:
handcrafted files in the manner of llama.cpp's tests/test-gguf.cpp, and a
real file read into the same description (by gguf-py's own reader, not the
code under test) so a real model can be written back with one fault.

A file is a list of :class:`KV` and a list of :class:`Tensor`;
:func:`build` lays them out as GGUF v3 does (each tensor at the aligned end
of the one before, the data section aligned), and its keywords break one
thing at a time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


@dataclass
class KV:
    """One metadata entry; ``etype`` is the element type of an array."""

    key: str
    vtype: int
    value: Any
    etype: int | None = None


@dataclass
class Tensor:
    """One tensor: ``dims`` innermost first (GGUF's order), its GGML type and
    its bytes; ``offset`` None: the running aligned sum."""

    name: str
    dims: list[int]
    gtype: int
    data: bytes
    offset: int | None = None


def string(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def value(vtype: int, v: Any, etype: int | None = None) -> bytes:
    """The bytes of one value (arrays: element type, count, elements)."""
    if vtype in _FMT:
        return struct.pack(_FMT[vtype], v)
    if vtype == STRING:
        return string(v)
    if vtype == ARRAY:
        assert etype is not None
        inner = b"".join(value(etype, x[1] if etype == ARRAY else x, x[0] if etype == ARRAY else None) for x in v)
        return struct.pack("<IQ", etype, len(v)) + inner
    raise ValueError(f"vtype {vtype}")


@dataclass
class Layout:
    """What :func:`build` writes besides the entries (each a way to break a file)."""

    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None  # None: the real count
    n_kv: int | None = None
    alignment: int = 32  # the alignment tensors are laid out with
    data_slack: int = 0  # bytes added (> 0) or cut (< 0) at the end
    extra: dict[str, Any] = field(default_factory=dict)


def build(kvs: list[KV], tensors: list[Tensor], layout: Layout | None = None) -> bytes:
    """A GGUF file of ``kvs`` and ``tensors``."""
    lay = layout or Layout()
    out = bytearray(lay.magic + struct.pack("<I", lay.version))
    out += struct.pack("<Q", (len(tensors) if lay.n_tensors is None else lay.n_tensors) & (2**64 - 1))
    out += struct.pack("<Q", (len(kvs) if lay.n_kv is None else lay.n_kv) & (2**64 - 1))
    for kv in kvs:
        out += string(kv.key) + struct.pack("<I", kv.vtype) + value(kv.vtype, kv.value, kv.etype)
    offset = 0
    for t in tensors:
        off = offset if t.offset is None else t.offset
        out += string(t.name) + struct.pack("<I", len(t.dims)) + b"".join(struct.pack("<q", d) for d in t.dims)
        out += struct.pack("<i", t.gtype) + struct.pack("<Q", off & (2**64 - 1))
        offset += -(-len(t.data) // lay.alignment) * lay.alignment
    out += bytes(-len(out) % lay.alignment)
    for i, t in enumerate(tensors):
        out += t.data
        if i + 1 < len(tensors):
            out += bytes(-len(t.data) % lay.alignment)
    if lay.data_slack > 0:
        out += bytes(lay.data_slack)
    elif lay.data_slack < 0:
        del out[lay.data_slack:]
    return bytes(out)


def read(path: Any) -> tuple[list[KV], list[Tensor]]:
    """A real GGUF file as entries (read by gguf-py's GGUFReader)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    kvs = []
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [int(t) for t in f.types]
        if types[0] == ARRAY:
            kvs.append(KV(name, ARRAY, list(f.contents()), types[1]))
        else:
            kvs.append(KV(name, types[0], f.contents()))
    tensors = [Tensor(t.name, [int(d) for d in t.shape], int(t.tensor_type), np.asarray(t.data).tobytes())
               for t in r.tensors]
    return kvs, tensors


def edit(kvs: list[KV], key: str, vtype: int | None = None, v: Any = None, etype: int | None = None, *,
         drop: bool = False) -> list[KV]:
    """``kvs`` with ``key`` set (added at the end when absent) or dropped."""
    out = [kv for kv in kvs if kv.key != key] if drop else []
    if drop:
        return out
    found = False
    for kv in kvs:
        if kv.key == key:
            out.append(KV(key, vtype if vtype is not None else kv.vtype, v, etype))
            found = True
        else:
            out.append(kv)
    if not found:
        out.append(KV(key, vtype, v, etype))  # type: ignore[arg-type]
    return out


def retensor(tensors: list[Tensor], name: str, **changes: Any) -> list[Tensor]:
    """``tensors`` with tensor ``name`` changed (dims, gtype, data, offset)."""
    return [replace(t, **changes) if t.name == name else t for t in tensors]


__all__ = ["KV", "Tensor", "Layout", "build", "read", "edit", "retensor", "string", "value",
           "U8", "I8", "U16", "I16", "U32", "I32", "F32", "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"]
