"""The OpenAI-compatible backend against a real HTTP server on 127.0.0.1
(rcn_fast.llm.server.app over the local backend and a tiny real model; the
server behaves like vLLM: 20 top log-probs at most, a BOS added to text
prompts unless add_special_tokens is false, token-id and list prompts,
prompt log-probs, and switches that drop features as other servers do)."""

from __future__ import annotations

import json
import logging
import string
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import CHATML, build_model, build_tokenizer, mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.openai.client import OpenAIConfig, OpenAILLM, ServerError  # noqa: E402
from rcn_fast.llm.seeded import sample_seed  # noqa: E402
from rcn_fast.llm.server.app import make_server  # noqa: E402

QS = ["Where is a plate kept? A. cupboard B. floor C. oven", "2 + 2? A. 4 B. 5", "Colour? A. blue B. dog C. red D. car"]
LABELS = [["A", "B", "C"], ["A", "B"], ["A", "B", "C", "D"]]
L26 = list(string.ascii_uppercase)


def q26(i: int) -> str:
    return f"Question {i}: pick one. " + " ".join(f"{c}. option {i}{c.lower()}" for c in L26)


@pytest.fixture(scope="module")
def server(tiny_llm):
    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name="tiny")
    srv.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def serve(llm, **kw):
    srv = make_server(llm, "127.0.0.1", 0, model_name="tiny", **kw)
    srv.start()
    return srv


def stop(srv) -> None:
    srv.shutdown()
    srv.server_close()


def client(server, tok=None, **kw) -> OpenAILLM:
    kw.setdefault("backoff", 0.01)
    if tok is not None:
        kw["tokenizer"] = str(tok)
    return load_llm(f"openai:{server.base_url}#tiny", **kw)


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_models_endpoint(server):
    with urllib.request.urlopen(server.base_url + "/models", timeout=10) as r:
        body = json.loads(r.read())
    assert body["data"][0]["id"] == "tiny"


# ------------------------------------------------------------ the vLLM-like server


def test_server_takes_list_and_token_id_prompts_and_caps_logprobs(server, tiny_llm):
    tok = tiny_llm.tokenizer
    a, b = tok.encode("Answer: A"), tok.encode("What is 2 + 2?")
    one = post(server.base_url + "/completions", {"model": "tiny", "prompt": a, "max_tokens": 2, "temperature": 0})
    both = post(server.base_url + "/completions", {"model": "tiny", "prompt": [b, a], "max_tokens": 2, "temperature": 0})
    texts = post(server.base_url + "/completions", {"model": "tiny", "prompt": ["What is 2 + 2?", "Answer: A"],
                                                     "max_tokens": 2, "temperature": 0})
    assert [c["index"] for c in both["choices"]] == [0, 1]
    assert both["choices"][1]["text"] == one["choices"][0]["text"] == texts["choices"][1]["text"]
    assert both["usage"]["prompt_tokens"] == len(a) + len(b)
    # n samples per prompt: prompt p's sample s at index p * n + s
    many = post(server.base_url + "/completions", {"model": "tiny", "prompt": [b, a], "n": 2, "max_tokens": 2,
                                                    "temperature": 1.0, "seed": 3})
    assert [c["index"] for c in many["choices"]] == [0, 1, 2, 3]
    with pytest.raises(urllib.error.HTTPError) as info:
        post(server.base_url + "/completions", {"model": "tiny", "prompt": a, "max_tokens": 1, "logprobs": 21})
    assert info.value.code == 400 and "max_logprobs (20)" in info.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as info:
        post(server.base_url + "/chat/completions", {"model": "tiny", "messages": mcq_chat(QS[0]), "max_tokens": 1,
                                                      "logprobs": True, "top_logprobs": 21})
    assert info.value.code == 400


