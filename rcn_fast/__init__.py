"""rcn_fast: retrieval-augmented knowledge connection (ReConnect) for
commonsense QA, its baselines, and the native kernels they run on.

Stable entry points (other systems call these names):

* :func:`topn` -- exact top-n inner product search (native CPU / CUDA).
* :class:`FlatIndex` -- an exact, saveable, memory-mappable index.
* :func:`build_info` -- what was compiled and which backend each op uses.
"""

from __future__ import annotations

__version__ = "0.1.0"

from rcn_fast._dispatch import BackendUnavailableError
from rcn_fast.data import MCQuestion
from rcn_fast.search import FlatIndex, topn
from rcn_fast.sampling import sample_subsets



def build_info() -> dict:
    """Version, build, hardware, optional packages and the backend of each op
    (the data behind ``python -m rcn_fast.info``)."""
    from rcn_fast.info import build_info as _build_info

    return _build_info()


__all__ = ["__version__", "MCQuestion", "topn", "sample_subsets", "FlatIndex", "build_info", "BackendUnavailableError"]
