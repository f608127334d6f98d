"""Issue 51 item 2: a stream is bounded like a body, and the server can be
watched as vLLM's and llama.cpp's servers are.

* a client that leaves mid-stream frees the model at once: its generation
  stops at the next token (counted through the model's forward passes); a
  stream past ``request_timeout`` ends with an error event and
  ``[DONE]``; a full queue refuses a stream before it starts (503 with
  ``Retry-After``); a stream holds its body budget until it ends;
* ``/health`` is 200 while the model is loaded and the queue has room, 503
  otherwise; ``/metrics`` is Prometheus text (read with Prometheus' own
  parser) with vLLM's names under ``rcn_fast:``;
* every request writes one log line (method, path, status, tokens,
  latency), the prompt only with ``log_prompts``.

The tiny random-weight Llama of test_serve_faults (its end-of-turn tokens
banned, so a generation runs ``max_tokens`` steps; ``KNOBS.delay`` slows
every forward pass so a long request stays long on any machine; no timing
is asserted)."""

from __future__ import annotations

import json
import logging
import os
import re
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.llm.test_serve_faults import KNOBS, TEXT, complete, error_of, llm, request, serve, wait_until  # noqa: E402,F401

GGUF = Path(__file__).resolve().parent / "data" / "converter" / "llama_default.gguf"


def _stream_socket(srv, body: dict) -> socket.socket:
    data = json.dumps({"model": "tiny", "stream": True, **body}).encode()
    s = socket.create_connection(srv.server_address[:2], timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def _read_until(s: socket.socket, pred, limit: int = 1 << 20) -> bytes:
    got = b""
    while not pred(got) and len(got) < limit:
        c = s.recv(65536)
        if not c:
            break
        got += c
    return got


def test_a_client_leaving_mid_stream_stops_its_generation_at_the_next_token(llm, caplog):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv, caplog.at_level(logging.INFO, logger="rcn_fast.serve"):
        KNOBS.delay = 0.02
        s = _stream_socket(srv, {"prompt": ids, "max_tokens": 300, "temperature": 0})
        head = _read_until(s, lambda b: b.count(b"data: ") >= 4)
        assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        at = KNOBS.forwards
        s.close()
        wait_until(lambda: srv.cancelled == 1, "the stream to be cancelled")
        assert KNOBS.forwards - at <= 2  # the pass under way when it left, at most one more: then it stops
        assert not srv._model_lock.locked()
        wait_until(lambda: 'finished_reason="abort"} 1' in srv.render_metrics(), "the request's end to be counted")
        assert srv.inflight.held == 0
        KNOBS.delay = 0.0
        assert complete(srv, {"prompt": ids, "max_tokens": 2})[0] == 200
        [line] = [r.getMessage() for r in caplog.records if "stream" in r.getMessage()]
        assert re.search(r'"POST /v1/completions" 499 prompt_tokens=\d+ completion_tokens=\d+ latency=', line), line


def test_a_stream_past_its_time_budget_ends_with_an_error_event_and_the_next_is_served(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm, request_timeout=0.5) as srv:
        KNOBS.delay = 0.05
        s = _stream_socket(srv, {"prompt": ids, "max_tokens": 200, "temperature": 0})
        raw = _read_until(s, lambda b: b.endswith(b"0\r\n\r\n"))
        s.close()
        events = [json.loads(m) for m in re.findall(rb"data: (\{.*?\})\n\n", raw)]
        assert events and events[-1]["error"]["code"] == 504 and "request_timeout (0.5 s)" in events[-1]["error"]["message"]
        assert b"data: [DONE]\n\n" in raw and all("choices" in e for e in events[:-1])
        KNOBS.delay = 0.0
        assert complete(srv, {"prompt": ids, "max_tokens": 1})[0] == 200


def test_a_full_queue_refuses_a_stream_before_it_starts_and_health_says_so(llm):
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm, max_queue=1) as srv:
        assert request(srv, "GET", "/health") == (200, request(srv, "GET", "/health")[1], {"status": "ok"})
        KNOBS.delay = 0.05
        s = _stream_socket(srv, {"prompt": ids, "max_tokens": 300, "temperature": 0})
        try:
            _read_until(s, lambda b: b.count(b"data: ") >= 2)
            held = srv.inflight.held
            assert held > 0  # the stream holds its body's budget while it runs
            status, headers, out = request(srv, "POST", "/v1/completions",
                                           {"model": "tiny", "prompt": ids, "max_tokens": 2, "stream": True})
            assert "max_queue 1" in error_of(status, out, 503) and headers.get("Retry-After") == "1"
            assert headers["Content-Type"] == "application/json"
            status, _, out = request(srv, "GET", "/health")
            assert status == 503 and "queue is full" in out["error"]["message"]
            metrics = srv.render_metrics()
            assert 'rcn_fast:num_requests_running{model_name="tiny"} 1' in metrics
        finally:
            s.close()
        wait_until(lambda: srv.queued == 0 and srv.inflight.held == 0, "the stream to stop and free its budget")
        KNOBS.delay = 0.0
        assert request(srv, "GET", "/health")[0] == 200


