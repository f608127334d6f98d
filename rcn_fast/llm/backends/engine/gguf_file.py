"""A strict reader of GGUF files (llama.cpp's model format): the metadata and
the tensors, memory-mapped in place; every way in for a ``.gguf`` file.

Nothing here executes code: the header, the key/value metadata and the
tensor table are parsed with :mod:`struct` under the checks of ggml's own
reader (gguf.cpp), so a malformed file is one :class:`GGUFError` naming the
file and what is wrong, never a crash, a hang or a huge allocation:

* magic ``GGUF``; version 2 or 3 (0, 1, a future version and a file of the
  other byte order are refused by name);
* tensor and metadata counts, string lengths and array lengths bounded by
  the bytes the file still holds; arrays nest at most :data:`MAX_NESTING`
  deep, and a file holds at most :data:`MAX_NESTED_ARRAYS` arrays inside
  arrays, counted before any is built (ggml's reader refuses nested arrays
  outright; none of rcn_fast's readers asks for one); keys non-empty, UTF-8
  and distinct; ``general.alignment`` a uint32 power of two;
* tensor names distinct and shorter than 64 bytes, at most 4 dimensions,
  a type GGML defines (:mod:`~rcn_fast.llm.backends.engine.ggml_types`,
  the one table of type facts), rows of whole blocks, sizes computed in
  Python ints (below 2**63); each tensor's offset is the running aligned
  sum of the ones before (in order, no overlap, aligned), and every byte
  lies inside the file.

Metadata is read through one typed getter (:meth:`GGUFFile.meta`): a key
of another type than asked for is a :class:`GGUFError` naming the key and
the file. Large arrays (a tokenizer's 50k-150k tokens and merges) are
checked and skipped when the file is opened and parsed when first asked for.

Format (GGUF v2/v3): magic, version, tensor count, metadata count;
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

from rcn_fast.llm.backends.engine import ggml_types
from rcn_fast.llm.backends.engine.ggml_types import MAX_SIZE, type_name

#: GGUF metadata value types: id -> (struct format or None, name)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_VTYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
                8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}
_INTS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_FLOATS = frozenset({6, 12})
#: what :meth:`GGUFFile.meta` returns -> (a scalar kind, the value types that are it)
_KINDS = {"int": (True, _INTS), "float": (True, _FLOATS), "bool": (True, {7}), "str": (True, {_STRING}),
          "int[]": (False, _INTS), "float[]": (False, _FLOATS), "str[]": (False, {_STRING})}
#: deepest nesting of metadata arrays (gguf.cpp reads none; the format allows them)
MAX_NESTING = 4
#: arrays inside arrays, in all of a file's metadata (each is built when the file is opened)
MAX_NESTED_ARRAYS = 4096
#: arrays longer than this are checked and skipped at open, parsed on demand
_LAZY_ARRAY = 64
#: tensor names are shorter than this many bytes (GGML_MAX_NAME)
MAX_NAME = 64
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
_ABSENT = object()


class GGUFError(ValueError):
    """The file is not a well-formed GGUF file, or its contents contradict
    each other (the message names the file and says what is wrong)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``shape`` as numpy orders it (outermost
    first: a weight matrix is ``(N, K)``), its GGML type, and where its bytes
    are (``offset`` from the start of the file, ``nbytes`` of them)."""

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
    end: int  # the byte after the last element


def _describe(vtype: int, value: Any) -> str:
    if vtype == _ARRAY:
        etype = value.elem_type if isinstance(value, _LazyArray) else value[0]
        return f"array of {_VTYPE_NAMES.get(etype, etype)}"
    return _VTYPE_NAMES.get(vtype, str(vtype))


class GGUFFile:
    """A GGUF file opened read-only and checked (module notes).

    Parameters
    ----------
    path : str or Path

    Attributes
    ----------
    tensors : dict
        Name -> :class:`TensorInfo`, in file order.
    version, alignment, data_start, size : int

    Raises
    ------
    GGUFError
        Not a GGUF file, an unsupported version, or a malformed or
        inconsistent header, metadata or tensor table (the message names the
        file and the fault).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size < 8:
                    raise GGUFError(f"{self.path}: {st.st_size} bytes is too short for a GGUF file")
                self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        #: (size, mtime_ns, ctime_ns, inode, device) when opened: the identity :meth:`check_unchanged` compares
        self.stat_identity = _stat_identity(st)
        self.size = st.st_size
        self._data: np.ndarray | None = None
        self._pos = 0
        self._values: dict[str, Any] = {}
        self._types: dict[str, int] = {}
        self._spans: dict[str, int] = {}  # key -> bytes its value takes
        self._nested_left = MAX_NESTED_ARRAYS
        self._parse()

    # ------------------------------------------------------------ low-level reads

    def _fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def _need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self._pos:
            raise self._fail(f"{what} needs {n} bytes at byte {self._pos}, the file has {self.size - self._pos} left "
                             f"(truncated or damaged)")

    def _read(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self._need(n, what)
        v = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += n
        return v

    def _bytes_string(self, what: str) -> bytes:
        n = self._read("<Q", f"the length of {what}")
        self._need(n, f"{what} ({n} bytes)")
        s = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return s

    def _string(self, what: str) -> str:
        raw = self._bytes_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(f"{what} is not UTF-8 text") from None

    # ------------------------------------------------------------ metadata values

    def _value(self, vtype: int, key: str, depth: int) -> Any:
        if vtype in _SCALARS:
            return self._read(_SCALARS[vtype], f"metadata {key!r}")
        if vtype == _STRING:
            return self._string(f"metadata {key!r}")
        if vtype != _ARRAY:
            raise self._fail(f"metadata {key!r} has unknown value type {vtype} (expected 0-12)")
        if depth >= MAX_NESTING:
            raise self._fail(f"metadata {key!r} nests arrays more than {MAX_NESTING} deep")
        etype = self._read("<I", f"the element type of metadata {key!r}")
        count = self._read("<Q", f"the length of metadata {key!r}")
        if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
            raise self._fail(f"metadata {key!r} is an array of unknown value type {etype}")
        least = struct.calcsize(_SCALARS[etype]) if etype in _SCALARS else 8 if etype == _STRING else 12
        if count * least > self.size - self._pos:
            raise self._fail(f"metadata {key!r}: an array of {count} elements cannot fit in the "
                             f"{self.size - self._pos} bytes left in the file")
        if etype == _ARRAY:  # counted before one is built: a file of millions of empty arrays is refused here
            if count > self._nested_left:
                raise self._fail(f"metadata {key!r} holds arrays of arrays beyond the {MAX_NESTED_ARRAYS} a file may "
                                 f"hold (an array of {count} arrays; ggml's reader refuses nested arrays outright)")
            self._nested_left -= count
        if count > _LAZY_ARRAY and etype != _ARRAY:
            start = self._pos
            self._skip_array(etype, count, key)
            return _LazyArray(etype, count, start, self._pos)
        return (etype, [self._value(etype, key, depth + 1) for _ in range(count)])

    def _skip_array(self, etype: int, count: int, key: str) -> None:
        if etype in _SCALARS:
            self._pos += struct.calcsize(_SCALARS[etype]) * count  # bounded above
            return
        buf, pos, unpack = self._buf, self._pos, _U64.unpack_from
        i = 0
        try:
            for i in range(count):  # the hot loop of a large vocabulary: one read and one add per string
                pos += 8 + unpack(buf, pos)[0]
        except (struct.error, OverflowError):  # a length not in the file: string i's, or string i - 1 ran past
            bad = i - 1 if pos > self.size else i
            raise self._fail(f"metadata {key!r}: string {bad} of {count} runs past the end of the file") from None
        if pos > self.size:
            raise self._fail(f"metadata {key!r}: string {count - 1} of {count} runs past the end of the file")
        self._pos = pos

    # ------------------------------------------------------------ the header

    def _parse(self) -> None:
        magic = bytes(self._buf[:4])
        if magic != b"GGUF":
            raise self._fail(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
        self._pos = 4
        v = self.version = self._read("<I", "the version")
        if v == 0 or v == 1 or v > 3:
            why = ("written in the other byte order" if v & 0xFFFF == 0 else
                   "GGUF v1 is no longer read" if v == 1 else "not a version this reader knows (2 or 3)")
            raise self._fail(f"GGUF version {v}: {why}")
        n_tensors = self._read("<q", "the tensor count")
        n_kv = self._read("<q", "the metadata count")
        left = self.size - self._pos
        if not 0 <= n_tensors <= left // 29:  # a tensor info takes at least 29 bytes, a metadata entry 13
            raise self._fail(f"tensor count {n_tensors} is impossible in a file of {self.size} bytes")
        if not 0 <= n_kv <= left // 13:
            raise self._fail(f"metadata count {n_kv} is impossible in a file of {self.size} bytes")
        for i in range(n_kv):
            key = self._string(f"metadata key {i}")
            if not key:
                raise self._fail(f"metadata key {i} is empty")
            if key in self._values:
                raise self._fail(f"metadata key {key!r} appears twice")
            vtype = self._read("<I", f"the type of metadata {key!r}")
            self._types[key] = vtype
            start = self._pos
            self._values[key] = self._value(vtype, key, 0)
            self._spans[key] = self._pos - start
        align = DEFAULT_ALIGNMENT
        if "general.alignment" in self._values:
            if self._types["general.alignment"] != 4:
                raise self._fail(f"general.alignment must be a uint32, the file holds a "
                                 f"{_describe(self._types['general.alignment'], self._values['general.alignment'])}")
            align = self._values["general.alignment"]
            if align == 0 or align & (align - 1):
                raise self._fail(f"general.alignment {align} is not a power of two")
        self.alignment = align
        infos = self._tensor_infos(n_tensors)
        self.data_start = -(-self._pos // align) * align
        if n_tensors and self.data_start > self.size:
            raise self._fail("the data section starts past the end of the file (truncated?)")
        self.tensors: dict[str, TensorInfo] = {}
        expected = 0
        for name, shape, gtype, off, nbytes in infos:
            if off != expected:
                raise self._fail(f"tensor {name!r} is at offset {off} of the data section, expected {expected} "
                                 f"(tensors lie in order, each at the aligned end of the one before)")
            end = self.data_start + off + nbytes
            if end > self.size:
                raise self._fail(f"tensor {name!r} ({nbytes} bytes at byte {self.data_start + off}) runs past the end "
                                 f"of the file of {self.size} bytes (truncated?)")
            expected = off + -(-nbytes // align) * align
            if expected > MAX_SIZE:
                raise self._fail(f"tensor {name!r}: the data section's size overflows")
            self.tensors[name] = TensorInfo(name, shape, gtype, self.data_start + off, nbytes)

    def _tensor_infos(self, n: int) -> list[tuple[str, tuple[int, ...], int, int, int]]:
        infos = []
        seen: set[str] = set()
        types = ggml_types.table()
        for i in range(n):
            name = self._string(f"the name of tensor {i}")
            if len(name.encode("utf-8")) >= MAX_NAME:
                raise self._fail(f"tensor name {name[:80]!r} is {len(name.encode())} bytes (at most {MAX_NAME - 1})")
            if name in seen:
                raise self._fail(f"tensor {name!r} appears twice")
            seen.add(name)
            ndim = self._read("<I", f"the dimension count of tensor {name!r}")
            if ndim > MAX_DIMS:
                raise self._fail(f"tensor {name!r} has {ndim} dimensions (at most {MAX_DIMS})")
            dims = [self._read("<q", f"the shape of tensor {name!r}") for _ in range(ndim)]
            if any(d < 0 for d in dims):
                raise self._fail(f"tensor {name!r} has a negative dimension {dims}")
            gtype = self._read("<i", f"the type of tensor {name!r}")
            if gtype not in types:
                raise self._fail(f"tensor {name!r} has unknown GGML type {gtype}")
            shape = tuple(reversed(dims))
            try:
                nbytes = ggml_types.tensor_nbytes(shape, gtype)
            except ValueError as exc:
                raise self._fail(f"tensor {name!r} of shape {shape} and type {type_name(gtype)}: {exc}") from None
            off = self._read("<Q", f"the offset of tensor {name!r}")
            infos.append((name, shape, gtype, off, nbytes))
        return infos

    # ------------------------------------------------------------ metadata access

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def keys(self) -> list[str]:
        """The metadata keys, in file order."""
        return list(self._values)

    def value_type(self, key: str) -> str:
        """``"uint32"``, ``"string"``, ``"array of string"``, ... of metadata ``key``."""
        return _describe(self._types[key], self._values[key])

    def meta(self, key: str, kind: str | tuple[str, ...], default: Any = _ABSENT) -> Any:
        """Metadata ``key`` as ``kind``: the one way metadata is read.

        Parameters
        ----------
        key : str
        kind : str or tuple of str
            ``"int"`` (any integer type: a Python int), ``"float"`` (float32
            or float64), ``"bool"``, ``"str"``, ``"int[]"`` (an array of an
            integer type: int64 ndarray), ``"float[]"`` (float64 ndarray),
            ``"str[]"`` (list of str); a tuple accepts any of them.
        default : optional
            Returned when the key is absent; without it an absent key is a
            :class:`GGUFError`.

        Raises
        ------
        GGUFError
            The key is absent (and no default), of another type, or an array
            holds text that is not UTF-8; the message names the key and the file.
        """
        if key not in self._values:
            if default is _ABSENT:
                raise self._fail(f"metadata {key} is missing")
            return default
        value = self._values[key]
        k = self._kind(key, kind)
        if k == "int":
            return int(value)
        if k == "float":
            return float(value)
        if k == "bool":
            return bool(value)
        if k == "str":
            return value
        if k == "str[]":
            return list(self._array(key, value))
        return np.asarray(self._array(key, value), dtype=np.int64 if k == "int[]" else np.float64)

    def array_length(self, key: str, kind: str) -> int | None:
        """The length of metadata array ``key`` of ``kind`` (``"str[]"``,
        ``"int[]"``, ``"float[]"``), without parsing it; None when absent.

        Raises
        ------
        GGUFError
            The key holds another type (the message names the key and the file).
        """
        if key not in self._values:
            return None
        self._kind(key, kind)
        v = self._values[key]
        return v.count if isinstance(v, _LazyArray) else len(v[1])

    def array_nbytes(self, key: str, kind: str) -> int | None:
        """The bytes the elements of metadata array ``key`` of ``kind``
        take in the file (a string's 8-byte length included), without
        parsing it; None when absent.

        Raises
        ------
        GGUFError
            The key holds another type.
        """
        if key not in self._values:
            return None
        self._kind(key, kind)
        return self._spans[key] - 12  # the element type and the count

    def _kind(self, key: str, kind: str | tuple[str, ...]) -> str:
        """The first of ``kind`` that metadata ``key`` (present) is, or a GGUFError."""
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        if any(k not in _KINDS for k in kinds):
            raise ValueError(f"kind: expected some of {sorted(_KINDS)}, got {kind!r}")
        vtype, value = self._types[key], self._values[key]
        etype = (value.elem_type if isinstance(value, _LazyArray) else value[0]) if vtype == _ARRAY else None
        for k in kinds:
            if (vtype if _KINDS[k][0] else etype) in _KINDS[k][1]:
                return k
        raise self._fail(f"metadata {key} must be {' or '.join(kinds)}, the file holds {self.value_type(key)}")

    def _array(self, key: str, value: Any) -> list[Any] | np.ndarray:
        if not isinstance(value, _LazyArray):
            return value[1]
        if value.elem_type in _SCALARS:
            return np.frombuffer(self._buf, dtype=np.dtype(_SCALARS[value.elem_type]), count=value.count,
                                 offset=value.offset)
        out, buf, pos, unpack = [], self._buf, value.offset, struct.unpack_from
        for i in range(value.count):  # bounds checked when the file was opened
            n = unpack("<Q", buf, pos)[0]
            try:
                out.append(buf[pos + 8 : pos + 8 + n].decode("utf-8"))
            except UnicodeDecodeError:
                raise self._fail(f"metadata {key}: entry {i} is not UTF-8 text") from None
            pos += 8 + n
        return out

    # ------------------------------------------------------------ tensors

    def data(self, name: str) -> np.ndarray:
        """The bytes of tensor ``name``: a read-only uint8 view of the file,
        shaped ``(rows, bytes per row)`` (``(1, n)`` for a vector)."""
        t = self.tensors[name]
        if self._data is None:
            self._data = np.frombuffer(self._buf, dtype=np.uint8)
        rows = 1
        for d in t.shape[:-1]:
            rows *= d
        if rows == 0 or t.nbytes == 0:
            return self._data[t.offset : t.offset].reshape(rows, 0)
        return self._data[t.offset : t.offset + t.nbytes].reshape(rows, t.nbytes // rows)

    def float32(self, name: str) -> np.ndarray:
        """An F32 tensor as a read-only float32 view (its shape)."""
        t = self.tensors[name]
        if t.ggml_type != 0:
            raise self._fail(f"tensor {name!r} is {type_name(t.ggml_type)}, expected F32")
        return self.data(name).reshape(-1).view(np.float32).reshape(t.shape)

    def header_bytes(self) -> bytes:
        """The header, metadata and tensor table (everything before the data)."""
        return bytes(self._buf[: self.data_start])

    def check_unchanged(self) -> None:
        """Refuse a file that changed on disk since it was opened.

        The memory map reads the file as it is now: a file rewritten in
        place gives other weights under the old identity, and one truncated
        gives a SIGBUS on the next read of a lost page (in any mmap-based
        engine, llama.cpp's too). This compares the file's size,
        modification time, change time, inode and device with those at
        open: a file rewritten in place with its mtime put back still has a
        new ctime (which no user can set back).

        Raises
        ------
        GGUFError
            The file was changed, replaced, truncated or removed.
        """
        try:
            now = _stat_identity(os.stat(self.path))
        except OSError as exc:
            now = None
            why = f"it cannot be read now ({exc.strerror or exc})"
        if now != self.stat_identity:
            if now is not None:
                names = ("size", "mtime_ns", "ctime_ns", "inode", "device")
                why = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(names, self.stat_identity, now) if a != b)
            raise self._fail(f"the model file changed on disk since it was loaded ({why}); its weights are no longer "
                             f"those loaded: load the model again")


def _stat_identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


__all__ = ["GGUFFile", "GGUFError", "TensorInfo", "MAX_NESTING", "MAX_NESTED_ARRAYS", "MAX_NAME", "DEFAULT_ALIGNMENT"]
