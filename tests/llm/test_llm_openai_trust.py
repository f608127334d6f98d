"""The OpenAI client against servers that misbehave (a scripted stub on
127.0.0.1) and against a model swapped behind the same name and port
(rcn_fast.llm.server.app): unusable log-probs fail their question and are never
cached, answers of the wrong shape are ServerErrors naming the field, and
the cache's identity sees what the server says about its model."""

from __future__ import annotations

import numpy as np
import pytest

from stub_server import INF, LETTERS, NAN, StubServer, chat_answer, well_behaved

from rcn_fast.llm import load_llm
from rcn_fast.llm.cache import CachedLLM, CallCache
from rcn_fast.llm.openai.client import ServerError
from rcn_fast.llm.scoring.choice import LabelScoreError

USER = [{"role": "user", "content": "Pick a letter."}]
PREFILLED = [*USER, {"role": "assistant", "content": "Answer: "}]


def client(srv: StubServer, name: str = "x", **kw):
    kw.setdefault("backoff", 0.0)
    kw.setdefault("max_retries", 2)
    return load_llm(f"openai:{srv.base_url}#{name}", **kw)


# ------------------------------------------------------------ 26.6: unusable log-probs


@pytest.mark.parametrize("bad", [NAN, INF, 0.5])
def test_unusable_chat_top_logprobs_fail_the_question_and_are_not_cached(bad, tmp_path):
    top = {"A": bad, "B": -1.0, "C": -2.0}
    with StubServer(well_behaved(top=top)) as srv:
        cache = CallCache(tmp_path)
        llm = CachedLLM(client(srv), cache)
        with pytest.raises(LabelScoreError, match=r"openai:http://127\.0\.0\.1:\d+/v1#x.*question 'q7'.*label 'A'"):
            llm.label_logprobs([PREFILLED], ["A", "B", "C"], tags=["q7"])
        assert len(cache) == 0
        # a usable answer is scored and cached as before
        srv.handler = well_behaved(top={"A": -0.5, "B": -1.0, "C": -2.0})
        llm2 = CachedLLM(client(srv), cache)
        lp = llm2.label_logprobs([PREFILLED], ["A", "B", "C"], tags=["q7"])
        assert np.all(np.isfinite(lp)) and len(cache) == 1


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from llm_helpers import build_tokenizer

    path = tmp_path_factory.mktemp("stub-tok")
    build_tokenizer().save_pretrained(path)
    return path


def _completions_stub(top: dict[str, float]):
    """Token-id prompts with prompt log-probs (echo) and next-token top log-probs ``top``."""
    def handle(method, route, body):
        if method == "GET":
            return 200, {"object": "list", "data": [{"id": "x", "owned_by": "stub"}]}, {}
        if route != "/completions":
            return 404, {"error": {"message": "no route"}}, {}
        prompt = body["prompt"]
        prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]
        choices = []
        for i, p in enumerate(prompts):
            if body.get("echo"):
                # the prompt's tokens (None first, -0.1 for the last), then the generated token's
                lp = {"token_logprobs": [None] + [-1.5] * (len(p) - 2) + [-0.1, -0.2], "top_logprobs": None}
            else:
                lp = {"top_logprobs": [top]}
            choices.append({"index": i, "text": "A", "logprobs": lp})
        return 200, {"choices": choices}, {}
    return handle


@pytest.mark.parametrize("scoring", ["auto", "top_logprobs"])
@pytest.mark.parametrize("bad", [NAN, INF, 0.25])
def test_unusable_completion_top_logprobs_fail_the_question(scoring, bad, tok_dir, tmp_path):
    """``_top_completion`` read by the exact path's first step (auto) and by the fallback."""
    top = {"A": bad, " A": -3.0, "B": -1.0, " B": -4.0}
    with StubServer(_completions_stub(top)) as srv:
        cache = CallCache(tmp_path)
        llm = CachedLLM(client(srv, tokenizer=str(tok_dir), label_scoring=scoring), cache)
        with pytest.raises(LabelScoreError, match=r"openai:.*question 'q0' \(chats\[0\]\).*label 'A'"):
            llm.label_logprobs([PREFILLED, [*USER, {"role": "assistant", "content": "So: "}]], ["A", "B"],
                               tags=["q0", "q1"])
        assert len(cache) == 0


