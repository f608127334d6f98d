"""The sqlite call cache and the cached LLM wrapper (tiny real model)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.cache import CachedLLM, CallCache  # noqa: E402

QS = ["Where is a plate kept? A. cupboard B. floor", "2 + 2? A. 4 B. 5 C. 6", "Colour? A. blue B. dog"]


def test_resume_asks_the_model_only_for_missing_rows(tiny_llama_dir, tmp_path):
    llm = load_llm(tiny_llama_dir, cache=tmp_path / "run1")
    assert isinstance(llm, CachedLLM) and llm.cache.path.name == "llm_cache.sqlite"
    inner = llm.llm
    chats = [mcq_chat(q) for q in QS]
    first = llm.label_logprobs(chats[:2], ["A", "B"], tags=["q0", "q1"])
    assert inner.cost.total.calls == 2
    # "interrupted" after two rows; the rerun asks the model for the third only
    again = llm.label_logprobs(chats, ["A", "B"], tags=["q0", "q1", "q2"])
    assert inner.cost.total.calls == 3
    np.testing.assert_array_equal(again[:2], first)
    fresh = inner.label_logprobs(chats, ["A", "B"])
    np.testing.assert_allclose(again, fresh, rtol=1e-6)
    assert llm.cost.total.cached_calls == 2 and llm.cost.total.calls == 5
    # cached rows report the tokens recorded when they were computed
    lens = [len(x) for x in inner.encode_chats(chats)]
    assert llm.cost.by_tag["q0"].prompt_tokens == 2 * lens[0]
    # a new process (new objects) on the same directory answers from disk
    llm2 = load_llm(tiny_llama_dir, cache=tmp_path / "run1")
    out = llm2.label_logprobs(chats, ["A", "B"])
    np.testing.assert_array_equal(out, again)
    assert llm2.llm.cost.total.calls == 0
    # other labels are other questions
    llm2.label_logprobs(chats[:1], ["A", "B", "C"])
    assert llm2.llm.cost.total.calls == 1


def test_generation_cached_per_seed_and_sample(tiny_llama_dir, tmp_path):
    llm = load_llm(tiny_llama_dir, cache=tmp_path / "c.sqlite")
    inner = llm.llm
    chats = [mcq_chat(q, prefill="") for q in QS[:2]]
    kw = dict(max_new_tokens=4, temperature=1.0, seed=3)
    a = llm.generate(chats, num_samples=2, **kw)
    calls = inner.cost.total.calls
    b = llm.generate(chats, num_samples=2, **kw)
    assert inner.cost.total.calls == calls
    assert [[g.to_dict() for g in r] for r in a] == [[g.to_dict() for g in r] for r in b]
    # another seed reaches the model; more samples draw only the new index
    llm.generate(chats, num_samples=2, **{**kw, "seed": 4})
    assert inner.cost.total.calls == calls + 2
    tokens = inner.cost.total.generated_tokens
    c = llm.generate(chats, num_samples=3, **kw)
    assert inner.cost.total.calls == calls + 4
    assert [r[:2] for r in c] == a  # the stored samples, as stored
    assert inner.cost.total.generated_tokens - tokens == sum(r[2].generated_tokens for r in c)
    g = llm.generate(chats, max_new_tokens=3)
    assert llm.generate(chats, max_new_tokens=3)[0][0] == g[0][0]
    assert llm.cost.total.generated_tokens > 0 and llm.cost.total.cached_calls == 2 + 2


def _seed_cache_with(llm, chat, sample: int, text: str, **kw) -> None:
    """Store a recognisable answer for one sample key, as an earlier run would have."""
    params = {"max_new_tokens": kw["max_new_tokens"], "temperature": kw["temperature"], "top_p": 1.0,
              "seed": kw["seed"], "stop": None}
    req = {"chat": chat, "params": params, "sample": sample}
    key = CallCache.key(llm.identity, "generate", req)
    llm.cache.put_many([(key, llm.identity, "generate", req, {"text": text, "prompt_tokens": 9,
                                                               "generated_tokens": 2, "finish_reason": "stop"})])


def test_partly_cached_row_keeps_stored_samples_and_draws_only_the_missing(tiny_llama_dir, tmp_path):
    llm = load_llm(tiny_llama_dir, cache=tmp_path / "p.sqlite")
    inner = llm.llm
    chat = mcq_chat(QS[0], prefill="")
    kw = dict(max_new_tokens=4, temperature=1.2, seed=5)
    _seed_cache_with(llm, chat, 1, "STORED", **kw)
    asked: list = []
    real = inner.generate_samples

    def spy(chats, sample_ids, **k):
        asked.append([list(s) for s in sample_ids])
        return real(chats, sample_ids, **k)

    inner.generate_samples = spy
    try:
        first = llm.generate([chat], num_samples=3, **kw)[0]
        again = llm.generate([chat], num_samples=3, **kw)[0]
    finally:
        del inner.generate_samples
    assert asked == [[[0, 2]]]  # sample 1 was not redrawn, and the rerun asked nothing
    assert first[1].text == "STORED" and again == first
    fresh = inner.generate([chat], num_samples=3, **kw)[0]
    assert [first[0], first[2]] == [fresh[0], fresh[2]]
    assert llm.cost.total.cached_calls == 1


class _PlainLLM:
    """A backend with only the protocol methods (no generate_samples)."""

    def __init__(self, llm):
        self._llm, self.identity, self.cost = llm, llm.identity, llm.cost
        self.num_samples_asked: list[int] = []

    def generate(self, chats, **kw):
        self.num_samples_asked.append(kw.get("num_samples", 1))
        return self._llm.generate(chats, **kw)

    def label_logprobs(self, chats, labels, **kw):
        return self._llm.label_logprobs(chats, labels, **kw)


def test_partly_cached_row_without_indexed_sampling(tiny_llm, tmp_path):
    plain = _PlainLLM(tiny_llm)
    llm = CachedLLM(plain, CallCache(tmp_path / "f.sqlite"))
    chat = mcq_chat(QS[1], prefill="")
    kw = dict(max_new_tokens=4, temperature=1.2, seed=6)
    _seed_cache_with(llm, chat, 0, "STORED", **kw)
    out = llm.generate([chat], num_samples=2, **kw)[0]
    assert plain.num_samples_asked == [2]  # drew samples 0..1, kept only the missing one
    assert out[0].text == "STORED"
    assert out[1] == tiny_llm.generate([chat], num_samples=2, **kw)[0][1]
    assert llm.generate([chat], num_samples=2, **kw)[0] == out and plain.num_samples_asked == [2]


def test_concurrent_writers_in_separate_processes(tmp_path):
    import json
    import multiprocessing as mp

    from llm_helpers import cache_writer

    ctx = mp.get_context("spawn")
    path, n, w = str(tmp_path / "procs.sqlite"), 60, 3
    barrier = ctx.Barrier(w)
    procs = [ctx.Process(target=cache_writer, args=(path, k, n, barrier, str(tmp_path / f"seen{k}.json"))) for k in range(w)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    assert [p.exitcode for p in procs] == [0] * w
    cache = CallCache(path)
    assert len(cache) == n
    stored = {i: cache.get_many([CallCache.key("m", "k", {"i": i})])[CallCache.key("m", "k", {"i": i})] for i in range(n)}
    assert all(stored[i]["v"] == i for i in range(n))
    # every process read back the first-written value of each key, never its own overwrite
    for k in range(w):
        seen = {int(i): v for i, v in json.loads((tmp_path / f"seen{k}.json").read_text()).items()}
        assert seen == stored


def test_concurrent_writers_share_one_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            cache = CallCache(path)  # one connection per writer, as separate processes would have
            for i in range(40):
                key = CallCache.key("m", "k", {"i": i})
                cache.put_many([(key, "m", "k", {"i": i}, {"v": i, "writer": w})])
                assert cache.get_many([key])[key]["v"] == i
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    cache = CallCache(path)
    assert len(cache) == 40
    got = cache.get_many([CallCache.key("m", "k", {"i": i}) for i in range(40)])
    assert sorted(v["v"] for v in got.values()) == list(range(40))


def test_key_depends_on_every_part():
    base = CallCache.key("m", "generate", {"chat": [{"role": "user", "content": "x"}], "t": 0})
    assert base == CallCache.key("m", "generate", {"t": 0, "chat": [{"content": "x", "role": "user"}]})
    assert base != CallCache.key("m2", "generate", {"chat": [{"role": "user", "content": "x"}], "t": 0})
    assert base != CallCache.key("m", "label_logprobs", {"chat": [{"role": "user", "content": "x"}], "t": 0})
    assert base != CallCache.key("m", "generate", {"chat": [{"role": "user", "content": "x "}], "t": 0})
