"""Exact dense search: :func:`topn` (the op) and :class:`FlatIndex` (storage + search)."""

from rcn_fast.search.flat_index import FlatIndex
from rcn_fast.search.reference import select_topn, topn_reference
from rcn_fast.search.topn import topn

__all__ = ["FlatIndex", "topn", "topn_reference", "select_topn"]