@pytest.mark.parametrize("bad", [NAN, 0.3])
def test_unusable_prompt_logprobs_of_the_exact_path_fail_the_question(bad, tok_dir, tmp_path):
    """A spelling outside the top log-probs is read from the prompt log-prob of ``prefix + [token]``."""
    base = _completions_stub({"B": -1.0, " B": -2.0})  # no spelling of A in the top: A comes from prompt log-probs

    def handle(method, route, body):
        status, payload, headers = base(method, route, body)
        if body and body.get("echo"):
            for c in payload["choices"]:
                c["logprobs"]["token_logprobs"][-2] = bad  # the label token's, the last of the prompt
        return status, payload, headers

    with StubServer(handle) as srv:
        cache = CallCache(tmp_path)
        llm = CachedLLM(client(srv, tokenizer=str(tok_dir)), cache)
        with pytest.raises(LabelScoreError, match=r"question 'q5'.*label 'A'"):
            llm.label_logprobs([PREFILLED], ["A", "B"], tags=["q5"])
        assert len(cache) == 0


def test_a_stored_nan_row_is_quarantined_and_asked_again(tmp_path):
    with StubServer(well_behaved(top={"A": -0.5, "B": -1.0})) as srv:
        cache = CallCache(tmp_path)
        llm = CachedLLM(client(srv), cache)
        key = cache.key(llm.identity, "label_logprobs", {"chat": PREFILLED, "labels": ["A", "B"]})
        cache.put_many([(key, llm.identity, "label_logprobs", {}, {"logprobs": [NAN, -0.1], "prompt_tokens": 3})])
        lp = llm.label_logprobs([PREFILLED], ["A", "B"])
        assert np.all(np.isfinite(lp))
        assert cache.misses == 1 and cache.hits == 0


# ------------------------------------------------------------ 26.11: answers of the wrong shape


def test_retry_after_minus_one_is_no_hint():
    calls = {"n": 0}
    base = well_behaved()

    def handle(method, route, body):
        if route == "/chat/completions":
            calls["n"] += 1
            if calls["n"] == 1:
                return 503, {"error": {"message": "busy"}}, {"Retry-After": "-1"}
        return base(method, route, body)

    with StubServer(handle) as srv:
        llm = client(srv)
        out = llm.generate([USER], max_new_tokens=1)
        assert out[0][0].text == "A" and llm.retries == 1


@pytest.mark.parametrize("payload, field", [
    ([1, 2], "JSON list"),
    ("text", "JSON str"),
])
def test_an_answer_that_is_not_an_object_is_a_server_error(payload, field):
    def handle(method, route, body):
        if method == "GET":
            return 200, {"data": [{"id": "x"}]}, {}
        return 200, payload, {}

    with StubServer(handle) as srv:
        with pytest.raises(ServerError, match=field):  # the pre-fill probe reads usage of the answer
            client(srv).generate([PREFILLED], max_new_tokens=1)
        with pytest.raises(ServerError, match=field):
            client(srv).label_logprobs([USER], ["A", "B"])


@pytest.mark.parametrize("entry, field", [
    ({"token": "A", "logprob": "-0.5"}, r"top_logprobs\[0\]\.logprob is '-0\.5' \(str\), expected a number"),
    ({"token": "A", "logprob": "abc"}, r"top_logprobs\[0\]\.logprob is 'abc'"),
    ({"logprob": -0.5}, r"top_logprobs\[0\] has no string 'token'"),
    ({"token": "A"}, r"top_logprobs\[0\] has no 'logprob'"),
    ("A", r"top_logprobs\[0\] has no string 'token'"),
])
def test_a_malformed_top_logprobs_entry_is_a_server_error_naming_the_field(entry, field):
    def handle(method, route, body):
        if method == "GET":
            return 200, {"data": [{"id": "x"}]}, {}
        ans = chat_answer({"B": -1.0})
        ans["choices"][0]["logprobs"]["content"][0]["top_logprobs"].insert(0, entry)
        return 200, ans, {}

    with StubServer(handle) as srv:
        with pytest.raises(ServerError, match=field):
            client(srv).label_logprobs([USER], ["A", "B"])


