"""SEPTA checkpoint files: safetensors with a JSON tree, never pickles.

A checkpoint is a nested structure of dicts, lists, tuples, str / int /
float / bool / None and torch tensors (settings, a model's
``state_dict``, an optimizer's ``state_dict``, the torch RNG state, the
training history). :func:`save_checkpoint` writes the tensors to a
``.safetensors`` file and the structure, as JSON, into its header
metadata; :func:`load_checkpoint` reads it back. Neither file part can
execute code when read.

Checkpoints of older rcn_fast versions were pickles (``torch.save``:
``align.pt``, ``predictor.pt``, ``align_state.pt``,
``predictor_state.pt``). Reading a pickle can run arbitrary code, so
rcn_fast refuses them (:func:`refuse_pickle`) and says how to convert a
folder one trusts, once: ``python -m rcn_fast.septa convert --dir DIR``
(:func:`convert_directory`; it reads each ``.pt`` with
``torch.load(weights_only=True)``, which accepts only tensors and plain
containers, and writes the ``.safetensors`` beside it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NoReturn

from rcn_fast.septa.gnn import torch_module

FORMAT = "rcn_fast.septa.checkpoint/1"
SUFFIX = ".safetensors"
#: the checkpoint files of a SEPTA directory (stem -> what writes it)
PARTS = {"align": "align", "align_state": "align", "predictor": "train", "predictor_state": "train"}
_HINT = 'pip install "rcn_fast[septa]"  (safetensors)'
# first bytes of torch.save files: zip archive (default) or a raw pickle (protocol >= 2)
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")


def _safetensors() -> Any:
    from rcn_fast._arrays import require

    return require("safetensors", _HINT)


# ------------------------------------------------------------------ the tree
def _flatten(obj: Any, tensors: dict[str, Any], seen: dict[int, str]) -> Any:
    """JSON form of ``obj``; its tensors go into ``tensors`` ("t<n>" keys)."""
    torch = torch_module()
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:  # safetensors refuses shared storage: store a copy
            t = t.clone()
        key = f"t{len(tensors)}"
        if ptr is not None:
            seen.setdefault(ptr, key)
        tensors[key] = t
        return {"$tensor": key}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():  # numpy scalar
        return _flatten(obj.item(), tensors, seen)
    if isinstance(obj, tuple):
        return {"$tuple": [_flatten(v, tensors, seen) for v in obj]}
    if isinstance(obj, list):
        return [_flatten(v, tensors, seen) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _flatten(v, tensors, seen) for k, v in obj.items()}
        return {"$items": [[_flatten(k, tensors, seen), _flatten(v, tensors, seen)] for k, v in obj.items()]}
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__} (tensors, dicts, lists, tuples and "
                    "JSON scalars only)")


def _unflatten(obj: Any, tensors: dict[str, Any], path: Path) -> Any:
    if isinstance(obj, list):
        return [_unflatten(v, tensors, path) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"$tensor"}:
        if obj["$tensor"] not in tensors:
            raise ValueError(f"checkpoint: {path} names a tensor {obj['$tensor']!r} it does not hold")
        return tensors[obj["$tensor"]]
    if set(obj) == {"$tuple"} and isinstance(obj["$tuple"], list):
        return tuple(_unflatten(v, tensors, path) for v in obj["$tuple"])
    if set(obj) == {"$items"} and isinstance(obj["$items"], list):
        out = {}
        for pair in obj["$items"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"checkpoint: {path} has a damaged structure (an item is not a pair)")
            key = _unflatten(pair[0], tensors, path)
            out[key if not isinstance(key, list) else tuple(key)] = _unflatten(pair[1], tensors, path)
        return out
    return {k: _unflatten(v, tensors, path) for k, v in obj.items()}


# ------------------------------------------------------------------ files
def save_checkpoint(path: str | os.PathLike[str], obj: dict[str, Any]) -> None:
    """Write ``obj`` (see the module docstring) to ``path`` atomically
    (a temporary file beside it, then a rename).

    Parameters
    ----------
    path : path of the ``.safetensors`` file
    obj : dict
        Tensors (any dtype safetensors stores; moved to the CPU), dicts,
        lists, tuples and JSON scalars.

    Raises
    ------
    TypeError
        ``obj`` holds anything else (e.g. an arbitrary Python object).
    """
    _safetensors()
    from safetensors.torch import save_file

    path = Path(path)
    tensors: dict[str, Any] = {}
    tree = _flatten(obj, tensors, {})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "tree": json.dumps(tree)})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def is_pickle(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts like a ``torch.save`` / pickle file."""
    with open(path, "rb") as f:
        head = f.read(4)
    return any(head.startswith(m) for m in _PICKLE_MAGIC)


