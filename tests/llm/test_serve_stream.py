"""Issue 51 item 2: ``python -m rcn_fast.serve`` streams and returns
log-probs as vLLM and llama.cpp's server do, tested with the real
``openai`` client and LangChain's ``ChatOpenAI`` against the real
SmolLM2-135M-Instruct GGUF (the native engine), and on the wire.

* ``"stream": true`` is server-sent events in OpenAI's chunk format: the
  role first (chat), text as it becomes final, ``finish_reason`` on the
  last content chunk, the usage chunk (``stream_options.include_usage``,
  no choices), ``data: [DONE]``; the concatenated text equals the whole
  greedy answer (and a seeded sampled one), stop strings included (a stop
  string split across tokens is never sent), multi-byte characters never
  split between chunks;
* log-probs of every generated token for any ``max_tokens``, equal to the
  engine's own log-softmax of the same prefix (computed again by its
  prompt-log-prob path, exactly: the engine is batch invariant), streamed
  or not.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from rcn_fast.llm.base import GenerationParams
from rcn_fast.llm.server.streaming import TextStream
from tests.llm.test_serve_engine import serve

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in two sentences."}]
PROMPT = "The three largest cities of France are"


@pytest.fixture(scope="module")
def server(smollm2):
    with serve(smollm2, "smol") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def sse(srv: Any, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], list[Any]]:
    """POST with ``"stream": true`` on the wire: status, headers and the
    events (parsed JSON, or the string ``"[DONE]"``)."""
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=300)
    try:
        conn.request("POST", path, json.dumps({"model": "smol", "stream": True, **body}).encode(),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read().decode()
        if r.status != 200:
            return r.status, dict(r.getheaders()), [json.loads(raw)]
        assert raw.endswith("\n\n") and all(e.startswith("data: ") for e in raw[:-2].split("\n\n")), raw[:500]
        events = [e[len("data: "):] for e in raw[:-2].split("\n\n")]
        return r.status, dict(r.getheaders()), [e if e == "[DONE]" else json.loads(e) for e in events]
    finally:
        conn.close()


def whole(srv: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=300)
    try:
        conn.request("POST", path, json.dumps({"model": "smol", **body}).encode(), {"Content-Type": "application/json"})
        r = conn.getresponse()
        out = json.loads(r.read())
        assert r.status == 200, out
        return out
    finally:
        conn.close()


# ------------------------------------------------------------ the wire


def test_a_chat_stream_on_the_wire_has_openais_chunk_format(server):
    body = {"messages": CHAT, "max_tokens": 40, "temperature": 0}
    want = whole(server, "/v1/chat/completions", body)
    status, headers, events = sse(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers.get("Transfer-Encoding") == "chunked" and events[-1] == "[DONE]"
    chunks, done = events[:-1], events[-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] and c["model"] == "smol"
               for c in chunks)
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""} and first["finish_reason"] is None
    *content, usage = chunks[1:]
    assert usage["choices"] == [] and usage["usage"] == want["usage"]  # include_usage: last, no choices
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert content[-1]["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in content)
    assert text == want["choices"][0]["message"]["content"] and len(content) > 5
    assert "usage" not in chunks[1]  # only with continuous_usage_stats


def test_a_stream_without_include_usage_has_no_usage_chunk_and_continuous_usage_counts(server):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    _, _, events = sse(server, "/v1/completions", body)
    assert all(e == "[DONE]" or (e["choices"] and "usage" not in e) for e in events)
    _, _, events = sse(server, "/v1/completions", {**body, "stream_options": {"continuous_usage_stats": True}})
    used = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert used == sorted(used) and used[-1] == 8 and all(e["usage"]["prompt_tokens"] > 0 for e in events[:-1])


def test_stream_fields_are_checked(server):
    for body, want in [({"stream": "yes"}, "stream: expected a bool"),
                       ({"stream_options": {"include_usage": True}}, "stream_options: only allowed with stream=true"),
                       ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
                       ({"stream": True, "prompt_logprobs": 1}, "prompt_logprobs: not available with stream=true"),
                       ({"stream": True, "max_tokens": 10**6}, "maximum context length")]:
        host, port = server.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": PROMPT, **body}).encode())
        r = conn.getresponse()
        out = json.loads(r.read())
        conn.close()
        assert r.status == 400 and want in out["error"]["message"], (body, out)


# ------------------------------------------------------------ the official client


def test_openai_client_streams_equal_the_whole_greedy_answers(client):
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=40, temperature=0)
    parts, finish, usage, roles = [], None, None, []
    for ch in client.chat.completions.create(model="smol", messages=CHAT, max_tokens=40, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            roles += [c.delta.role] if c.delta.role else []
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == r.choices[0].message.content and r.choices[0].message.content
    assert roles == ["assistant"] and finish == r.choices[0].finish_reason and usage == r.usage

    c = client.completions.create(model="smol", prompt=PROMPT, max_tokens=30, temperature=0)
    s = "".join(ch.choices[0].text for ch in client.completions.create(model="smol", prompt=PROMPT, max_tokens=30,
                                                                        temperature=0, stream=True) if ch.choices)
    assert s == c.choices[0].text and len(s) > 20


def test_sampled_streams_of_several_prompts_and_samples_equal_the_whole_answer(client):
    """Choice ``p * n + s`` of two prompts x n=2 seeded samples: each
    choice's streamed text is its text in the whole answer."""
    kw = dict(model="smol", prompt=[PROMPT, "Commonsense says that ice"], n=2, max_tokens=16, temperature=0.9,
              seed=7)
    want = {c.index: (c.text, c.finish_reason) for c in client.completions.create(**kw).choices}
    got: dict[int, list[str]] = {}
    ends: dict[int, str] = {}
    for ch in client.completions.create(**kw, stream=True):
        for c in ch.choices:
            got.setdefault(c.index, []).append(c.text)
            ends[c.index] = c.finish_reason or ends.get(c.index)
    assert {i: ("".join(t), ends[i]) for i, t in got.items()} == want and len(want) == 4
    assert len({t for t, _ in want.values()}) > 1


