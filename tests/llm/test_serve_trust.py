"""Issue 34 item 6: the server's second trust pass -- two different
``Content-Length`` headers are 400, an unknown ``model`` name is 404 (as
OpenAI and vLLM answer; the served name and no name still work),
``logit_bias`` is honoured (or 400 naming a bad entry), and a NaN in the
model's logits while generating is an error, never text: in the local
backend, in the server (500 naming it) and in a generation-only eval (the
question fails). A tiny random-weight Llama built in code, served in-process
on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.base import GenerationParams  # noqa: E402
from rcn_fast.llm.backends.logits import NonFiniteLogitsError  # noqa: E402
from tests.llm.test_serve_faults import error_of, raw, request, serve  # noqa: E402

TEXT = "Knowledge connects concepts."


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return load_llm(tiny_llama_dir, batch_size=3, device="cpu")


@contextlib.contextmanager
def nan_logits(llm, at_call: int = 0):
    """The model's logits turn NaN from its ``at_call``-th forward pass on."""
    calls = {"n": 0}

    def post(module: Any, args: Any, out: Any) -> None:
        calls["n"] += 1
        if calls["n"] > at_call:
            out.logits[..., 3] = float("nan")

    h = llm.model.register_forward_hook(post)
    try:
        yield
    finally:
        h.remove()


# ------------------------------------------------------------ Content-Length
def test_two_different_content_length_headers_are_400(llm):
    body = json.dumps({"model": "tiny", "prompt": TEXT, "max_tokens": 1}).encode()
    n = str(len(body)).encode()
    with serve(llm) as srv:
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + n + b"\r\nContent-Length: 2"
                  b"\r\n\r\n" + body)
        assert out.startswith(b"HTTP/1.1 400") and b"different values" in out, out[:300]
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: " + n
                  + b"\r\n\r\n" + body)
        assert out.startswith(b"HTTP/1.1 400"), out[:300]
        # the same value twice is one length (RFC 9112 allows a recipient to accept it)
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + n + b"\r\nContent-Length: "
                  + n + b"\r\nConnection: close\r\n\r\n" + body)
        assert out.startswith(b"HTTP/1.1 200"), out[:300]


# ------------------------------------------------------------ model names
def test_an_unknown_model_name_is_404_and_the_served_name_or_none_works(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:
        for route, body in (("/v1/completions", {"prompt": ids, "max_tokens": 1}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}],
                                                      "max_tokens": 1})):
            status, _, out = request(srv, "POST", route, {"model": "gpt-4o", **body})
            assert "`gpt-4o` does not exist" in error_of(status, out, 404) and "'tiny'" in out["error"]["message"]
            status, _, out = request(srv, "POST", route, {"model": 5, **body})
            assert error_of(status, out, 400).startswith("model:")
            status, _, out = request(srv, "POST", route, {"model": "tiny", **body})
            assert status == 200 and out["model"] == "tiny"
            status, _, out = request(srv, "POST", route, body)  # no model: the served one (as vLLM)
            assert status == 200
        status, _, out = request(srv, "GET", "/v1/models")
        assert [m["id"] for m in out["data"]] == ["tiny"]


def test_the_client_is_told_the_name_is_not_served(llm):
    from rcn_fast.llm.preflight import PreflightError, preflight

    with serve(llm) as srv:
        with pytest.raises(PreflightError, match=r"'other'"):
            preflight(load_llm(f"openai:{srv.base_url}#other", backoff=0.0, max_retries=0))


# ------------------------------------------------------------ logit_bias
def _greedy_text(srv, ids: list[int], bias: dict | None = None, n: int = 3) -> str:
    body = {"model": "tiny", "prompt": ids, "max_tokens": n, "temperature": 0}
    if bias is not None:
        body["logit_bias"] = bias
    status, _, out = request(srv, "POST", "/v1/completions", body)
    assert status == 200, out
    return out["choices"][0]["text"]


