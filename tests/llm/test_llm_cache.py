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
    a = llm.generate(chats, max_new_tokens=4, temperature=1.0, num_samples=2, seed=3)
    calls = inner.cost.total.calls
    b = llm.generate(chats, max_new_tokens=4, temperature=1.0, num_samples=2, seed=3)
    assert inner.cost.total.calls == calls
    assert [[g.to_dict() for g in r] for r in a] == [[g.to_dict() for g in r] for r in b]
    # another seed, more samples or another max_new_tokens reach the model
    llm.generate(chats, max_new_tokens=4, temperature=1.0, num_samples=2, seed=4)
    assert inner.cost.total.calls == calls + 2
    llm.generate(chats, max_new_tokens=4, temperature=1.0, num_samples=3, seed=3)
    assert inner.cost.total.calls == calls + 4
    g = llm.generate(chats, max_new_tokens=3)
    assert llm.generate(chats, max_new_tokens=3)[0][0] == g[0][0]
    assert llm.cost.total.generated_tokens > 0 and llm.cost.total.cached_calls == 2 + 2


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
