"""The server over the native engine: ``python -m rcn_fast.serve --model
x.gguf`` runs the engine (the serving protocol, rcn_fast.llm.server.protocol,
that both local backends implement); its greedy answers equal the
in-process engine's; prompt log-probs, logit_bias and the request limits
work as on transformers."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.backends.engine import GGUFLLM  # noqa: E402
from rcn_fast.llm.server.app import make_server  # noqa: E402
from rcn_fast.llm.server.protocol import ServedModel  # noqa: E402

GGUF = Path(__file__).resolve().parent / "data" / "converter" / "llama_default.gguf"
CHAT = [{"role": "user", "content": "Question: Where would you put a plate after washing it? A. cupboard B. table"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCN_FAST_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_llm(str(GGUF), engine="native", num_threads=1)


@contextlib.contextmanager
def serve(llm: Any, model_name: str = "tiny", **kw: Any):
    srv = make_server(llm, "127.0.0.1", 0, model_name=model_name, **kw)
    srv.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def post(base: str, path: str, body: dict, timeout: float = 120.0) -> tuple[int, dict]:
    host, port = base.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1" + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def test_both_local_backends_implement_the_serving_protocol(engine, request):
    pytest.importorskip("transformers")
    tiny_llm = request.getfixturevalue("tiny_llm")
    assert isinstance(engine, ServedModel) and isinstance(tiny_llm, ServedModel)
    with pytest.raises(TypeError, match="ServedModel"):
        make_server(object())


def test_the_command_line_serves_a_gguf_through_the_engine(engine, tmp_path):
    """``python -m rcn_fast.serve --model x.gguf`` (a process of its own):
    its greedy chat answer and completion equal the in-process engine's."""
    env = dict(os.environ, RCN_FAST_CACHE=str(tmp_path / "cache"), RCN_FAST_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.serve", "--model", str(GGUF), "--port", "0", "--name",
                             "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 180)  # bounded: a server that never starts fails the test
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        m = re.search(r"at (http://\S+/v1)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        base = m.group(1)
        status, out = post(base, "/chat/completions", {"messages": CHAT, "max_tokens": 12, "temperature": 0})
        assert status == 200, out
        want = engine.generate([CHAT], max_new_tokens=12)[0][0]
        assert out["choices"][0]["message"]["content"] == want.text
        assert out["usage"]["completion_tokens"] == want.generated_tokens
        ids = engine.tokenizer.encode("Answer: A B", add_special_tokens=True)
        status, out = post(base, "/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0})
        assert status == 200, out
        assert out["choices"][0]["text"] == engine.generate_ids([ids], _params(8))[0][0].text
    finally:
        proc.kill()  # the server this test started
        proc.wait(timeout=60)


def _params(n: int, **kw: Any) -> Any:
    from rcn_fast.llm.base import GenerationParams

    return GenerationParams(max_new_tokens=n, **kw)


def test_served_greedy_and_sampled_answers_equal_the_engines(engine):
    with serve(engine) as srv:
        status, out = post(srv.base_url, "/chat/completions", {"messages": CHAT, "max_tokens": 10, "temperature": 0})
        assert status == 200 and out["choices"][0]["message"]["content"] == \
            engine.generate([CHAT], max_new_tokens=10)[0][0].text
        status, out = post(srv.base_url, "/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0.9,
                                                               "n": 3, "seed": 5})
        want = engine.generate([CHAT], max_new_tokens=6, temperature=0.9, num_samples=3, seed=5)[0]
        assert status == 200 and [c["message"]["content"] for c in out["choices"]] == [g.text for g in want]


def test_served_prompt_logprobs_and_logit_bias_on_the_engine(engine):
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)
    with serve(engine) as srv:
        status, out = post(srv.base_url, "/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0,
                                                          "prompt_logprobs": 3})
        assert status == 200, out
        plp = out["choices"][0]["prompt_logprobs"]
        assert plp[0] is None and len(plp) == len(ids)
        # position q's entry: the log-prob of ids[q] after ids[:q], as the engine's own next-token log-probs say
        for q in (1, 5, len(ids) - 1):
            top = dict(engine.top_logprobs_ids([ids[:q]], len(engine.tokenizer))[0])
            assert plp[q][str(ids[q])]["logprob"] == pytest.approx(top[ids[q]], abs=1e-5)
            best = sorted(top.items(), key=lambda kv: -kv[1])[:3]
            for t, lp in best:
                assert plp[q][str(t)]["logprob"] == pytest.approx(lp, abs=1e-5)
        banned = engine.generate_ids([ids], _params(4))[0][0]
        forced = engine.tokenizer.encode(" dog", add_special_tokens=False)[-1]
        status, out = post(srv.base_url, "/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0,
                                                          "logit_bias": {str(forced): 100}})
        assert status == 200 and out["choices"][0]["text"] == engine.tokenizer.decode([forced] * 4)
        assert out["choices"][0]["text"] != banned.text


