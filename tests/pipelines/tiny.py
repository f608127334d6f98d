"""Tiny random-weight models built in code for the end-to-end pipeline tests
(shared with bench/: rcn_fast/testing/tiny_llm.py)."""

from __future__ import annotations

from rcn_fast.testing.tiny_llm import CHATML, make_tiny_llama  # noqa: F401
