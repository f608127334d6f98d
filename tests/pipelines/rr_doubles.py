"""Test doubles of the RR / self-consistency tests (shared with
bench/bench_rr.py: rcn_fast/testing/rr_doubles.py, re-exported here)."""

from __future__ import annotations

from rcn_fast.testing.rr_doubles import KeywordNLI, PathsLLM, make_tiny_nli, question_of  # noqa: F401