def test_prompt_logprobs_of_the_engine_match_transformers_on_the_same_file(engine, tmp_path):
    """The two backends' serving methods agree on the same GGUF (transformers
    dequantises it; F32, so within float rounding)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.llm.backends.hf import HFLLM

    hf = load_llm(str(GGUF), engine="transformers", device="cpu")
    assert isinstance(hf, HFLLM)
    ids = [engine.tokenizer.encode("Answer: A B C. The quick brown fox.", add_special_tokens=False)]
    got = engine.prompt_logprobs_ids(ids, 2, chunk=3, check=lambda: None)[0]
    want = hf.prompt_logprobs_ids(ids, 2, chunk=3, check=lambda: None)[0]
    assert got[0] is None and want[0] is None and len(got) == len(want) == len(ids[0])
    np.testing.assert_allclose([g[0] for g in got[1:]], [w[0] for w in want[1:]], atol=1e-4)
    assert [[t for t, _ in g[1]] for g in got[1:]] == [[t for t, _ in w[1]] for w in want[1:]]


def test_the_server_limits_hold_on_the_engine(engine):
    """Every limit is the server's, not the backend's: the context window,
    the logprob cap, and the request timeout (the engine runs the request's
    check before every forward pass)."""
    with serve(engine, request_timeout=1.0) as srv:
        status, out = post(srv.base_url, "/completions", {"prompt": [1, 2, 3], "max_tokens": 10**6})
        assert status == 400 and "maximum context length is 512" in out["error"]["message"]
        status, out = post(srv.base_url, "/completions", {"prompt": [1, 2, 3], "max_tokens": 1, "logprobs": 21})
        assert status == 400 and "logprobs" in out["error"]["message"]
        calls = []
        real = engine.runner.before_step

        def slow() -> None:
            calls.append(1)
            time.sleep(0.1)
            real()

        engine.runner.before_step = slow
        try:
            status, out = post(srv.base_url, "/completions", {"prompt": [1, 2, 3], "max_tokens": 200, "temperature": 0})
        finally:
            engine.runner.before_step = real
        assert status == 504 and "request_timeout" in out["error"]["message"]
        assert 2 <= len(calls) < 200  # stopped between forward passes, long before the end
    assert not engine._step_checks  # the request's check left with it


def test_the_engine_refuses_a_changed_file_while_serving(tmp_path):
    import shutil

    path = tmp_path / "served.gguf"
    shutil.copy(GGUF, path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
        llm = load_llm(str(path), engine="native", num_threads=1)
    assert isinstance(llm, GGUFLLM)
    with serve(llm) as srv:
        assert post(srv.base_url, "/completions", {"prompt": [1, 2], "max_tokens": 2})[0] == 200
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        status, out = post(srv.base_url, "/completions", {"prompt": [1, 2], "max_tokens": 2})
        assert status == 500 and "changed on disk since it was loaded" in out["error"]["message"]
