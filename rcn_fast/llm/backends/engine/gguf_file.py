"""A lean reader of GGUF files (llama.cpp's model format): the metadata and
the tensors, memory-mapped in place.

Only what the engine needs and nothing that executes code: the header, the
key/value metadata and the tensor table are parsed with :mod:`struct`; the
tensor bytes are views of one read-only ``numpy.memmap`` of the file (no
copy, pages are read when first touched). Large arrays in the metadata (a
tokenizer's 50k-150k tokens and merges) are skipped when the file is opened
and parsed only when asked for (:meth:`GGUFFile.array`).

Format (GGUF v2/v3): magic ``GGUF``, version, tensor count, metadata count;
metadata entries (key string, value type, value); tensor infos (name, dims
innermost first, GGML type, offset into the data section); the data section
starts at the next multiple of ``general.alignment`` (32 by default).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: GGML type ids of the formats the engine multiplies (common/quant_blocks.h)
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
#: (elements per block, bytes per block) of every GGML type id this reader can size
_BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
          10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
          24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}
_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
               10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 24: "I8", 25: "I16",
               26: "I32", 27: "I64", 28: "F64", 30: "BF16"}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: arrays longer than this are skipped at open and parsed on demand
_LAZY_ARRAY = 64


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands (the message says why)."""


def type_name(t: int) -> str:
    """``"Q4_1"`` for GGML type id 3 (``"type <t>"`` when unknown)."""
    return _TYPE_NAMES.get(t, f"type {t}")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``shape`` as numpy orders it (outermost
    first: a weight matrix is ``(N, K)``), its GGML type, and where its bytes
    are (``offset`` from the start of the file)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _LazyArray:
    elem_type: int
    count: int
    offset: int  # of the first element


class GGUFFile:
    """A GGUF file opened read-only.

    Parameters
    ----------
    path : str or Path

    Attributes
    ----------
    metadata : dict
        Key -> value (str, int, float, bool, list); arrays longer than 64
        entries are parsed on demand by :meth:`array`.
    tensors : dict
        Name -> :class:`TensorInfo`, in file order.

    Raises
    ------
    GGUFError
        Not a GGUF file, an unsupported version, a truncated or inconsistent
        header, or a tensor outside the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{self.path}: {size} bytes is too short for a GGUF file")
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.size = size
        self._data: np.ndarray | None = None
        self._pos = 0
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError) as exc:
            raise GGUFError(f"{self.path}: truncated or damaged GGUF header ({exc})") from None

    # ------------------------------------------------------------ parsing

    def _read(self, fmt: str) -> Any:
        v = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return v

    def _string(self) -> str:
        n = self._read("<Q")
        if n > self.size - self._pos:
            raise GGUFError(f"{self.path}: a string of {n} bytes runs past the end of the file")
        s = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8")
        self._pos += n
        return s

    def _skip_string(self) -> None:
        n = self._read("<Q")
        self._pos += n

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self._read(_SCALARS[vtype])
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, count = self._read("<I"), self._read("<Q")
            if count > _LAZY_ARRAY:
                lazy = _LazyArray(etype, count, self._pos)
                self._skip_array(etype, count)
                return lazy
            return [self._value(etype) for _ in range(count)]
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype} at byte {self._pos}")

    def _skip_array(self, etype: int, count: int) -> None:
        if etype in _SCALARS:
            self._pos += struct.calcsize(_SCALARS[etype]) * count
        elif etype == _STRING:
            buf, pos, unpack = self._buf, self._pos, struct.unpack_from
            for _ in range(count):
                pos += 8 + unpack("<Q", buf, pos)[0]
            self._pos = pos
        else:
            for _ in range(count):
                self._value(etype)
        if self._pos > self.size:
            raise GGUFError(f"{self.path}: a metadata array runs past the end of the file")

    def _parse(self) -> None:
        if bytes(self._buf[:4]) != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (no 'GGUF' magic)")
        self._pos = 4
        self.version = self._read("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = self._read("<Q"), self._read("<Q")
        if n_tensors > 1 << 20 or n_kv > 1 << 20:
            raise GGUFError(f"{self.path}: implausible counts ({n_tensors} tensors, {n_kv} metadata entries)")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._read("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            ndim = self._read("<I")
            if not 1 <= ndim <= 4:
                raise GGUFError(f"{self.path}: tensor {name!r} has {ndim} dimensions")
            dims = [self._read("<Q") for _ in range(ndim)]
            infos.append((name, tuple(reversed(dims)), self._read("<I"), self._read("<Q")))
        align = self.metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align < 1 or align & (align - 1):
            raise GGUFError(f"{self.path}: general.alignment {align!r} is not a power of two")
        self.data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, gtype, off in infos:
            if gtype not in _BLOCK:
                raise GGUFError(f"{self.path}: tensor {name!r} has unknown GGML type {gtype}")
            per, nb = _BLOCK[gtype]
            count = int(np.prod(shape, dtype=np.int64))
            if shape[-1] % per:
                raise GGUFError(f"{self.path}: tensor {name!r}: rows of {shape[-1]} are not whole {type_name(gtype)} blocks")
            nbytes = count // per * nb
            start = self.data_start + off
            if start + nbytes > self.size:
                raise GGUFError(f"{self.path}: tensor {name!r} runs past the end of the file "
                                f"(the file is truncated?)")
            self.tensors[name] = TensorInfo(name, shape, gtype, start, nbytes)

    # ------------------------------------------------------------ access

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value (a long array is parsed now)."""
        if key not in self.metadata:
            return default
        v = self.metadata[key]
        return self.array(key) if isinstance(v, _LazyArray) else v

    def array(self, key: str) -> list[Any] | np.ndarray:
        """A metadata array: a list of str for string arrays, else a numpy array."""
        v = self.metadata[key]
        if not isinstance(v, _LazyArray):
            return v
        if v.elem_type in _SCALARS:
            return np.frombuffer(self._buf, dtype=np.dtype(_SCALARS[v.elem_type]), count=v.count, offset=v.offset)
        if v.elem_type != _STRING:
            raise GGUFError(f"{self.path}: {key}: nested arrays are not supported")
        out, buf, pos, unpack = [], self._buf, v.offset, struct.unpack_from
        for _ in range(v.count):
            n = unpack("<Q", buf, pos)[0]
            out.append(buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        return out

    def data(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name``: a read-only uint8 view of the file,
        shaped ``(rows, bytes per row)`` (``(1, n)`` for a vector)."""
        t = self.tensors[name]
        if self._data is None:
            self._data = np.frombuffer(self._buf, dtype=np.uint8)
        rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
        return self._data[t.offset : t.offset + t.nbytes].reshape(rows, t.nbytes // rows)

    def float32(self, name: str) -> np.ndarray:
        """An F32 tensor as a read-only float32 view (its shape)."""
        t = self.tensors[name]
        if t.ggml_type != 0:
            raise GGUFError(f"{self.path}: tensor {name!r} is {type_name(t.ggml_type)}, expected F32")
        return self.data(name).reshape(-1).view(np.float32).reshape(t.shape)

    def header_bytes(self) -> bytes:
        """The header, metadata and tensor table (everything before the data)."""
        return bytes(self._buf[: self.data_start])


__all__ = ["GGUFFile", "GGUFError", "TensorInfo", "GGML_TYPES", "type_name"]