def test_a_string_completion_logprob_is_a_server_error(tok_dir):
    with StubServer(_completions_stub({"A": "-0.5", "B": -1.0})) as srv:
        with pytest.raises(ServerError, match=r"logprobs\.top_logprobs\[0\]\['A'\] is '-0\.5'"):
            client(srv, tokenizer=str(tok_dir), label_scoring="top_logprobs").label_logprobs([PREFILLED], ["A", "B"])


# ------------------------------------------------------------ 26.5: the served model's identity


def test_identity_covers_the_models_entry_and_ignores_volatile_fields():
    def with_root(root: str, created: int):
        return well_behaved(models=[{"id": "x", "root": root, "owned_by": "vllm", "max_model_len": 4096,
                                     "created": created, "permission": [{"id": f"p{created}"}]}])

    with StubServer(with_root("/models/a", 1)) as srv:
        a = client(srv).identity
        srv.handler = with_root("/models/a", 2)  # another answer of the same server
        assert client(srv).identity == a
        srv.handler = with_root("/models/b", 3)  # another model behind the same name
        assert client(srv).identity != a


def test_identity_covers_a_probe_of_the_model():
    with StubServer(well_behaved(top={"A": -1.0, "B": -2.0})) as srv:
        a = client(srv).identity
        srv.handler = well_behaved(top={"A": -1.02, "B": -2.01})  # noise of the same model
        assert client(srv).identity == a
        srv.handler = well_behaved(top={"B": -1.0, "A": -2.0})  # another model, same /v1/models entry
        assert client(srv).identity != a


def test_identity_is_asked_once_per_client():
    with StubServer(well_behaved()) as srv:
        llm = client(srv)
        first = llm.identity
        n = len(srv.requests)
        assert llm.identity == first and len(srv.requests) == n


def test_a_model_swapped_behind_the_same_name_and_port_is_not_served_from_the_cache(tiny_llm, tiny_llama_dir,
                                                                                   tmp_path):
    """The issue's case: the same URL and name, another model after a
    restart, and a rerun with the same cache must answer with the new model."""
    import torch

    from llm_helpers import build_model, build_tokenizer, mcq_chat

    from rcn_fast.llm.server.app import make_server

    tok = build_tokenizer()
    other = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    with torch.no_grad():
        other.lm_head.weight.mul_(-1.0)
    other_llm = load_llm((other, tok))
    chats = [mcq_chat("2 + 2? A. 4 B. 5 C. 6")]
    labels = ["A", "B", "C"]
    cache = CallCache(tmp_path)

    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name="tiny")
    srv.start()
    port = srv.server_address[1]
    try:
        first = CachedLLM(load_llm(f"openai:{srv.base_url}#tiny", backoff=0.01, tokenizer=str(tiny_llama_dir)), cache)
        lp_a = first.label_logprobs(chats, labels)
        ident_a = first.identity
    finally:
        srv.shutdown()
        srv.server_close()
    srv = make_server(other_llm, "127.0.0.1", port, model_name="tiny")
    srv.start()
    try:
        second = CachedLLM(load_llm(f"openai:{srv.base_url}#tiny", backoff=0.01, tokenizer=str(tiny_llama_dir)), cache)
        assert second.identity != ident_a
        lp_b = second.label_logprobs(chats, labels)
    finally:
        srv.shutdown()
        srv.server_close()
    assert cache.hits == 0
    assert not np.allclose(lp_a, lp_b, atol=1e-3)
    np.testing.assert_allclose(lp_b, other_llm.label_logprobs(chats, labels), atol=0.05)