def test_server_prompt_logprobs_echo_and_vllm_fields_agree(server, tiny_llm):
    tok = tiny_llm.tokenizer
    ids = tiny_llm.encode_chats([mcq_chat(QS[0])])[0]
    body = {"model": "tiny", "prompt": [ids + [t] for t in tiny_llm.label_ids_for(["A"])[0]], "max_tokens": 1,
            "temperature": 0}
    echo = post(server.base_url + "/completions", {**body, "echo": True, "logprobs": 1})
    vllm = post(server.base_url + "/completions", {**body, "prompt_logprobs": 2})
    import torch

    with torch.no_grad():
        full = torch.log_softmax(tiny_llm.model(torch.tensor([ids])).logits[0, -1].double(), -1)
    for c_e, c_v, p in zip(echo["choices"], vllm["choices"], body["prompt"]):
        tl = c_e["logprobs"]["token_logprobs"]
        assert tl[0] is None and len(tl) == len(p) + 1  # the prompt, then the generated token
        assert c_e["logprobs"]["tokens"][: len(p)] == [tok.decode([t]) for t in p]
        assert c_v["prompt_logprobs"][0] is None and len(c_v["prompt_logprobs"]) == len(p)
        last = c_v["prompt_logprobs"][-1]
        assert len(last) <= 3 and str(p[-1]) in last
        assert last[str(p[-1])]["logprob"] == pytest.approx(tl[len(p) - 1], abs=1e-6)
        assert tl[len(p) - 1] == pytest.approx(full[p[-1]].item(), abs=1e-4)


@pytest.fixture(scope="module")
def bos_dir(tmp_path_factory):
    """A tiny model whose tokenizer adds a BOS (as Llama-3's) and whose chat
    template writes it too: a server that adds special tokens to the
    rendered text doubles it."""
    from tokenizers import processors

    tok = build_tokenizer("{{ bos_token }}" + CHATML)
    tok.add_special_tokens({"bos_token": "<s>"})
    bos = tok.convert_tokens_to_ids("<s>")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-bos")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_double_bos_is_caught(bos_dir):
    local = load_llm(bos_dir, batch_size=4)
    chats = [mcq_chat(q) for q in QS]
    ids = local.encode_chats(chats[:1])[0]
    bos = local.tokenizer.bos_token_id
    assert ids[0] == bos and ids[1] != bos  # the template writes the one BOS
    srv = serve(local)
    try:
        text = local.render(chats[:1])[0]
        # what a client sending rendered text to vLLM's /completions gets: a second BOS
        plain = post(srv.base_url + "/completions", {"model": "tiny", "prompt": text, "max_tokens": 1})
        assert plain["usage"]["prompt_tokens"] == len(ids) + 1
        flagged = post(srv.base_url + "/completions", {"model": "tiny", "prompt": text, "max_tokens": 1,
                                                       "add_special_tokens": False})
        assert flagged["usage"]["prompt_tokens"] == len(ids)
        ref = local.label_logprobs(chats, LABELS)
        np.testing.assert_allclose(client(srv, bos_dir).label_logprobs(chats, LABELS), ref, atol=1e-5)
        # a server without token-id prompts (llama-cpp-python) gets the text: exact through the top
        # log-probs fallback where the server has no cap ...
        srv_text = serve(local, token_prompts=False, max_logprobs=None)
        try:
            got = client(srv_text, bos_dir).label_logprobs(chats, LABELS)
            np.testing.assert_allclose(got, ref, atol=1e-4)
            # ... and a server that adds the BOS anyway is an error, not a silent shift
            with pytest.raises(ServerError, match=r"counted \d+ prompt tokens where the prompt has \d+.*BOS"):
                client(srv_text, bos_dir, extra_body={"add_special_tokens": True}).label_logprobs(chats, LABELS)
            with pytest.raises(ServerError, match=r"counted \d+ prompt tokens where the prompt has \d+.*BOS"):
                client(srv_text, bos_dir, extra_body={"add_special_tokens": True}).generate(chats, max_new_tokens=2)
        finally:
            stop(srv_text)
    finally:
        stop(srv)


# ------------------------------------------------------------ label scoring