def test_metrics_are_prometheus_text_with_vllms_names(llm):
    parser = pytest.importorskip("prometheus_client.parser")
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:
        used = [complete(srv, {"prompt": ids, "max_tokens": n, "temperature": 0})[2]["usage"] for n in (1, 3, 5)]
        assert complete(srv, {"prompt": ids, "max_tokens": 0})[0] == 400
        counted = ('handler="/v1/completions",method="POST",status="200"} 3', 'status="400"} 1')
        wait_until(lambda: all(c in srv.render_metrics() for c in counted), "the requests to be counted")  # each
        # once its answer is sent
        host, port = srv.server_address[:2]
        import http.client

        conn = http.client.HTTPConnection(host, port, timeout=60)
        for _ in range(2):  # the first scrape is counted once it is answered: the second sees it
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            text = r.read().decode()
        conn.close()
    assert r.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples}
    m = (("model_name", "tiny"),)
    assert {"rcn_fast:num_requests_running", "rcn_fast:num_requests_waiting", "rcn_fast:prompt_tokens",
            "rcn_fast:generation_tokens", "rcn_fast:request_success", "rcn_fast:time_to_first_token_seconds",
            "rcn_fast:e2e_request_latency_seconds", "rcn_fast:request_prompt_tokens",
            "rcn_fast:request_generation_tokens", "http_requests"} <= set(fams)
    assert fams["rcn_fast:time_to_first_token_seconds"].type == "histogram"
    assert value[("rcn_fast:prompt_tokens_total", m)] == sum(u["prompt_tokens"] for u in used)
    assert value[("rcn_fast:generation_tokens_total", m)] == sum(u["completion_tokens"] for u in used) == 9
    assert value[("rcn_fast:request_success_total", (("finished_reason", "length"), *m))] == 3
    assert value[("rcn_fast:time_to_first_token_seconds_count", m)] == 3
    assert value[("rcn_fast:e2e_request_latency_seconds_count", m)] == 3
    assert value[("rcn_fast:request_generation_tokens_bucket", (("le", "5.0"), *m))] == 3
    assert value[("rcn_fast:num_requests_running", m)] == 0 and value[("rcn_fast:num_requests_waiting", m)] == 0
    by = {(h, st): v for (n, lab), v in value.items() if n == "http_requests_total"
          for h, st in [(dict(lab)["handler"], dict(lab)["status"])]}
    assert by[("/v1/completions", "200")] == 3 and by[("/v1/completions", "400")] == 1
    assert by[("/metrics", "200")] == 1