def refuse_pickle(path: str | os.PathLike[str], arg: str = "checkpoint") -> NoReturn:
    """Raise the ValueError that refuses a pickle checkpoint and says how to
    convert the folder, once, when it is trusted."""
    path = Path(path)
    raise ValueError(
        f"{arg}: {path} is a pickle (torch.save) checkpoint of an older rcn_fast; rcn_fast no longer reads "
        f"pickles, because loading one can run any code its author put in it. If you trust this folder, "
        f"convert it once with `python -m rcn_fast.septa convert --dir {path.parent}` (reads each .pt with "
        f"torch.load(weights_only=True) and writes a .safetensors file beside it); otherwise rebuild it "
        f"(`python -m rcn_fast.septa align`, `build-db`, `train`)")


def load_checkpoint(path: str | os.PathLike[str], arg: str = "checkpoint") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on the CPU).

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A pickle (refused, with how to convert it), or a file that is not
        an rcn_fast SEPTA safetensors checkpoint; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{arg}: {path} does not exist")
    if is_pickle(path):
        refuse_pickle(path, arg)
    st = _safetensors()
    try:
        with st.safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # SafetensorError (damaged header), OSError, ...
        raise ValueError(f"{arg}: {path} is not a readable safetensors checkpoint ({type(exc).__name__}: "
                         f"{exc}); rebuild it") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{arg}: {path} is not an rcn_fast SEPTA checkpoint (format {meta.get('format')!r}, "
                         f"expected {FORMAT!r})")
    try:
        tree = json.loads(meta.get("tree", ""))
    except ValueError:
        raise ValueError(f"{arg}: {path} has a damaged structure (its JSON does not parse); rebuild it") from None
    out = _unflatten(tree, tensors, path)
    if not isinstance(out, dict):
        raise ValueError(f"{arg}: {path} has a damaged structure (expected an object at the top)")
    return out


# ------------------------------------------------------------------ conversion
def convert_pickle_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None = None) -> Path:
    """Convert one old ``torch.save`` checkpoint (``.pt``) to safetensors.

    Run it only on a file you trust. The pickle is read with
    ``torch.load(weights_only=True)``, which rebuilds only tensors and
    plain containers and refuses anything else (so a crafted file fails
    here instead of running code), but it is still a pickle reader.

    Parameters
    ----------
    src : the ``.pt`` file
    dst : the ``.safetensors`` file to write (default: beside ``src``)

    Returns
    -------
    Path of the written file.

    Raises
    ------
    ValueError
        ``src`` holds anything but tensors and plain containers (named).
    """
    torch = torch_module()
    src = Path(src)
    dst = Path(dst) if dst is not None else src.with_suffix(SUFFIX)
    try:
        obj = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError: an object outside the weights-only allow-list
        raise ValueError(f"checkpoint: {src} cannot be converted: it holds more than tensors and plain "
                         f"containers ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                         "rebuild it instead") from None
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint: {src} holds a {type(obj).__name__}, not a SEPTA checkpoint")
    save_checkpoint(dst, obj)
    return dst


def convert_directory(directory: str | os.PathLike[str]) -> list[Path]:
    """Convert the old ``.pt`` checkpoints of a SEPTA directory (see
    :func:`convert_pickle_checkpoint`); the ``.pt`` files are left in place
    (delete them once the conversion is checked). Returns the files written."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"directory: {d} does not exist")
    out = [convert_pickle_checkpoint(d / f"{stem}.pt") for stem in PARTS if (d / f"{stem}.pt").is_file()]
    if not out:
        raise FileNotFoundError(f"directory: {d} holds none of {', '.join(s + '.pt' for s in PARTS)}")
    return out


def part(directory: str | os.PathLike[str], stem: str) -> Path:
    """``directory / (stem + ".safetensors")``, after refusing a directory
    that holds only the old pickle ``stem + ".pt"``."""
    d = Path(directory)
    new = d / (stem + SUFFIX)
    old = d / (stem + ".pt")
    if not new.is_file() and old.is_file():
        refuse_pickle(old)
    return new


__all__ = ["save_checkpoint", "load_checkpoint", "convert_pickle_checkpoint", "convert_directory", "refuse_pickle",
           "is_pickle", "part", "FORMAT", "SUFFIX", "PARTS"]
