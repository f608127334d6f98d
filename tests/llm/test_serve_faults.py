"""Fault injection against ``python -m rcn_fast.serve`` (rcn_fast.llm.server.app):
requests an attacker or an unlucky client sends, each answered the way vLLM
would answer it (or dropped) without taking the server over. Every server
runs in-process on 127.0.0.1 over a tiny random-weight Llama built in code;
every socket and request has a timeout, every wait loop a bound.

The model of this module never emits its end-of-turn or pad tokens (a
forward hook sets their logits to -inf), so a generation runs exactly
``max_tokens`` steps; ``KNOBS.delay`` slows every forward pass so that a
long request stays long on any machine (no timing is asserted)."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.server.app import make_server  # noqa: E402

TEXT = "Knowledge connects concepts."


class Knobs:
    delay = 0.0  # seconds slept before each forward pass of the full model
    forwards = 0  # forward passes of the full model so far


KNOBS = Knobs()


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    llm = load_llm(tiny_llama_dir, batch_size=3, device="cpu")
    banned = sorted(set(llm.eos_ids) | {llm.pad_id})

    def pre(module: Any, args: Any) -> None:
        KNOBS.forwards += 1
        if KNOBS.delay:
            time.sleep(KNOBS.delay)

    def post(module: Any, args: Any, out: Any) -> None:
        out.logits[..., banned] = float("-inf")

    h1 = llm.model.register_forward_pre_hook(pre)
    h2 = llm.model.register_forward_hook(post)
    yield llm
    h1.remove()
    h2.remove()
    KNOBS.delay = 0.0


@contextlib.contextmanager
def serve(llm, **kw):
    srv = make_server(llm, "127.0.0.1", 0, model_name="tiny", **kw)
    srv.start()
    try:
        yield srv
    finally:
        KNOBS.delay = 0.0
        srv.shutdown()
        srv.server_close()


def request(srv, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
            timeout: float = 60.0) -> tuple[int, dict[str, str], dict]:
    host, port = srv.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def complete(srv, body: dict, **kw) -> tuple[int, dict[str, str], dict]:
    return request(srv, "POST", "/v1/completions", {"model": "tiny", **body}, **kw)


def error_of(status: int, out: dict, want: int) -> str:
    """The OpenAI-shaped error message of a ``want`` answer."""
    assert status == want, (status, out)
    err = out["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == want
    return err["message"]


def raw(srv, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers
    until it closes (or ``timeout``)."""
    with socket.create_connection(srv.server_address[:2], timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                c = s.recv(65536)
            except ConnectionResetError:
                break
            if not c:
                break
            chunks.append(c)
            if b"\r\n\r\n" in b"".join(chunks):
                head, _, rest = b"".join(chunks).partition(b"\r\n\r\n")
                n = [int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")) if k.lower() == b"content-length"]
                if n and len(rest) >= n[0]:
                    break
        return b"".join(chunks)


def wait_until(cond, what: str, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


# ------------------------------------------------------------ context window, caps


def test_prompt_over_the_context_and_max_tokens_beyond_it_are_400_with_the_numbers(llm):
    ctx = llm.context_length
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:
        long = (ids * (ctx // len(ids) + 41))[: ctx + 40]
        msg = error_of(*complete(srv, {"prompt": long, "max_tokens": 1})[::2], 400)
        assert f"maximum context length is {ctx} tokens" in msg and f"{ctx + 40} input tokens" in msg
        left = ctx - len(ids)
        msg = error_of(*complete(srv, {"prompt": ids, "max_tokens": left + 1})[::2], 400)
        assert f"{ctx + 1} tokens ({len(ids)} in the prompt, {left + 1} in the completion)" in msg
        assert "max_tokens" in msg
        for name in ("max_tokens", "max_completion_tokens"):
            msg = error_of(*complete(srv, {"prompt": ids, name: 1000000})[::2], 400)
            assert "1000000 in the completion" in msg and name in msg
        chat = {"model": "tiny", "messages": [{"role": "user", "content": TEXT * 200}], "max_tokens": 1}
        assert "input tokens" in error_of(*request(srv, "POST", "/v1/chat/completions", chat)[::2], 400)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 1000000}
        assert "in the completion" in error_of(*request(srv, "POST", "/v1/chat/completions", chat)[::2], 400)
        # what is left of the window is allowed
        status, _, out = complete(srv, {"prompt": ids, "max_tokens": 2, "temperature": 0})
        assert status == 200 and out["usage"]["completion_tokens"] == 2
        status, _, out = request(srv, "GET", "/v1/models")
        assert out["data"][0]["max_model_len"] == ctx


def test_n_sequences_and_log_probs_are_capped(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:  # the defaults: n <= 128
        msg = error_of(*complete(srv, {"prompt": ids, "n": 129, "max_tokens": 1})[::2], 400)
        assert msg.startswith("n:") and "128" in msg
    with serve(llm, max_seqs=4, max_logprobs=3) as srv:
        msg = error_of(*complete(srv, {"prompt": [ids, ids, ids], "n": 2, "max_tokens": 1})[::2], 400)
        assert "6 sequences" in msg and "max_seqs (4)" in msg
        for field in ("logprobs", "prompt_logprobs"):
            msg = error_of(*complete(srv, {"prompt": ids, "max_tokens": 1, field: 4})[::2], 400)
            assert msg.startswith(f"{field}:") and "max_logprobs (3)" in msg
        chat = {"model": "tiny", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 1,
                "logprobs": True, "top_logprobs": 4}
        assert "top_logprobs" in error_of(*request(srv, "POST", "/v1/chat/completions", chat)[::2], 400)
        msg = error_of(*complete(srv, {"prompt": ids, "max_tokens": 1, "stop": ["x"] * 17})[::2], 400)
        assert msg.startswith("stop:")
        status, _, out = complete(srv, {"prompt": [ids, ids], "n": 2, "max_tokens": 1, "logprobs": 3})
        assert status == 200 and len(out["choices"]) == 4


def test_prompt_logprobs_run_in_chunks_and_their_size_is_capped(llm):
    import torch

    ids = list(llm.tokenizer.encode(TEXT * 4))
    long = (ids * 40)[:300]
    head = llm.model.get_output_embeddings()
    widths: list[int] = []
    h = head.register_forward_hook(lambda m, a, out: widths.append(out.reshape(-1, out.shape[-1]).shape[0]))
    try:
        with serve(llm) as srv:  # the defaults: 256 positions at a time
            assert complete(srv, {"prompt": long, "max_tokens": 1, "prompt_logprobs": 1})[0] == 200
            assert widths and max(widths) <= 256  # never the [T, vocab] logits of the whole prompt
            widths.clear()
        with serve(llm, logprob_chunk=4, max_logprob_entries=len(ids) * 3) as srv:
            status, _, echo = complete(srv, {"prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 2,
                                             "temperature": 0})
            assert status == 200
            status, _, vllm = complete(srv, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2, "temperature": 0})
            assert status == 200
            # len(ids) x 1 x (3 + 1) entries: over the cap
            msg = error_of(*complete(srv, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 3})[::2], 400)
            assert "max_logprob_entries" in msg
    finally:
        h.remove()
    assert widths and max(widths) <= 4
    with torch.no_grad():
        base = getattr(llm.model, llm.model.base_model_prefix)
        full = torch.log_softmax(head(base(torch.tensor([ids])).last_hidden_state[0]).double(), -1)
    tl = echo["choices"][0]["logprobs"]["token_logprobs"]
    plp = vllm["choices"][0]["prompt_logprobs"]
    assert tl[0] is None and plp[0] is None and len(plp) == len(ids)
    for q in range(1, len(ids)):
        assert tl[q] == pytest.approx(full[q - 1, ids[q]].item(), abs=1e-4)
        top2 = torch.topk(full[q - 1], 2).indices.tolist()
        assert {int(t) for t in plp[q]} == {ids[q], *top2}


# ------------------------------------------------------------ malformed requests


def test_malformed_content_length_is_400_and_a_huge_body_413(llm):
    with serve(llm) as srv:  # the defaults
        for value in (b"abc", b"-5", b"1e3", b" "):
            out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n{}")
            assert out.startswith(b"HTTP/1.1 400"), (value, out[:200])
            assert b"Content-Length" in out
        # the body is never read: the answer comes before it is sent
        out = raw(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 413") and b"max_body_bytes (8388608)" in out
    with serve(llm, max_body_bytes=1000) as srv:
        big = json.dumps({"model": "tiny", "prompt": "x" * 2000}).encode()
        assert error_of(*request(srv, "POST", "/v1/completions", big)[::2], 413)
        status, _, _ = request(srv, "GET", "/v1/models")
        assert status == 200  # the server is still up


BAD_NUMBERS = [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -1), ("temperature", True),
    ("top_p", 2), ("top_p", 0), ("top_p", float("nan")), ("max_tokens", -1), ("max_tokens", 0),
    ("max_tokens", 1.5), ("max_completion_tokens", -3), ("n", 0), ("n", float("nan")), ("seed", "x"),
    ("seed", float("inf")), ("logprobs", -1), ("prompt_logprobs", float("nan")),
]


def test_non_finite_or_out_of_range_numbers_are_400_naming_the_field(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:
        for field, value in BAD_NUMBERS:
            body = {"model": "tiny", "prompt": ids, "max_tokens": 1, field: value}
            # json.dumps writes NaN / Infinity literals, which Python's json (and so the server) reads
            status, _, out = request(srv, "POST", "/v1/completions", json.dumps(body).encode())
            assert status == 400 and error_of(status, out, 400).startswith(f"{field}:"), (field, value, out)
            if field in ("logprobs", "prompt_logprobs"):
                continue
            chat = {"messages": [{"role": "user", "content": TEXT}], **body}
            chat.pop("prompt")
            status, _, out = request(srv, "POST", "/v1/chat/completions", json.dumps(chat).encode())
            assert status == 400 and error_of(status, out, 400).startswith(f"{field}:"), (field, value, out)
        assert request(srv, "GET", "/v1/models")[0] == 200


# ------------------------------------------------------------ connections


def test_stalled_and_dripping_connections_are_dropped(llm):
    with serve(llm, read_timeout=0.5) as srv:
        # headers that never end, then a body that never comes
        for data in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro"):
            with socket.create_connection(srv.server_address[:2], timeout=20) as s:
                s.sendall(data)
                assert s.recv(100) == b""  # closed by the server, not by our 20 s timeout
        # one header byte every 50 ms: each read is within the socket timeout, the request is not
        with socket.create_connection(srv.server_address[:2], timeout=20) as s:
            start, closed = time.monotonic(), False
            for b in b"POST /v1/completions HTTP/1.1\r\nX-Drip: " + b"a" * 400:
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    closed = True
                    break
                if time.monotonic() - start > 30:
                    break
                time.sleep(0.05)
                if select.select([s], [], [], 0)[0]:
                    try:
                        closed = s.recv(1) == b""
                    except OSError:
                        closed = True
                    if closed:
                        break
            assert closed
        # an idle kept-alive connection is closed too
        host, port = srv.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=20)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().read()
        assert conn.sock.recv(1) == b""
        conn.close()
        assert request(srv, "GET", "/v1/models")[0] == 200


def test_connections_beyond_the_cap_are_503_and_freed_slots_serve_again(llm):
    with serve(llm, max_connections=3, read_timeout=20) as srv:
        idle = [socket.create_connection(srv.server_address[:2], timeout=20) for _ in range(3)]
        try:
            wait_until(lambda: srv._slots._value == 0, "3 connections accepted")
            out = raw(srv, b"")
            assert out.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in out and b"max_connections (3)" in out
        finally:
            for s in idle:
                s.close()
        wait_until(lambda: srv._slots._value == 3, "the closed connections' slots")
        assert request(srv, "GET", "/v1/models")[0] == 200


# ------------------------------------------------------------ long requests


def _start(srv, body: dict, box: dict) -> threading.Thread:
    def go() -> None:
        try:
            box["answer"] = complete(srv, body, timeout=120)
        except Exception as exc:  # noqa: BLE001
            box["answer"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_client_disconnect_stops_generation(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:
        KNOBS.delay = 0.02
        before = KNOBS.forwards
        body = json.dumps({"model": "tiny", "prompt": ids, "max_tokens": 300, "temperature": 0}).encode()
        s = socket.create_connection(srv.server_address[:2], timeout=20)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: KNOBS.forwards - before >= 3, "the generation to start")
        s.close()
        assert srv._model_lock.acquire(timeout=60)  # the model is free again ...
        srv._model_lock.release()
        assert KNOBS.forwards - before < 150  # ... long before its 300 tokens
        wait_until(lambda: srv.cancelled == 1, "the cancellation to be counted", 10)


def test_a_request_past_its_time_budget_is_504_and_the_next_is_served(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm, request_timeout=0.5) as srv:
        KNOBS.delay = 0.05
        before = KNOBS.forwards
        slow: dict = {}
        t = _start(srv, {"prompt": ids, "max_tokens": 100, "temperature": 0}, slow)
        wait_until(lambda: KNOBS.forwards - before >= 1, "the slow request to start")
        status, _, out = complete(srv, {"prompt": ids, "max_tokens": 1, "temperature": 0})  # waits behind it
        t.join(120)
        assert status == 200 and out["usage"]["completion_tokens"] == 1
        msg = error_of(slow["answer"][0], slow["answer"][2], 504)
        assert "request_timeout (0.5 s)" in msg
        assert KNOBS.forwards - before < 100


def test_a_full_queue_is_503_with_retry_after(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm, max_queue=1, request_timeout=60) as srv:
        KNOBS.delay = 0.05
        before = KNOBS.forwards
        body = json.dumps({"model": "tiny", "prompt": ids, "max_tokens": 300, "temperature": 0}).encode()
        s = socket.create_connection(srv.server_address[:2], timeout=20)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body)
            wait_until(lambda: KNOBS.forwards - before >= 1, "the first request to hold the model")
            status, headers, out = complete(srv, {"prompt": ids, "max_tokens": 1})
            assert "max_queue 1" in error_of(status, out, 503) and headers.get("Retry-After") == "1"
        finally:
            s.close()
        wait_until(lambda: srv.queued == 0, "the first request to stop")
        KNOBS.delay = 0.0
        assert complete(srv, {"prompt": ids, "max_tokens": 1})[0] == 200


def test_the_model_goes_to_waiting_requests_in_arrival_order():
    from rcn_fast.llm.server.connections import FifoLock
    from rcn_fast.llm.server.limits import Cancelled

    lock, order, gone = FifoLock(), [], threading.Event()
    lock.acquire()

    def waiter(i: int) -> None:
        try:
            lock.acquire_unless(lambda: i == 2 and gone.is_set(), poll=0.01)
        except Cancelled:
            order.append(-i)
            return
        order.append(i)
        lock.release()

    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=waiter, args=(i,), daemon=True))
        threads[-1].start()
        wait_until(lambda: len(lock._waiting) == i + 1, f"waiter {i} to queue", 10)
    gone.set()  # waiter 2's client leaves
    wait_until(lambda: order == [-2], "waiter 2 to leave", 10)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == [-2, 0, 1, 3, 4] and not lock.locked()
    assert lock.acquire(timeout=0.01) and not lock.acquire(blocking=False) and not lock.acquire(timeout=0.01)
    lock.release()


def test_a_request_whose_client_leaves_while_queued_leaves_the_queue(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    body = json.dumps({"model": "tiny", "prompt": ids, "max_tokens": 300, "temperature": 0}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    with serve(llm, max_queue=2, request_timeout=60) as srv:
        KNOBS.delay = 0.05
        before = KNOBS.forwards
        first = socket.create_connection(srv.server_address[:2], timeout=20)
        second = socket.create_connection(srv.server_address[:2], timeout=20)
        try:
            first.sendall(head + body)
            wait_until(lambda: KNOBS.forwards - before >= 1, "the first request to hold the model")
            second.sendall(head + body)
            wait_until(lambda: srv.queued == 2, "the second request to queue")
            second.close()
            wait_until(lambda: srv.queued == 1, "the second request to leave the queue")
            assert srv._model_lock.locked()  # while the first still runs
        finally:
            first.close()
            second.close()
        wait_until(lambda: srv.queued == 0, "the first request to stop")
        assert srv.cancelled == 2


# ------------------------------------------------------------ access


def test_api_key_is_required_when_set(llm):
    from rcn_fast.llm.server.connections import exposure_warning

    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm, api_key="s3cret") as srv:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            assert "API key" in error_of(*request(srv, "GET", "/v1/models", headers=headers)[::2], 401)
            body = {"model": "tiny", "prompt": ids, "max_tokens": 1}
            assert error_of(*request(srv, "POST", "/v1/completions", body, headers=headers)[::2], 401)
        ok = {"Authorization": "Bearer s3cret"}
        assert request(srv, "GET", "/v1/models", headers=ok)[0] == 200
        assert request(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": 1},
                       headers=ok)[0] == 200
    with serve(llm) as srv:  # off by default (loopback)
        assert request(srv, "GET", "/v1/models")[0] == 200
    assert "--api-key" in exposure_warning("0.0.0.0", None) and "RCN_FAST_API_KEY" in exposure_warning("::", None)
    assert exposure_warning("0.0.0.0", "k") is None
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("localhost", None) is None


def test_cli_bad_model_busy_port_and_bad_limits_are_one_message_and_exit_2(tiny_llama_dir, tmp_path, capsys):
    from rcn_fast.llm.server.cli import main

    def fails(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("error:") == 1
        return err

    assert "--model" in fails(["--model", str(tmp_path / "missing")])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        err = fails(["--model", str(tiny_llama_dir), "--port", str(port), "--device", "cpu"])
        assert f"--port {port}" in err and "in use" in err
    assert "max_n" in fails(["--model", str(tiny_llama_dir), "--max-n", "0"])
    assert "larger than the 512-token context" in fails(["--model", str(tiny_llama_dir), "--port", "0",
                                                        "--max-model-len", "100000", "--device", "cpu"])


def test_cli_reads_the_api_key_from_the_environment(tiny_llama_dir):
    """``python -m rcn_fast.serve`` with ``RCN_FAST_API_KEY`` set (and no
    ``--api-key``) refuses requests without that key; no warning on loopback."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "RCN_FAST_API_KEY": "from-env"}
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.serve", "--model", str(tiny_llama_dir), "--port", "0",
                             "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line, end = "", time.monotonic() + 120
        while "serving" not in line:
            if time.monotonic() > end or proc.poll() is not None:
                pytest.fail(f"the server did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
        host, port = re.search(r"http://([\d.]+):(\d+)/v1", line).groups()

        def models(headers: dict[str, str]) -> int:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                conn.request("GET", "/v1/models", headers=headers)
                return conn.getresponse().status
            finally:
                conn.close()

        assert models({}) == 401 and models({"Authorization": "Bearer nope"}) == 401
        assert models({"Authorization": "Bearer from-env"}) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "warning" not in proc.stderr.read()
