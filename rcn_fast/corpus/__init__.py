"""Corpus stores: ``python -m rcn_fast.corpus build | merge | info | verify``.

The implementation lives in :mod:`rcn_fast.retrieval.store` and
:mod:`rcn_fast.retrieval.build`; this package is the command line and a
short import path.
"""

from __future__ import annotations

from rcn_fast.retrieval.build import BuildConfig, build_corpus, merge_shards
from rcn_fast.retrieval.corpus_input import iter_records
from rcn_fast.retrieval.store import CorpusStore

__all__ = ["BuildConfig", "build_corpus", "merge_shards", "iter_records", "CorpusStore"]
