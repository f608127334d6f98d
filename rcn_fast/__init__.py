"""rcn_fast: retrieval-augmented knowledge connection (ReConnect) for
commonsense QA, its baselines, and the native kernels they run on.

Stable entry points (other systems call these names):

* :func:`topn` -- exact top-n inner product search (native CPU / CUDA).
* :class:`FlatIndex` -- an exact, saveable, memory-mappable index.
* :func:`build_info` -- what was compiled and which backend each op uses.
* :func:`connect` -- ReConnect's knowledge connection for any RAG system
  (:mod:`rcn_fast.connection`, imported on first use of the name).
"""

from __future__ import annotations

__version__ = "0.1.0"


def _find_compiled_modules() -> None:
    """Make the installed compiled modules importable from a source checkout.

    ``python -m rcn_fast.eval`` run in the repository root imports this
    source tree (the working directory comes first on ``sys.path``), which
    holds no compiled ``_C``/``_cuda`` and no ``kernels`` subpackage: those
    live in the installed copy. When ``_C`` is not beside this file, the
    first other ``rcn_fast`` directory on ``sys.path`` that has it is added
    to this package's search path, so the source tree's Python code runs
    with the installed native modules (``python -m rcn_fast.info`` shows
    where each came from).
    """
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))
    if PathFinder.find_spec("_C", [here]) is not None:
        return
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or os.getcwd()), "rcn_fast")
        if candidate != here and PathFinder.find_spec("_C", [candidate]) is not None:
            __path__.append(candidate)
            return


_find_compiled_modules()

from rcn_fast._dispatch import BackendUnavailableError
from rcn_fast.data import MCQuestion
from rcn_fast.search import FlatIndex, topn
from rcn_fast.sampling import sample_subsets
from rcn_fast._lazy import lazy_exports


def build_info() -> dict:
    """Version, build, hardware, optional packages and the backend of each op
    (the data behind ``python -m rcn_fast.info``)."""
    from rcn_fast.info import build_info as _build_info

    return _build_info()


#: Names served lazily from submodules (imported on first access, so ``import
#: rcn_fast`` stays light): name -> module.
_LAZY = {"connect": "rcn_fast.connection", "Connection": "rcn_fast.connection"}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)

__all__ = ["__version__", "MCQuestion", "topn", "sample_subsets", "FlatIndex", "build_info", "BackendUnavailableError",
           "connect", "Connection"]