def test_label_logprobs_match_local_backend_exactly_for_26_labels(server, tiny_llm, tiny_llama_dir):
    chats = [mcq_chat(q26(i)) for i in range(3)] + [mcq_chat(q) for q in QS]
    labels = [L26] * 3 + LABELS
    llm = client(server, tiny_llama_dir, prompts_per_request=64)
    seen = server.requests_seen
    got = llm.label_logprobs(chats, labels, tags=list("abcdef"))
    ref = tiny_llm.label_logprobs(chats, labels)
    assert np.isfinite(got[:3]).all() and got.shape == (6, 26)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert (got.argmax(1) == ref.argmax(1)).all()
    # several prompts per request: two probes, the 6 prefixes for their top log-probs in one request,
    # then the spellings not found there (3 * 26 + 9 labels, 1-2 spellings each), 64 a request
    n_prompts = sum(len(s) for r in labels for s in tiny_llm.label_ids_for(r))
    assert server.requests_seen - seen <= 2 + 1 + -(-n_prompts // 64)
    lens = [len(x) for x in tiny_llm.encode_chats(chats)]
    assert llm.cost.total.calls == 6 and llm.cost.total.prompt_tokens == sum(lens)
    assert llm.cost.by_tag["a"].prompt_tokens == lens[0]
    vllm_field = client(server, tiny_llama_dir, prompt_logprobs_field="vllm").label_logprobs(chats, labels)
    np.testing.assert_allclose(vllm_field, got, atol=1e-6)
    every = client(server, tiny_llama_dir, top_logprobs_first=False).label_logprobs(chats, labels)
    np.testing.assert_allclose(every, got, atol=1e-5)


def test_spellings_in_the_top_logprobs_need_no_prompt_of_their_own(server, tiny_llm, tiny_llama_dir):
    """A row whose spellings are all among the top log-probs is one prompt."""
    ids = tiny_llm.encode_chats([mcq_chat(QS[0])])[0]
    top = [t for t, _ in tiny_llm.top_logprobs_ids([ids], 20)[0]]
    tok = tiny_llm.tokenizer
    labels = list(dict.fromkeys(tok.decode([t]) for t in top if tok.decode([t]).isalnum()))[:3]
    assert len(labels) >= 2
    llm = client(server, tiny_llama_dir, label_spellings=("{}",))
    llm.label_logprobs([mcq_chat(QS[1])], ["A", "B"])  # the probes
    seen, prompts = server.requests_seen, server.prompts_seen
    got = llm.label_logprobs([mcq_chat(QS[0])], labels)
    assert server.requests_seen - seen == 1 and server.prompts_seen - prompts == 1
    every = client(server, tiny_llama_dir, label_spellings=("{}",), top_logprobs_first=False)
    every.label_logprobs([mcq_chat(QS[1])], ["A", "B"])
    prompts = server.prompts_seen
    np.testing.assert_allclose(every.label_logprobs([mcq_chat(QS[0])], labels), got, atol=1e-5)
    assert server.prompts_seen - prompts == len(labels)  # one prompt per spelling
    local = load_llm(tiny_llama_dir, label_spellings=("{}",)).label_logprobs([mcq_chat(QS[0])], labels)
    np.testing.assert_allclose(got, local, atol=1e-4)


def test_top_logprobs_cannot_score_26_labels_and_says_so(server, tiny_llama_dir):
    """The previous client read the capped next-token top log-probs: labels
    outside them scored -inf. Now that is an error naming the label."""
    chats = [mcq_chat(q26(i)) for i in range(2)]
    llm = client(server, tiny_llama_dir, label_scoring="top_logprobs")
    with pytest.raises(ValueError, match=r"labels\[0\]: label '.' is not among the server's top 20 next tokens"):
        llm.label_logprobs(chats, L26)
    with pytest.raises(ValueError, match="is not among the server's top 20"):  # chat mode, no tokenizer
        client(server).label_logprobs(chats, L26)


def test_fallback_to_top_logprobs_is_logged_and_escalates(tiny_llm, tiny_llama_dir, caplog):
    """A server without prompt log-probs: 'auto' falls back with a warning
    and asks for more entries until every spelling is found (exact)."""
    chats = [mcq_chat(q26(0)), mcq_chat(QS[2])]
    labels = [L26, LABELS[2] + ["E"]]
    ref = tiny_llm.label_logprobs(chats, labels)
    srv = serve(tiny_llm, prompt_logprobs=False, max_logprobs=None)
    try:
        with caplog.at_level(logging.WARNING, logger="rcn_fast.llm.openai.client"):
            got = client(srv, tiny_llama_dir).label_logprobs(chats, labels)
        assert "no prompt log-probs" in caplog.text and "top log-probs" in caplog.text
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        with pytest.raises(ServerError, match="returns no prompt log-probs"):
            client(srv, tiny_llama_dir, label_scoring="prompt_logprobs").label_logprobs(chats, labels)
    finally:
        stop(srv)


def test_server_without_logprobs_is_a_runtime_error(server, tiny_llama_dir):
    server.faults = ["no-logprobs", "no-logprobs"]  # the token-prompt check, then the scoring request
    try:
        with pytest.raises(RuntimeError, match="returned no next-token logprobs"):
            client(server, tiny_llama_dir, max_retries=0, label_scoring="top_logprobs").label_logprobs(
                [mcq_chat(QS[0])], LABELS[0])
    finally:
        server.faults = []


def test_tokenizer_is_loaded_once_before_requests_fan_out(server, tiny_llama_dir, monkeypatch):
    import time

    import rcn_fast.llm.tokenizer as load_mod

    calls = []
    real = load_mod.load_tokenizer

    def slow(spec):
        calls.append(spec)
        time.sleep(0.3)
        return real(spec)

    monkeypatch.setattr(load_mod, "load_tokenizer", slow)
    llm = client(server, tiny_llama_dir)
    errors, outs = [], []

    def work():
        try:
            outs.append(llm.label_logprobs([mcq_chat(QS[1])], LABELS[1]))
        except Exception as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and len(outs) == 6
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_the_model_name_as_tokenizer(tiny_llm, tiny_llama_dir):
    """With no tokenizer= given, a served model name that is a local path is
    the tokenizer: token-id prompts, exact scores."""
    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name=str(tiny_llama_dir))
    srv.start()
    try:
        llm = load_llm(f"openai:{srv.base_url}#{tiny_llama_dir}")
        assert llm.uses_tokens
        chats = [mcq_chat(q) for q in QS]
        np.testing.assert_allclose(llm.label_logprobs(chats, LABELS), tiny_llm.label_logprobs(chats, LABELS),
                                   atol=1e-4)
    finally:
        stop(srv)


