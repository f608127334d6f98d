"""The OpenAI-compatible backend against a real HTTP server on 127.0.0.1
(rcn_fast.llm.serve over the local backend and a tiny real model)."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.openai import OpenAIConfig, OpenAILLM, ServerError  # noqa: E402
from rcn_fast.llm.seeded import sample_seed  # noqa: E402
from rcn_fast.llm.serve import make_server  # noqa: E402

QS = ["Where is a plate kept? A. cupboard B. floor C. oven", "2 + 2? A. 4 B. 5", "Colour? A. blue B. dog C. red D. car"]
LABELS = [["A", "B", "C"], ["A", "B"], ["A", "B", "C", "D"]]


@pytest.fixture(scope="module")
def server(tiny_llm):
    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name="tiny")
    srv.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def client(server, **kw) -> OpenAILLM:
    kw.setdefault("top_logprobs", len(server.llm.tokenizer))
    kw.setdefault("backoff", 0.01)
    return load_llm(f"openai:{server.base_url}#tiny", **kw)


def test_models_endpoint(server):
    with urllib.request.urlopen(server.base_url + "/models", timeout=10) as r:
        body = json.loads(r.read())
    assert body["data"][0]["id"] == "tiny"


def test_label_logprobs_match_local_backend(server, tiny_llm):
    llm = client(server)
    chats = [mcq_chat(q) for q in QS]
    got = llm.label_logprobs(chats, LABELS, tags=["a", "b", "c"])
    ref = tiny_llm.label_logprobs(chats, LABELS)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    lens = [len(x) for x in tiny_llm.encode_chats(chats)]
    assert llm.cost.total.calls == 3 and llm.cost.total.prompt_tokens == sum(lens)


def test_generate_matches_local_backend_chat_and_completions(server, tiny_llm, tiny_llama_dir):
    chats = [mcq_chat(q, prefill="Explanations:\n* ") for q in QS] + [[{"role": "user", "content": QS[0]}]]
    ref = tiny_llm.generate(chats, max_new_tokens=5)
    for mode in ("chat", "completions"):
        extra = {"tokenizer": str(tiny_llama_dir)} if mode == "completions" else {}
        got = client(server, mode=mode, concurrency=3, **extra).generate(chats, max_new_tokens=5)
        assert [g[0].text for g in got] == [g[0].text for g in ref], mode
        assert [g[0].generated_tokens for g in got] == [g[0].generated_tokens for g in ref]
        assert [g[0].prompt_tokens for g in got] == [g[0].prompt_tokens for g in ref]
        assert [g[0].finish_reason for g in got] == [g[0].finish_reason for g in ref]


def test_retries_on_server_errors_and_dropped_connections(server, tiny_llm):
    chats = [mcq_chat(q) for q in QS]
    clean = client(server, concurrency=1).label_logprobs(chats, LABELS)
    gens_clean = client(server, concurrency=1).generate(chats[:1], max_new_tokens=4)
    server.faults = ["500", "drop", "429", "503", "drop"]
    llm = client(server, concurrency=1)
    faulty = llm.label_logprobs(chats, LABELS)
    gens = llm.generate(chats[:1], max_new_tokens=4)
    assert llm.retries == 5 and server.faults == []
    np.testing.assert_array_equal(faulty, clean)
    assert gens[0][0] == gens_clean[0][0]


def test_retries_after_a_response_slower_than_the_timeout(server):
    chats = [mcq_chat(q) for q in QS[:2]]
    clean = client(server, concurrency=1).label_logprobs(chats, LABELS[:2])
    gens_clean = client(server, concurrency=1).generate(chats[:1], max_new_tokens=3)
    server.faults = ["slow:2.5", "slow:2.5"]
    llm = client(server, concurrency=1, timeout=0.75)
    try:
        faulty = llm.label_logprobs(chats, LABELS[:2])
        gens = llm.generate(chats[:1], max_new_tokens=3)
    finally:
        server.faults = []
    assert llm.retries == 2
    np.testing.assert_array_equal(faulty, clean)
    assert gens[0][0] == gens_clean[0][0]


def test_server_without_logprobs_is_a_runtime_error(server):
    server.faults = ["no-logprobs"]
    try:
        with pytest.raises(RuntimeError, match="returned no next-token logprobs"):
            client(server, max_retries=0).label_logprobs([mcq_chat(QS[0])], LABELS[0])
    finally:
        server.faults = []


def test_chat_prefill_ignored_by_the_server_is_detected(tiny_llm, tiny_llama_dir):
    """A server without continue_final_message opens a new assistant turn:
    with a tokenizer, chat mode notices; completions mode is unaffected."""
    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name="tiny", extensions=False)
    srv.start()
    try:
        chats = [mcq_chat(q) for q in QS]
        with pytest.raises(ServerError, match="did not continue the final assistant turn"):
            client(srv, tokenizer=str(tiny_llama_dir)).label_logprobs(chats, LABELS)
        with pytest.raises(ServerError, match="mode='completions'"):
            client(srv, tokenizer=str(tiny_llama_dir)).generate(chats[:1], max_new_tokens=2)
        # without a tokenizer chat mode cannot tell: it silently scores another position
        silent = client(srv).label_logprobs(chats, LABELS)
        local = tiny_llm.label_logprobs(chats, LABELS)
        assert not np.allclose(silent, local, atol=1e-3)
        done = client(srv, mode="completions", tokenizer=str(tiny_llama_dir)).label_logprobs(chats, LABELS)
        np.testing.assert_allclose(done, local, rtol=1e-4, atol=1e-4)
        # a chat without a pre-fill is not checked (nothing to continue)
        client(srv, tokenizer=str(tiny_llama_dir)).generate([[{"role": "user", "content": QS[0]}]], max_new_tokens=2)
    finally:
        srv.shutdown()
        srv.server_close()


def test_samples_are_per_row_and_per_index(server):
    llm = client(server, concurrency=3)
    chats = [mcq_chat(q, prefill="") for q in QS]
    kw = dict(max_new_tokens=5, temperature=1.3, seed=21)
    texts = lambda rows: [[g.text for g in r] for r in rows]  # noqa: E731
    three = texts(llm.generate(chats, num_samples=3, **kw))
    assert texts(llm.generate(chats[2:], num_samples=2, **kw)) == [t[:2] for t in three[2:]]
    assert texts(llm.generate_samples(chats[:1], [[2]], **kw)) == [[three[0][2]]]
    assert any(len(set(t)) > 1 for t in three)
    # sample 1 of seed 21 is not sample 0 of seed 22 (seed + s would make them equal)
    assert sample_seed(21, 1) != 22
    next_seed = texts(llm.generate(chats, **{**kw, "seed": 22}))
    assert [t[0] for t in next_seed] != [t[1] for t in three]


def test_identity_names_what_changes_results(server, tiny_llama_dir):
    base = client(server).identity
    assert client(server).identity == base
    assert client(server, top_logprobs=5).identity != base
    assert client(server, extra_body={"repetition_penalty": 1.2}).identity != base
    assert client(server, tokenizer=str(tiny_llama_dir)).identity != base
    assert client(server, mode="completions", tokenizer=str(tiny_llama_dir)).identity != base
    assert client(server, timeout=5.0).identity == base  # transport settings do not


def test_gives_up_with_a_clear_error(server):
    server.faults = ["500"] * 3
    llm = client(server, max_retries=2)
    with pytest.raises(ServerError, match="gave up after 3 attempts; last error: HTTP 500"):
        llm.generate([mcq_chat(QS[0])], max_new_tokens=2)
    assert server.faults == []


def test_missing_features_are_clear_errors(server):
    # too few top entries for the labels of a row
    llm = client(server, top_logprobs=1)
    with pytest.raises(ValueError, match="raise top_logprobs") as info:
        for q in QS:  # the top token cannot be a label for every prompt of a random model
            llm.label_logprobs([mcq_chat(q)], [["K", "L"]])
    assert "top 1 next tokens" in str(info.value)
    # a request the server rejects (4xx) is not retried
    with pytest.raises(ServerError, match="HTTP 400"):
        client(server)._post("/chat/completions", {"model": "tiny", "messages": [], "max_tokens": 1})
    with pytest.raises(ValueError, match="tokenizer"):
        OpenAIConfig(mode="completions")
    with pytest.raises(ValueError, match="base_url"):
        OpenAILLM("127.0.0.1:8000", "m")


def test_serve_cli_runs_as_a_module(tiny_llama_dir):
    """``python -m rcn_fast.llm.serve`` on a free loopback port answers."""
    import re
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "rcn_fast.llm.serve", "--model", str(tiny_llama_dir), "--port", "0",
         "--name", "cli-tiny", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = ""
        for line in proc.stdout:  # the first line names the address
            if line.startswith("serving"):
                break
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        assert m, f"no address in server output: {line!r}"
        llm = load_llm(f"openai:{m.group(1)}#cli-tiny", backoff=0.05, top_logprobs=400)
        lp = llm.label_logprobs([mcq_chat(QS[1])], ["A", "B"])
        local = load_llm(tiny_llama_dir).label_logprobs([mcq_chat(QS[1])], ["A", "B"])
        np.testing.assert_allclose(lp, local, rtol=1e-4, atol=1e-4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