def test_stop_strings_split_across_tokens_and_chunks_are_never_sent(client, smollm2):
    """A stop string made of the end of one token and the start of the
    next: the whole answer and the stream both stop before it, the stream
    never having sent any of it; a stop string that only starts to match
    (held back, then released) changes nothing."""
    free = client.completions.create(model="smol", prompt=PROMPT, max_tokens=30, temperature=0,
                                     logprobs=0).choices[0]
    toks = free.logprobs.tokens
    i = next(i for i in range(3, len(toks) - 1) if len(toks[i].strip()) >= 2 and len(toks[i + 1].strip()) >= 2)
    stop = toks[i][-2:] + toks[i + 1][:2]
    cut = free.text.find(stop)
    assert 0 < cut
    for stops, text, reason in (([stop], free.text[:cut], "stop"), ([stop + "@@"], free.text, "length")):
        r = client.completions.create(model="smol", prompt=PROMPT, max_tokens=30, temperature=0, stop=stops)
        assert (r.choices[0].text, r.choices[0].finish_reason) == (text, reason)
        chunks = [ch.choices[0] for ch in client.completions.create(model="smol", prompt=PROMPT, max_tokens=30,
                                                                     temperature=0, stop=stops, stream=True)]
        assert "".join(c.text for c in chunks) == text and chunks[-1].finish_reason == reason


