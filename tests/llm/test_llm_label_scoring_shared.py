"""The OpenAI-compatible client and the vLLM engine score labels with one
function (:func:`rcn_fast.llm.scoring.served.exact_label_scores`, issue 28
item 3): given the same next-token and prompt log-probs -- a scripted
HTTP server and a fake ``vllm`` module answering from one table -- both
call it, ask it for the same prompt log-probs and get the same scores."""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")

from llm_helpers import build_tokenizer, mcq_chat  # noqa: E402
from stub_server import StubServer  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.scoring import served as label_scoring  # noqa: E402

K = 5  # top log-probs both backends read first
CHATS = [mcq_chat("Where is a plate kept? A. cupboard B. floor C. oven"), mcq_chat("2 + 2? A. 4 B. 5")]
LABELS = [["A", "B", "C"], ["A", "B"]]


def _table(tok: Any) -> list[float]:
    """log p(t) of every token, whatever the prefix: "A" and " B" likeliest."""
    scores = [-0.01 * t for t in range(len(tok))]
    scores[tok.convert_tokens_to_ids("A")] = 5.0
    scores[tok.convert_tokens_to_ids("\u0120B")] = 4.0
    z = math.log(sum(math.exp(s) for s in scores))
    return [s - z for s in scores]


def _top(lp: list[float], k: int) -> list[int]:
    return sorted(range(len(lp)), key=lambda t: -lp[t])[:k]


class _LP:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


def _fake_vllm(tok: Any, lp: list[float]) -> types.ModuleType:
    class SamplingParams:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    class LLM:
        def __init__(self, model: str, **kw: Any) -> None:
            pass

        def get_tokenizer(self) -> Any:
            return tok

        def generate(self, prompts: list[dict], sp: SamplingParams, use_tqdm: bool = True) -> list[Any]:
            outs = []
            for p in prompts:
                ids = p["prompt_token_ids"]
                top = [{t: _LP(lp[t]) for t in _top(lp, sp.kw["logprobs"])}] if sp.kw.get("logprobs") else None
                pl = [None] + [{t: _LP(lp[t])} for t in ids[1:]] if sp.kw.get("prompt_logprobs") == 0 else None
                out = types.SimpleNamespace(text="", token_ids=[0], logprobs=top, finish_reason="length")
                outs.append(types.SimpleNamespace(outputs=[out], prompt_logprobs=pl))
            return outs

    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    return mod


def _handler(tok: Any, lp: list[float]):
    def handle(method: str, route: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if route != "/completions":
            return 404, {"error": {"message": "no route"}}, {}
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        choices = []
        for i, p in enumerate(prompts):
            c: dict[str, Any] = {"index": i, "text": "", "finish_reason": "length"}
            if body.get("echo"):
                c["logprobs"] = {"token_logprobs": [None] + [lp[t] for t in p[1:]] + [-1.0]}
            elif body.get("logprobs"):
                c["logprobs"] = {"top_logprobs": [{tok.decode([t]): lp[t] for t in _top(lp, body["logprobs"])}]}
            choices.append(c)
        return 200, {"choices": choices, "usage": {"prompt_tokens": sum(map(len, prompts))}}, {}

    return handle


def test_openai_and_vllm_score_labels_with_the_same_function(tmp_path, monkeypatch):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    lp = _table(tok)
    calls: list[dict[str, Any]] = []
    real = label_scoring.exact_label_scores

    def spy(spell, tops, prompt_logprobs):
        asked: list[list[tuple[int, int]]] = []

        def recorded(pairs):
            asked.append(list(pairs))
            return prompt_logprobs(pairs)

        out = real(spell, tops, recorded)
        calls.append({"spell": spell, "asked": asked, "out": out})
        return out

    monkeypatch.setattr(label_scoring, "exact_label_scores", spy)
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(tok, lp))
    vllm_scores = load_llm("vllm:fake", top_logprobs=K).label_logprobs(CHATS, LABELS)
    with StubServer(_handler(tok, lp)) as srv:
        client = load_llm(f"openai:{srv.base_url}#tiny", tokenizer=str(tmp_path / "tok"), top_logprobs=K,
                          backoff=0.01)
        openai_scores = client.label_logprobs(CHATS, LABELS)
        client.close()
    assert len(calls) == 2  # one call each, to the one function
    v, o = calls
    assert v["spell"] == o["spell"] and v["asked"] == o["asked"] and v["out"] == o["out"]
    assert v["asked"] and len(v["asked"][0]) < sum(len(ts) for row in v["spell"] for ts in row)  # some from the top
    np.testing.assert_array_equal(vllm_scores, openai_scores)
    # and the scores are the logsumexp of each label's spellings, log-softmaxed over the labels
    for b, row in enumerate(v["spell"]):
        raw = [math.log(sum(math.exp(lp[t]) for t in ts)) for ts in row]
        z = math.log(sum(math.exp(x) for x in raw))
        np.testing.assert_allclose(openai_scores[b, : len(row)], [x - z for x in raw], rtol=1e-5)