# ------------------------------------------------------------ generation and pre-fills


def test_generate_matches_local_backend_tokens_and_chat(server, tiny_llm, tiny_llama_dir):
    chats = [mcq_chat(q, prefill="Explanations:\n* ") for q in QS] + [[{"role": "user", "content": QS[0]}]]
    ref = tiny_llm.generate(chats, max_new_tokens=5)
    for kw in ({}, {"tok": tiny_llama_dir}, {"tok": tiny_llama_dir, "mode": "chat"}):
        got = client(server, concurrency=3, **kw).generate(chats, max_new_tokens=5)
        assert [g[0].text for g in got] == [g[0].text for g in ref], kw
        assert [g[0].generated_tokens for g in got] == [g[0].generated_tokens for g in ref]
        assert [g[0].prompt_tokens for g in got] == [g[0].prompt_tokens for g in ref]
        assert [g[0].finish_reason for g in got] == [g[0].finish_reason for g in ref]


def test_chat_prefill_ignored_by_the_server_is_refused(tiny_llm, tiny_llama_dir):
    """A server without continue_final_message (OpenAI's API, llama.cpp)
    opens a new assistant turn: the probe refuses chat mode without a
    tokenizer, the per-request check with one; token-id prompts are right."""
    srv = serve(tiny_llm, extensions=False)
    try:
        chats = [mcq_chat(q) for q in QS]
        local = tiny_llm.label_logprobs(chats, LABELS)
        bare = client(srv, top_logprobs=20)
        with pytest.raises(ServerError, match="ignores the field.*pass tokenizer="):
            bare.label_logprobs(chats, LABELS)
        with pytest.raises(ServerError, match="ignores the field"):  # the verdict is kept
            bare.generate(chats[:1], max_new_tokens=2)
        with pytest.raises(ServerError, match="did not continue the final assistant turn"):
            client(srv, tiny_llama_dir, mode="chat").generate(chats[:1], max_new_tokens=2)
        done = client(srv, tiny_llama_dir).label_logprobs(chats, LABELS)
        np.testing.assert_allclose(done, local, rtol=1e-4, atol=1e-4)
        # a chat without a pre-fill needs no probe
        client(srv).generate([[{"role": "user", "content": QS[0]}]], max_new_tokens=2)
    finally:
        stop(srv)
    # the same probe passes on a server that continues pre-fills
    srv = serve(tiny_llm)
    try:
        got = client(srv).generate(chats[:1], max_new_tokens=3)
        assert got[0][0].text == tiny_llm.generate(chats[:1], max_new_tokens=3)[0][0].text
    finally:
        stop(srv)


def test_samples_are_per_row_and_per_index(server, tiny_llama_dir):
    for tok in (None, tiny_llama_dir):
        llm = client(server, tok, concurrency=3)
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


# ------------------------------------------------------------ transport and errors


def test_retries_on_server_errors_and_dropped_connections(server, tiny_llama_dir):
    chats = [mcq_chat(q) for q in QS]
    clean = client(server, tiny_llama_dir, concurrency=1).label_logprobs(chats, LABELS)
    gens_clean = client(server, tiny_llama_dir, concurrency=1).generate(chats[:1], max_new_tokens=4)
    server.faults = ["500", "drop", "429", "503", "drop"]
    llm = client(server, tiny_llama_dir, concurrency=1)
    faulty = llm.label_logprobs(chats, LABELS)
    gens = llm.generate(chats[:1], max_new_tokens=4)
    assert llm.retries == 5 and server.faults == []
    np.testing.assert_array_equal(faulty, clean)
    assert gens[0][0] == gens_clean[0][0]


