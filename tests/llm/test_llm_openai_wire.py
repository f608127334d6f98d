"""What the OpenAI-compatible client sends, pinned byte for byte: the
``identity`` string (the call cache and the eval's checkpoints key on it)
and every request body of a scripted server, in token-id (``/completions``)
and chat modes, for generation and for label scoring (exact, the vLLM
prompt log-probs field, and the top-log-probs escalation).

The golden file ``openai_wire_golden.json`` was written by the client
before it was split into transport, dialect and capabilities (issue 28);
a refactor must leave it unchanged. Set ``RCN_WRITE_WIRE_GOLDEN=1`` to
rewrite it after a deliberate change of the wire format (and say so: old
call caches and checkpoints stop matching when ``identity`` changes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from llm_helpers import build_tokenizer, mcq_chat  # noqa: E402
from stub_server import StubServer  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402

GOLDEN = Path(__file__).with_name("openai_wire_golden.json")
#: Next-token top log-probs of every answer: some label spellings are here, the rest need prompt log-probs.
TOP = {"A": -0.7, " B": -1.9, "C": -2.3, " x": -3.0, "\n": -3.5, " D": -4.2}
CHATS = [mcq_chat("Where is a plate kept? A. cupboard B. floor C. oven"), mcq_chat("2 + 2? A. 4 B. 5")]
PREFILLED = [{"role": "user", "content": "2 + 2? A. 4 B. 5"}, {"role": "assistant", "content": "Answer:"}]
LABELS = [["A", "B", "C"], ["A", "B"]]


def _prompts(prompt: Any) -> list[Any]:
    return prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]


def _handler(method: str, route: str, body: Any) -> tuple[int, Any, dict[str, str]]:
    """A deterministic vLLM-like server: token-id and list prompts, echo and
    ``prompt_logprobs`` prompt log-probs, top log-probs capped at 6 entries."""
    if method == "GET" and route == "/models":
        return 200, {"object": "list", "data": [{"id": "tiny", "object": "model", "root": "/models/tiny",
                                                 "max_model_len": 512, "created": 1}]}, {}
    if route == "/completions":
        choices, n_tok = [], 0
        for i, p in enumerate(_prompts(body["prompt"])):
            n = len(p) if isinstance(p, list) else len(p.split())
            n_tok += n
            c: dict[str, Any] = {"index": i, "text": f"ok{i}", "finish_reason": "length"}
            k = body.get("logprobs")
            if body.get("echo"):
                c["logprobs"] = {"token_logprobs": [None] + [-3.0 - 0.01 * j for j in range(1, n)] + [-1.0],
                                 "top_logprobs": [None] * n + [dict(TOP)]}
            elif isinstance(k, int) and k:
                c["logprobs"] = {"top_logprobs": [dict(list(TOP.items())[:k])]}
            if body.get("prompt_logprobs") is not None and isinstance(p, list):
                c["prompt_logprobs"] = [None] + [{str(t): {"logprob": -3.5 - 0.01 * j}} for j, t in enumerate(p[1:])]
            choices.append(c)
        return 200, {"choices": choices, "usage": {"prompt_tokens": n_tok, "completion_tokens": len(choices)}}, {}
    if route == "/chat/completions":
        n = 10 if body.get("continue_final_message") else 12
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": "A"}, "finish_reason": "stop"}
        if body.get("logprobs"):
            k = body.get("top_logprobs") or 0
            choice["logprobs"] = {"content": [{"token": "A", "logprob": -0.7, "top_logprobs": [
                {"token": t, "logprob": v} for t, v in list(TOP.items())[:k]]}]}
        return 200, {"choices": [choice], "usage": {"prompt_tokens": n, "completion_tokens": 1}}, {}
    return 404, {"error": {"message": f"no route {route}"}}, {}


def _phase(srv: StubServer, url: str, fn) -> dict[str, Any]:
    srv.requests.clear()
    out = fn()
    reqs = sorted(json.dumps([m, r, b], sort_keys=True) for m, r, b in srv.requests)  # threads: order varies
    return {"result": out, "requests": reqs}


def _record() -> dict[str, Any]:
    tok_dir = "tok"  # relative to the test's working folder: the identity digests cover this string
    build_tokenizer().save_pretrained(tok_dir)
    got: dict[str, Any] = {}
    with StubServer(_handler) as srv:
        url = srv.base_url

        def client(**kw: Any) -> Any:
            return load_llm(f"openai:{url}#tiny", backoff=0.01, **kw)

        def scores(llm: Any, chats: Any, labels: Any) -> list[list[float]]:
            return [[round(float(v), 5) for v in row] for row in llm.label_logprobs(chats, labels).tolist()]

        def gens(llm: Any, chats: Any) -> list[list[str]]:
            res = llm.generate(chats, max_new_tokens=3, temperature=0.7, top_p=0.9, num_samples=2, seed=5,
                               stop=["\n"])
            return [[(g.text, g.prompt_tokens, g.generated_tokens, g.finish_reason) for g in row] for row in res]

        cases = {
            "tokens": dict(tokenizer=tok_dir),
            "tokens_vllm_field": dict(tokenizer=tok_dir, prompt_logprobs_field="vllm", prompts_per_request=2),
            "tokens_top": dict(tokenizer=tok_dir, label_scoring="top_logprobs", top_logprobs=2,
                               max_top_logprobs=16, extra_body={"repetition_penalty": 1.1}),
            "chat": dict(mode="chat"),
        }
        for name, kw in cases.items():
            llm = client(**kw)
            got[name] = {"config_identity": llm.config_identity.replace(url, "URL"),
                         "identity": _phase(srv, url, lambda: llm.identity.replace(url, "URL"))}
            if name == "tokens_top":
                got[name]["scores"] = _phase(srv, url, lambda: scores(llm, CHATS, [["A", "B"], ["A", "C"]]))
            else:
                got[name]["scores"] = _phase(srv, url, lambda: scores(llm, CHATS + [PREFILLED], LABELS + [["A", "B"]]))
                got[name]["generate"] = _phase(srv, url, lambda: gens(llm, [CHATS[0], PREFILLED]))
            llm.close()
    return json.loads(json.dumps(got))


def test_identity_and_request_bodies_are_pinned(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = _record()
    if os.environ.get("RCN_WRITE_WIRE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    for case in want:
        assert got[case]["config_identity"] == want[case]["config_identity"], case
        for phase in ("identity", "scores", "generate"):
            if phase in want[case]:
                assert got[case][phase]["requests"] == want[case][phase]["requests"], (case, phase)
                assert got[case][phase]["result"] == want[case][phase]["result"], (case, phase)
    assert got == want
