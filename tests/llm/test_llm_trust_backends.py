"""Unusable label scores on every backend (a NaN model on the local
backend, a NaN engine behind the vLLM wrapper, an LLM that does not check
its own scores behind the cache) fail their question, naming it, and are
never cached; the cache refuses a writer whose journal mode differs from
the one its file records."""

from __future__ import annotations

import math
import sqlite3
import sys

import numpy as np
import pytest

from rcn_fast.llm.cache import CacheError, CachedLLM, CallCache
from rcn_fast.llm.scoring.choice import LabelScoreError, check_label_scores

NAN = math.nan


# ------------------------------------------------------------ the check itself


def test_check_label_scores_names_question_label_and_backend():
    check_label_scores([[-0.1, -math.inf], [-0.0, -5.0], [1e-4, -9.0]], [["A", "B"]] * 3, "m")  # -inf: probability 0
    for bad, why in ((NAN, "NaN"), (math.inf, r"\+inf"), (0.5, "positive")):
        with pytest.raises(LabelScoreError, match=rf"^be: question 'q2' \(chats\[1\]\): label 'B' has log-probability "
                                                  rf".*{why}"):
            check_label_scores([[-1.0, -2.0], [-1.0, bad]], [["A", "B"], ["A", "B"]], "be", ["q1", "q2"])
    with pytest.raises(LabelScoreError, match=r"chats\[0\]: every label \('A', 'B'\) has log-probability -inf"):
        check_label_scores([[-math.inf, -math.inf]], [["A", "B"]], "be")


class _Unchecked:
    """A user LLM that returns whatever its model gives (no checks of its own)."""

    identity = "unchecked-llm"

    def __init__(self, rows):
        from rcn_fast.llm.base import CostTracker

        self.rows, self.cost = rows, CostTracker()

    def generate(self, chats, **kw):  # pragma: no cover - not used
        raise NotImplementedError

    def label_logprobs(self, chats, labels, *, tags=None):
        return np.array(self.rows[: len(chats)], dtype=np.float32)


def test_the_cache_never_stores_an_unusable_row(tmp_path):
    chat = [{"role": "user", "content": "Pick."}]
    cache = CallCache(tmp_path)
    llm = CachedLLM(_Unchecked([[NAN, NAN]]), cache)
    with pytest.raises(LabelScoreError, match=r"unchecked-llm: question 'q9'.*label 'A'"):
        llm.label_logprobs([chat], ["A", "B"], tags=["q9"])
    assert len(cache) == 0


# ------------------------------------------------------------ local and vLLM backends


@pytest.fixture(scope="module")
def nan_llm():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from llm_helpers import build_model, build_tokenizer

    from rcn_fast.llm import load_llm

    tok = build_tokenizer()
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))  # every logit NaN, as a broken checkpoint gives
    return load_llm((model, tok), batch_size=2)


def test_a_nan_model_fails_each_question_instead_of_answering_a(nan_llm, tmp_path):
    from llm_helpers import mcq_chat

    chats = [mcq_chat("2 + 2? A. 4 B. 5"), mcq_chat("Colour? A. blue B. dog")]
    with pytest.raises(LabelScoreError, match=r"hf:.*question 'q0' \(chats\[0\]\): label 'A' has log-probability nan"):
        nan_llm.label_logprobs(chats, ["A", "B"], tags=["q0", "q1"])
    cache = CallCache(tmp_path)
    with pytest.raises(LabelScoreError, match="question 'q1'"):
        CachedLLM(nan_llm, cache).label_logprobs(chats[1:], ["A", "B"], tags=["q1"])
    assert len(cache) == 0


def test_a_nan_vllm_engine_fails_the_question(nan_llm, monkeypatch):
    from llm_helpers import mcq_chat
    from test_llm_vllm_engine import fake_vllm

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(nan_llm, []))
    from rcn_fast.llm import load_llm

    eng = load_llm("vllm:fake-model", top_logprobs=5)
    with pytest.raises(LabelScoreError, match=r"vllm:fake-model.*question 'q3'.*label 'A'"):
        eng.label_logprobs([mcq_chat("2 + 2? A. 4 B. 5")], ["A", "B"], tags=["q3"])


# ------------------------------------------------------------ 26.8: one journal mode per cache file


def _filled(path, journal):
    c = CallCache(path, journal=journal)
    c.put_many([("k", "m", "kind", {}, {"x": 1})])
    return c


@pytest.mark.parametrize("first, second", [("delete", "dotfile"), ("dotfile", "delete"), ("delete", "wal"),
                                           ("dotfile", "wal")])
def test_a_writer_with_another_journal_mode_is_refused(tmp_path, first, second):
    a = _filled(tmp_path / "c.sqlite", first)
    with pytest.raises(CacheError, match=rf"records journal mode '{first}' and this process asks for '{second}'.*"
                                         rf"--cache-journal {first}"):
        CallCache(tmp_path / "c.sqlite", journal=second, timeout=2)
    assert len(a) == 1 and len(CallCache(tmp_path / "c.sqlite", journal=first)) == 1  # the same mode opens it
    a.close()
    CallCache.change_journal(tmp_path / "c.sqlite", second)  # a deliberate change, no process using the file
    assert len(CallCache(tmp_path / "c.sqlite", journal=second)) == 1


@pytest.mark.parametrize("second", ["dotfile", "delete"])
def test_a_rollback_writer_beside_an_open_wal_writer_is_refused_and_told_why(tmp_path, second):
    a = _filled(tmp_path / "c.sqlite", "wal")
    with pytest.raises(CacheError) as err:
        CallCache(tmp_path / "c.sqlite", journal=second, timeout=2)
    msg = str(err.value)
    assert "WAL mode and open in a WAL writer" in msg and "--cache-journal wal" in msg and "writable" not in msg
    assert len(a) == 1
    a.close()
    # no process has it open now: the file is switched to the rollback journal and records it
    assert len(CallCache(tmp_path / "c.sqlite", journal=second)) == 1
    with pytest.raises(CacheError, match=f"records journal mode '{second}'"):
        CallCache(tmp_path / "c.sqlite", journal="wal", timeout=2)


def test_an_older_cache_without_a_recorded_mode_is_adopted(tmp_path):
    p = tmp_path / "old.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE calls (key TEXT PRIMARY KEY, model TEXT NOT NULL, kind TEXT NOT NULL, "
                "request TEXT NOT NULL, response TEXT NOT NULL, created REAL NOT NULL)")
    con.execute("INSERT INTO calls VALUES ('k', 'm', 'kind', '{}', '{}', 0)")
    con.commit()
    con.close()
    assert len(CallCache(p, journal="delete")) == 1
    with pytest.raises(CacheError, match="records journal mode 'delete'"):
        CallCache(p, journal="dotfile", timeout=2)


def test_vllm_identity_covers_the_weights(tiny_llama_dir, tmp_path, monkeypatch):
    """The one identity property of every backend: for the vLLM engine it
    fingerprints the model folder's files, so other weights under the same
    path are another model for the cache."""
    import shutil

    from test_llm_vllm_engine import fake_vllm

    from rcn_fast.llm import load_llm

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm(load_llm(tiny_llama_dir), []))
    d = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, d)
    a = load_llm(f"vllm:{d}").identity
    assert a == load_llm(f"vllm:{d}").identity and not a.endswith("unresolved")
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF  # another weight value, same size and name
    w.write_bytes(bytes(data))
    assert load_llm(f"vllm:{d}").identity != a
    assert load_llm("vllm:not-a-local-model").identity.endswith(":unresolved")