def test_logit_bias_is_honoured(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    plain = llm.generate_ids([ids], GenerationParams(max_new_tokens=3, temperature=0.0))[0][0]
    forced_id = next(t for t in range(10, 60) if llm.tokenizer.decode([t]).strip()
                     and t not in llm.eos_ids and t != llm.pad_id)
    forced = llm.generate_ids([ids], GenerationParams(max_new_tokens=3, temperature=0.0),
                              logit_bias={forced_id: 100.0})[0][0]
    assert forced.text == llm.tokenizer.decode([forced_id] * 3) != plain.text
    with serve(llm) as srv:
        assert _greedy_text(srv, ids) == plain.text
        assert _greedy_text(srv, ids, {str(forced_id): 100}) == forced.text
        # banning the greedy first token changes the answer
        first = llm.tokenizer.encode(plain.text, add_special_tokens=False)[0]
        assert _greedy_text(srv, ids, {str(first): -100}) != plain.text
        # sampling is biased too
        body = {"model": "tiny", "prompt": ids, "max_tokens": 2, "temperature": 1.0, "seed": 3,
                "logit_bias": {str(forced_id): 100}}
        status, _, out = request(srv, "POST", "/v1/completions", body)
        assert status == 200 and out["choices"][0]["text"] == llm.tokenizer.decode([forced_id] * 2)


@pytest.mark.parametrize("bias, what", [
    ([1, 2], "expected a mapping"), ({"x": 1}, "is not a token id"), ({"-1": 1}, "is not a token id"),
    ({"99999999": 1}, "is not a token id"), ({"5": 101}, "expected a number in"),
    ({"5": float("nan")}, "expected a number in"), ({"5": "high"}, "expected a number in"),
    ({"5": True}, "expected a number in"),
])
def test_a_bad_logit_bias_is_400_naming_it(llm, bias, what):
    with serve(llm) as srv:
        for route, body in (("/v1/completions", {"prompt": TEXT}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}]})):
            raw_body = json.dumps({"model": "tiny", "max_tokens": 1, "logit_bias": bias, **body}).encode()
            status, _, out = request(srv, "POST", route, raw_body)
            msg = error_of(status, out, 400)
            assert msg.startswith("logit_bias") and what in msg, msg


# ------------------------------------------------------------ NaN while generating
def test_nan_logits_in_generation_are_an_error_not_text(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    for params in (GenerationParams(max_new_tokens=4, temperature=0.0),
                   GenerationParams(max_new_tokens=4, temperature=0.8, seed=1)):
        with nan_logits(llm, at_call=2), pytest.raises(NonFiniteLogitsError, match=r"hf:.*generated token 2 are "
                                                                                   r"NaN, \+inf or all -inf"):
            llm.generate_ids([ids, ids], params)
        assert llm.generate_ids([ids], params)[0][0].generated_tokens == 4  # fine again without the fault
    with nan_logits(llm), pytest.raises(NonFiniteLogitsError):
        llm.generate([[{"role": "user", "content": TEXT}]], max_new_tokens=2)


def test_the_server_answers_nan_logits_with_500_naming_them(llm):
    with serve(llm) as srv, nan_logits(llm):
        status, _, out = request(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": TEXT, "max_tokens": 2})
        assert "NonFiniteLogitsError" in error_of(status, out, 500) and "NaN" in out["error"]["message"]


def test_a_generation_only_eval_counts_nan_questions_as_failed(tiny_llama_dir, tmp_path):
    from rcn_fast.eval import EvalConfig, evaluate
    from rcn_fast.llm.cache import CallCache
    from tests.test_eval import write_questions

    q = write_questions(tmp_path / "q.jsonl", n=2)
    gen = load_llm(tiny_llama_dir, batch_size=3, device="cpu")
    # self-consistency with fallback "first" only generates (no label scoring)
    settings = {"num_paths": 1, "fallback": "first", "max_new_tokens": 4, "num_examples": 0}
    cfg = EvalConfig(tasks=[str(q)], pipelines=["self_consistency"], pipeline_args=settings, progress=False,
                     plot=False, device="cpu", output_path=str(tmp_path / "out"))
    with nan_logits(gen):
        doc = evaluate(cfg, llm=gen, print_table=False)
    res = doc["results"]["q"]["self_consistency"]
    assert res["n_failed"] == 2 and res["n"] == 0
    assert all("NonFiniteLogitsError" in f["error"] for f in doc["failures"])
    assert len(CallCache(tmp_path / "out")) == 0  # nothing cached