def test_multibyte_characters_are_never_split_between_chunks(server, smollm2):
    """Emoji are several tokens of SmolLM2's byte-level vocabulary each: no
    chunk holds half a character (U+FFFD), the text is the whole answer's."""
    body = {"prompt": "Emoji story: 😀😃😄", "max_tokens": 24, "temperature": 0}
    want = whole(server, "/v1/completions", body)["choices"][0]["text"]
    _, _, events = sse(server, "/v1/completions", body)
    texts = [e["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == want and any(ord(ch) > 0xFFFF for ch in want)
    assert not any("\ufffd" in t for t in texts[:-1])  # the last may hold what max_tokens cut mid-character
    tok = smollm2.tokenizer  # the detokeniser on its own: every character of a mixed text once, in order
    for text in ["Café 😀 naïve 東京 — ok", "🙂🙂🙂", "Ελληνικά ★"]:
        ids = tok.encode(text, add_special_tokens=False)
        ts = TextStream(tok, None)
        chunks = [ts.push(t) for t in ids]
        assert "".join(chunks) == tok.decode(ids) == text and "" in chunks and ts.finish(text) == ""


# ------------------------------------------------------------ log-probs


def _engine_reference(engine: Any, ids: list[int], n: int, k: int) -> tuple[list[int], list[tuple[float, list]]]:
    """The greedy tokens after ``ids`` and, for each, the engine's own
    log-softmax of the same prefix: its prompt-log-prob path over ``ids +
    generated`` (chunked prefill, not the decode loop)."""
    got: list[int] = []
    engine.generate_ids([ids], GenerationParams(max_new_tokens=n), on_token=lambda p, s, t, lp, top: got.append(t))
    plp = engine.prompt_logprobs_ids([ids + got], k, chunk=5, check=lambda: None)[0]
    return got, plp[len(ids):]


def test_completion_logprobs_of_every_token_equal_the_engines_log_softmax(server, client, smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode(PROMPT, add_special_tokens=False)
    gen, ref = _engine_reference(smollm2, ids, 12, 4)
    r = client.completions.create(model="smol", prompt=ids, max_tokens=12, temperature=0, logprobs=4).choices[0]
    lp = r.logprobs
    assert lp.tokens == [tok.decode([t]) for t in gen] and len(lp.tokens) == 12
    assert lp.token_logprobs == [e[0] for e in ref]  # exact: the engine is batch invariant
    for top, (_, want) in zip(lp.top_logprobs, ref):
        assert top == dict((tok.decode([t]), v) for t, v in reversed(want))  # the top 4 (the sampled is among them)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(12)]
    events = sse(server, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 4})[2]
    streamed = [x for e in events[:-1] if e["choices"][0]["logprobs"] for x in
                zip(*(e["choices"][0]["logprobs"][f] for f in ("tokens", "token_logprobs", "text_offset")))]
    assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))


def test_chat_logprobs_of_every_token_equal_the_engines_log_softmax(server, client, smollm2):
    tok = smollm2.tokenizer
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=10, temperature=0, logprobs=True,
                                       top_logprobs=3)
    ids = smollm2.encode_chats([CHAT])[0]
    assert r.usage.prompt_tokens == len(ids)
    gen, ref = _engine_reference(smollm2, ids, 10, 3)
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == [tok.decode([t]) for t in gen]
    assert [c.logprob for c in content] == [e[0] for e in ref]
    assert [[(t.token, t.logprob) for t in c.top_logprobs] for c in content] == \
        [[(tok.decode([t]), v) for t, v in want] for _, want in ref]
    assert all(c.bytes == list(c.token.encode()) for c in content)
    streamed = [c for ch in client.chat.completions.create(model="smol", messages=CHAT, max_tokens=10, temperature=0,
                                                           logprobs=True, top_logprobs=3, stream=True)
                for x in ch.choices if x.logprobs for c in x.logprobs.content]
    assert [(c.token, c.logprob, [t.logprob for t in c.top_logprobs]) for c in streamed] == \
        [(c.token, c.logprob, [t.logprob for t in c.top_logprobs]) for c in content]


