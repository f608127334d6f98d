"""Which backends run a GGUF file, decided from its header before any of
them loads it, and the checks every backend's load starts with.

* :func:`check_file`: what no backend runs, a
  :class:`~rcn_fast.llm.backends.engine.GGUFError` for all of them: the
  strict format (:class:`~rcn_fast.llm.backends.engine.gguf_file.GGUFFile`),
  declared sizes the tensors do not have, a malformed vocabulary
  (:func:`~rcn_fast.llm.backends.engine.tokenizer.check_vocabulary_format`:
  no end-of-sequence id, a byte-level BPE vocabulary without merges or with
  more than its tokens can form, ...).
* :func:`check_for_llamacpp`: :func:`check_file`, then what llama.cpp's
  own loader would take on trust: for the architectures rcn_fast knows,
  the sizes and every tensor's name and shape; every merge listed once.
* :func:`probe`: per backend, whether it runs the file and, if not, why:
  ``native`` -- the architecture, rope, tensor types and vocabulary its
  kernels run; ``llamacpp`` -- llama-cpp-python installed and llama.cpp
  loading the file's vocabulary and sizes (a ``vocab_only`` load: no
  weights read); ``transformers`` -- transformers and gguf installed, an
  architecture its GGUF reader maps, and nothing it would run wrong (rope
  settings it ignores, :func:`~rcn_fast.llm.backends.engine.architecture.transformers_problem`).
* :func:`runs_elsewhere`: the tail of a refusal -- the backends that do run
  the file, or that none installed does and what to install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rcn_fast.llm.backends.engine.architecture import (ARCHITECTURES, UnsupportedModel, architecture, claim_tensors,
                                                       read_hparams, sizes_problem, transformers_problem)
from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile
from rcn_fast.llm.backends.engine.tokenizer import check_merges, check_vocabulary, check_vocabulary_format

BACKENDS = ("native", "llamacpp", "transformers")
TRANSFORMERS_HINT = "pip install 'rcn_fast[llm]' (transformers, gguf)"


@dataclass(frozen=True)
class Verdict:
    """Whether ``backend`` runs a file; ``why`` not, when it does not."""

    backend: str
    runs: bool
    why: str = ""


def check_file(path: str | Path) -> GGUFFile:
    """The file opened and checked for every backend (module notes).

    Raises
    ------
    GGUFError
        The file is malformed or contradicts itself: no backend runs it.
    """
    g = GGUFFile(path)
    problem = sizes_problem(g)
    if problem:
        raise GGUFError(f"{g.path}: {problem}")
    check_vocabulary_format(g)
    return g


def check_for_llamacpp(path: str | Path, g: GGUFFile | None = None) -> GGUFFile:
    """:func:`check_file` (unless ``g``, the file it returned, is given) and
    what llama.cpp's loader would take on trust (module notes); returns the
    open file.

    Raises
    ------
    GGUFError
        A malformed file.
    """
    g = g if g is not None else check_file(path)
    if architecture(g) in ARCHITECTURES:
        try:
            claim_tensors(g, read_hparams(g), check_types=False)
        except UnsupportedModel:  # the native engine's limits, not llama.cpp's
            pass
    if g.meta("tokenizer.ggml.model", "str", None) == "gpt2":
        check_merges(g)
    return g


def _native(g: GGUFFile) -> Verdict:
    from rcn_fast import _native

    mod, err = _native.cpu_module()
    if mod is None or not hasattr(mod, "LlamaModel"):
        return Verdict("native", False, f"rcn_fast's compiled module is missing ({err or 'it lacks LlamaModel'})")
    try:
        claim_tensors(g, read_hparams(g))
        check_vocabulary(g)
    except UnsupportedModel as exc:
        return Verdict("native", False, str(exc).removeprefix(f"{g.path}: "))
    return Verdict("native", True)


def _llamacpp(g: GGUFFile) -> Verdict:
    from rcn_fast.llm.backends.llamacpp import lib

    if not lib.installed():
        return Verdict("llamacpp", False, f"llama-cpp-python is not installed: {lib.HINT}")
    try:
        check_for_llamacpp(g.path, g)
        lib.Model(g.path, vocab_only=True).close()
    except ImportError as exc:
        return Verdict("llamacpp", False, str(exc))
    except lib.LoadError as exc:
        return Verdict("llamacpp", False, f"llama.cpp {lib.version()} does not load it ({exc})")
    return Verdict("llamacpp", True)


def _transformers(g: GGUFFile) -> Verdict:
    missing = [m for m in ("transformers", "gguf", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        return Verdict("transformers", False, f"{', '.join(missing)} not installed: {TRANSFORMERS_HINT}")
    problem = transformers_problem(g)
    if problem:
        return Verdict("transformers", False, problem)
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = architecture(g)
    if arch.replace("-", "_") not in set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}:
        return Verdict("transformers", False, f"transformers' GGUF reader does not map architecture {arch!r}")
    return Verdict("transformers", True)


_PROBES = {"native": _native, "llamacpp": _llamacpp, "transformers": _transformers}


def probe(path: str | Path, backend: str, g: GGUFFile | None = None) -> Verdict:
    """Whether ``backend`` runs the file (after :func:`check_file`, whose
    GGUFError propagates: a malformed file runs nowhere)."""
    if backend not in _PROBES:
        raise ValueError(f"backend: expected one of {list(BACKENDS)}, got {backend!r}")
    return _PROBES[backend](g if g is not None else check_file(path))


def runs_elsewhere(path: str | Path, refused: str, candidates: Sequence[str] = BACKENDS) -> str:
    """What a refusal by ``refused`` adds: ``"engine='llamacpp' runs it"``,
    or that no installed backend does (each one's reason, and what to
    install)."""
    g = check_file(path)
    verdicts = [probe(path, b, g) for b in candidates if b != refused]
    ok = [v.backend for v in verdicts if v.runs]
    if ok:
        return " or ".join(f"engine={b!r}" for b in ok) + (" runs it" if len(ok) == 1 else " run it")
    return "no installed backend runs it (" + "; ".join(f"{v.backend}: {v.why}" for v in verdicts) + ")"


__all__ = ["BACKENDS", "Verdict", "check_file", "check_for_llamacpp", "probe", "runs_elsewhere", "TRANSFORMERS_HINT"]