def test_retries_after_a_response_slower_than_the_timeout(server, tiny_llama_dir):
    chats = [mcq_chat(q) for q in QS[:2]]
    clean = client(server, tiny_llama_dir, concurrency=1).label_logprobs(chats, LABELS[:2])
    gens_clean = client(server, concurrency=1).generate(chats[:1], max_new_tokens=3)
    llm = client(server, tiny_llama_dir, concurrency=1, timeout=0.75)
    llm.prepare()
    server.faults = ["slow:2.5", "slow:2.5"]
    try:
        faulty = llm.label_logprobs(chats, LABELS[:2])
        gens = llm.generate(chats[:1], max_new_tokens=3)
    finally:
        server.faults = []
    assert llm.retries == 2
    np.testing.assert_array_equal(faulty, clean)
    assert gens[0][0] == gens_clean[0][0]


def test_gives_up_with_a_clear_error(server):
    server.faults = ["500"] * 3
    llm = client(server, max_retries=2)
    with pytest.raises(ServerError, match="gave up after 3 attempts; last error: HTTP 500"):
        llm.generate([[{"role": "user", "content": QS[0]}]], max_new_tokens=2)
    assert server.faults == []


def test_server_down_is_a_clear_error(tiny_llama_dir):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    llm = load_llm(f"openai:http://127.0.0.1:{port}/v1#tiny", max_retries=1, backoff=0.01)
    with pytest.raises(ServerError, match=r"gave up after 2 attempts; last error: ConnectionRefusedError"):
        llm.generate([[{"role": "user", "content": "hi"}]], max_new_tokens=2)


def test_identity_names_what_changes_results(server, tiny_llama_dir):
    base = client(server).identity
    assert client(server).identity == base
    assert client(server, top_logprobs=5).identity != base
    assert client(server, extra_body={"repetition_penalty": 1.2}).identity != base
    assert client(server, tiny_llama_dir).identity != base
    assert client(server, mode="chat").identity != base
    assert client(server, label_scoring="top_logprobs").identity != base
    assert client(server, prompt_logprobs_field="vllm").identity != base
    assert client(server, timeout=5.0, concurrency=3, prompts_per_request=2).identity == base  # transport


def test_bad_settings_are_clear_errors(server):
    with pytest.raises(ServerError, match="HTTP 400"):  # a request the server rejects (4xx) is not retried
        client(server).transport.post("/chat/completions", {"model": "tiny", "messages": [], "max_tokens": 1})
    with pytest.raises(ValueError, match="tokenizer: mode='completions'"):
        OpenAILLM("http://127.0.0.1:1/v1", "not a path", OpenAIConfig(mode="completions"))
    with pytest.raises(ValueError, match="base_url"):
        OpenAILLM("127.0.0.1:8000", "m")
    for kw, name in (({"mode": "text"}, "mode"), ({"label_scoring": "max"}, "label_scoring"),
                     ({"concurrency": 0}, "concurrency"), ({"prompts_per_request": 0}, "prompts_per_request"),
                     ({"top_logprobs": 20, "max_top_logprobs": 5}, "max_top_logprobs"),
                     ({"prompt_logprobs_field": "x"}, "prompt_logprobs_field"), ({"timeout": 0}, "timeout")):
        with pytest.raises(ValueError, match=name):
            OpenAIConfig(**kw)
    with pytest.raises(ValueError, match="label_scoring: 'prompt_logprobs' needs token-id prompts"):
        client(server, label_scoring="prompt_logprobs").label_logprobs([mcq_chat(QS[1])], LABELS[1])


def test_serve_cli_runs_as_a_module(tiny_llama_dir):
    """``python -m rcn_fast.serve`` on a free loopback port answers."""
    import re
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "rcn_fast.serve", "--model", str(tiny_llama_dir), "--port", "0",
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
        llm = load_llm(f"openai:{m.group(1)}#cli-tiny", backoff=0.05, tokenizer=str(tiny_llama_dir))
        lp = llm.label_logprobs([mcq_chat(QS[1])], ["A", "B"])
        local = load_llm(tiny_llama_dir).label_logprobs([mcq_chat(QS[1])], ["A", "B"])
        np.testing.assert_allclose(lp, local, rtol=1e-4, atol=1e-4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