def test_the_end_of_turn_token_has_its_logprob_and_counts(client):
    """A chat that ends on its end-of-turn token: one log-prob entry per
    completion token, the last one the end-of-turn token (as vLLM)."""
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Say OK."}], max_tokens=40,
                                       temperature=0, logprobs=True, top_logprobs=0)
    c = r.choices[0]
    assert c.finish_reason == "stop" and len(c.logprobs.content) == r.usage.completion_tokens
    assert c.logprobs.content[-1].token == "<|im_end|>" and all(x.top_logprobs == [] for x in c.logprobs.content)


def test_top_logprobs_need_logprobs_true(server):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": CHAT, "top_logprobs": 2}).encode())
    r = conn.getresponse()
    out = json.loads(r.read())
    conn.close()
    assert r.status == 400 and "top_logprobs: needs logprobs=true" in out["error"]["message"]


# ------------------------------------------------------------ LangChain


def test_langchain_chat_openai_invokes_and_streams_from_the_server(server, client):
    lc = pytest.importorskip("langchain_openai")
    want = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=40, temperature=0)
    llm = lc.ChatOpenAI(base_url=server.base_url, api_key="unused", model="smol", temperature=0, max_tokens=40,
                        max_retries=0, timeout=300)
    msg = llm.invoke([("user", CHAT[0]["content"])])
    assert msg.content == want.choices[0].message.content
    streaming = lc.ChatOpenAI(base_url=server.base_url, api_key="unused", model="smol", temperature=0, max_tokens=40,
                              streaming=True, stream_usage=True, max_retries=0, timeout=300)
    chunks = list(streaming.stream([("user", CHAT[0]["content"])]))
    assert len(chunks) > 5 and "".join(c.content for c in chunks) == msg.content
    usage = [c.usage_metadata for c in chunks if c.usage_metadata]
    assert usage and usage[-1]["output_tokens"] == want.usage.completion_tokens
    lp = lc.ChatOpenAI(base_url=server.base_url, api_key="unused", model="smol", temperature=0, max_tokens=8,
                       max_retries=0, timeout=300).bind(logprobs=True, top_logprobs=2)
    out = lp.invoke([("user", CHAT[0]["content"])])
    assert len(out.response_metadata["logprobs"]["content"]) == out.usage_metadata["output_tokens"]


def test_on_transformers_streams_and_logprobs_match_too(tiny_llm):
    """The same on the transformers backend (a tiny random-weight Llama):
    the stream is the whole answer, every token's log-prob is the model's
    own log-softmax of its prefix (its prompt-log-prob path, float32 up to
    the batch's padding), the log-probs streamed equal those answered."""
    pytest.importorskip("transformers")
    tok = tiny_llm.tokenizer
    ids = list(tok.encode("Knowledge connects concepts.", add_special_tokens=True))
    with serve(tiny_llm, "smol") as srv:
        body = {"prompt": ids, "max_tokens": 12, "temperature": 0, "logprobs": 3}
        want = whole(srv, "/v1/completions", body)["choices"][0]
        _, _, events = sse(srv, "/v1/completions", body)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == want["text"]
    lp = want["logprobs"]
    streamed = [x for e in events[:-1] if e["choices"][0]["logprobs"]
                for x in e["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == lp["token_logprobs"] and len(streamed) == 12
    got: list[int] = []
    tiny_llm.generate_ids([ids], GenerationParams(max_new_tokens=12),
                          on_token=lambda p, s, t, x, top: got.append(t))
    assert [tok.decode([t]) for t in got] == lp["tokens"]
    ref = tiny_llm.prompt_logprobs_ids([ids + got], 3, chunk=4, check=lambda: None)[0][len(ids):]
    assert lp["token_logprobs"] == pytest.approx([e[0] for e in ref], abs=2e-5)
    for top, (_, want_top) in zip(lp["top_logprobs"], ref):
        assert top == pytest.approx({tok.decode([t]): v for t, v in reversed(want_top)}, abs=2e-5)