def test_one_log_line_per_request_and_the_prompt_only_when_asked(llm, caplog):
    with caplog.at_level(logging.INFO, logger="rcn_fast.serve"):
        with serve(llm) as srv:
            complete(srv, {"prompt": TEXT, "max_tokens": 2})
            request(srv, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user",
                                                                                          "content": TEXT}]})
            request(srv, "GET", "/health")
        lines = [r.getMessage() for r in caplog.records if r.name == "rcn_fast.serve"]
        assert len(lines) == 3 and not any(TEXT in x for x in lines)
        # each line is written once its answer is sent: a client may be answered (and ask again) first
        assert any(re.fullmatch(r'127\.0\.0\.1:\d+ "POST /v1/completions" 200 prompt_tokens=\d+ completion_tokens=2 '
                                r'latency=\d+\.\d{3}s ttft=\d+\.\d{3}s', x) for x in lines), lines
        assert any('"POST /v1/chat/completions" 200 ' in x for x in lines) and any('"GET /health" 200 ' in x
                                                                                  for x in lines)
        caplog.clear()
        with serve(llm, log_prompts=True) as srv:
            complete(srv, {"prompt": TEXT, "max_tokens": 1})
        [line] = [r.getMessage() for r in caplog.records if r.name == "rcn_fast.serve"]
        assert line.endswith(f"prompt={TEXT!r}")


def test_the_command_line_logs_each_request_and_answers_health(tmp_path):
    env = dict(os.environ, RCN_FAST_CACHE=str(tmp_path / "cache"), RCN_FAST_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.serve", "--model", str(GGUF), "--port", "0", "--name",
                             "tiny", "--log-prompts"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        m = re.search(r"at http://([\d.]+):(\d+)/v1", line)
        assert m, line
        import http.client

        conn = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=60)
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert (r.status, json.loads(r.read())) == (200, {"status": "ok"})
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "hello there", "max_tokens": 2}).encode())
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
        conn.close()
    finally:
        proc.kill()  # the server this test started
        proc.wait(timeout=60)
    err = proc.stderr.read()  # type: ignore[union-attr]
    assert re.search(r'INFO rcn_fast\.serve: 127\.0\.0\.1:\d+ "GET /health" 200 ', err), err
    assert re.search(r'"POST /v1/completions" 200 prompt_tokens=\d+ completion_tokens=2 .*prompt=\'hello there\'',
                     err), err


def test_a_stream_is_answered_in_a_thread_of_its_own_connection(llm):
    """Two streams on two connections: the second waits for the model (first
    come, first served) and both complete; ``[DONE]`` ends each."""
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm) as srv:
        out: list[bytes] = []

        def go() -> None:
            s = _stream_socket(srv, {"prompt": ids, "max_tokens": 6, "temperature": 0})
            out.append(_read_until(s, lambda b: b.endswith(b"0\r\n\r\n")))
            s.close()

        ts = [threading.Thread(target=go) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert len(out) == 2 and all(o.count(b"data: [DONE]") == 1 for o in out)


def test_a_client_that_stops_reading_a_stream_is_dropped_after_read_timeout(llm):
    """Every write of a stream is bounded by ``read_timeout`` (the socket's
    timeout): a client that stops reading is dropped once the buffers
    between them are full (both kept small here, as on a slow path: the
    server's send buffer of accepted sockets, the client's receive
    buffer), its generation stopped and the model freed, long before its
    tokens are all made."""
    ids = list(llm.tokenizer.encode(TEXT))
    with serve(llm, read_timeout=1.0) as srv:
        accept = srv.get_request

        def small_buffers():
            sock, addr = accept()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            return sock, addr

        srv.get_request = small_buffers
        data = json.dumps({"model": "tiny", "stream": True, "prompt": ids, "max_tokens": 480, "temperature": 0,
                           "logprobs": 20}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(60)
        s.connect(srv.server_address[:2])
        try:
            before = KNOBS.forwards
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode()
                      + b"\r\n\r\n" + data)
            wait_until(lambda: srv.cancelled == 1, "the stalled stream to be dropped", 120)
            assert KNOBS.forwards - before < 480  # stopped before its 480 steps
            wait_until(lambda: not srv._model_lock.locked(), "the model to be free", 10)
        finally:
            s.close()
        srv.get_request = accept
        assert complete(srv, {"prompt": ids, "max_tokens": 2})[0] == 200
