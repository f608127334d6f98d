"""The test helpers' real-text corpus: real facts kept, padded when short."""

from __future__ import annotations

import json

import pytest

from rcn_fast.testing import tiny_retrieval as tiny
from tests.retrieval.tiny import FALLBACK_SENTENCES, fallback_sentences, real_sentences


def _facts(path) -> list[str]:
    out, seen = [], set()
    for line in open(path):
        t = json.loads(line).get("fact1", "").strip()
        if t and t not in seen:
            seen.add(t)
            out.append(t)
    return out


def test_real_facts_kept_and_padded(tmp_path, monkeypatch):
    # a small stand-in for ../shared: 3 distinct facts, one repeated, one empty
    d = tmp_path / "data" / "commonsense" / "obqa"
    d.mkdir(parents=True)
    rows = ["Fact one.", "Fact two.", "Fact one.", "", "Fact three."]
    (d / "obqa-train.jsonl").write_text("".join(json.dumps({"fact1": r}) + "\n" for r in rows))
    monkeypatch.setattr(tiny, "SHARED", tmp_path)
    assert real_sentences(2) == ["Fact one.", "Fact two."]
    got = real_sentences(10)
    assert got[:3] == ["Fact one.", "Fact two.", "Fact three."]  # the real facts are not thrown away
    assert got[3:] == FALLBACK_SENTENCES[:7] and len(set(got)) == 10
    assert len(real_sentences(10_000)) == 3 + len(fallback_sentences())  # capped: distinct sentences only
    monkeypatch.setattr(tiny, "SHARED", tmp_path / "absent")
    assert real_sentences(45) == fallback_sentences()[:45]
    assert real_sentences(0) == []
    with pytest.raises(ValueError, match="n"):
        real_sentences(-1)


def test_fallback_variants_are_distinct_and_stable():
    fb = fallback_sentences()
    assert len(fb) == len(set(fb)) == 10 * len(FALLBACK_SENTENCES)
    # the first 200 are the historic ones (sentences, then four leads)
    assert fb[40] == "It is known that " + FALLBACK_SENTENCES[0][0].lower() + FALLBACK_SENTENCES[0][1:]
    assert fb[160].startswith("Scientists say that ")


def test_shared_facts_first_when_present():
    f = tiny.SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"
    if not f.is_file():
        pytest.skip(f"OpenBookQA file not found at {f}")
    facts = _facts(f)
    got = real_sentences(len(facts) + 50)
    assert got[:len(facts)] == facts and got[len(facts):] == fallback_sentences()[:50]
