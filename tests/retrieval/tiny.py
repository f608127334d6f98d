"""Helpers for the retrieval tests (shared with bench/:
rcn_fast/testing/tiny_retrieval.py, re-exported here)."""

from __future__ import annotations

from rcn_fast.testing.tiny_retrieval import (  # noqa: F401
    FALLBACK_SENTENCES,
    SHARED,
    cache_env,
    fallback_sentences,
    make_tiny_bert,
    minilm_dir,
    real_sentences,
)
