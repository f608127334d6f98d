"""``/metrics`` of :mod:`rcn_fast.llm.server.app` in Prometheus' text format
(0.0.4), and the one log line each request writes.

The names are vLLM's with its ``vllm:`` prefix replaced by ``rcn_fast:``
(``rcn_fast:prompt_tokens_total``, ``rcn_fast:time_to_first_token_seconds``
...; the histograms keep vLLM's buckets), each labelled
``model_name``; ``http_requests_total{handler, method, status}`` is the
name vLLM's HTTP instrumentation (prometheus-fastapi-instrumentator)
exposes, with the exact status code. ``rcn_fast:request_bytes_in_flight``
(the body budget held now) and ``rcn_fast:memory_errors_total`` are this
server's own. No Prometheus library is needed.
"""

from __future__ import annotations

import bisect
import logging
import reprlib
import threading
from typing import Any, Sequence

#: The logger of the request log lines (``python -m rcn_fast.serve`` prints it on stderr).
log = logging.getLogger("rcn_fast.serve")
#: Characters of a prompt a log line shows (``--log-prompts``).
PROMPT_CHARS = 2000

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


def buckets_1_2_5(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50 ... up to ``limit`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = list(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, run = [], 0
        for b, c in zip([*self.bounds, float("inf")], self.counts):
            run += c
            le = "+Inf" if b == float("inf") else repr(float(b))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {run}')
        return out + [f"{name}_sum{{{labels}}} {self.sum!r}", f"{name}_count{{{labels}}} {self.count}"]


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class ServerMetrics:
    """The server's counters, gauges and histograms (thread-safe)."""

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.labels = f'model_name="{_label(model_name)}"'
        self._lock = threading.Lock()
        self.http: dict[tuple[str, str, int], int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {}
        self.memory_errors = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.req_prompt = Histogram(buckets_1_2_5(max_model_len))
        self.req_generation = Histogram(buckets_1_2_5(max_model_len))

    def finished(self, handler: str, method: str, status: int, *, prompt_tokens: int = 0, generated: int = 0,
                 latency: float | None = None, ttft: float | None = None, reasons: Sequence[str] = ()) -> None:
        """One answered request: its route, status, tokens, latencies and
        the finish reasons of its choices (``"abort"``: stopped)."""
        with self._lock:
            key = (handler, method, int(status))
            self.http[key] = self.http.get(key, 0) + 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generated
            for r in reasons:
                self.success[r] = self.success.get(r, 0) + 1
            if ttft is not None:
                self.ttft.observe(ttft)
            if reasons:  # a request that ran the model
                self.req_prompt.observe(prompt_tokens)
                self.req_generation.observe(generated)
                if latency is not None:
                    self.latency.observe(latency)

    def memory_error(self) -> None:
        with self._lock:
            self.memory_errors += 1

    def render(self, running: int, waiting: int, inflight_bytes: int) -> str:
        """The exposition text (``text/plain; version=0.0.4``)."""
        L = self.labels
        out: list[str] = []

        def metric(name: str, kind: str, doc: str, lines: list[str]) -> None:
            out.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *lines])

        with self._lock:
            metric("rcn_fast:num_requests_running", "gauge", "Number of requests holding the model.",
                   [f"rcn_fast:num_requests_running{{{L}}} {running}"])
            metric("rcn_fast:num_requests_waiting", "gauge", "Number of requests waiting for the model.",
                   [f"rcn_fast:num_requests_waiting{{{L}}} {waiting}"])
            metric("rcn_fast:request_bytes_in_flight", "gauge",
                   "Bytes of request bodies and their parses held now (max_inflight_bytes caps it).",
                   [f"rcn_fast:request_bytes_in_flight{{{L}}} {inflight_bytes}"])
            metric("rcn_fast:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                   [f"rcn_fast:prompt_tokens_total{{{L}}} {self.prompt_tokens}"])
            metric("rcn_fast:generation_tokens_total", "counter", "Number of generation tokens processed.",
                   [f"rcn_fast:generation_tokens_total{{{L}}} {self.generation_tokens}"])
            metric("rcn_fast:request_success_total", "counter", "Count of successfully processed requests.",
                   [f'rcn_fast:request_success_total{{{L},finished_reason="{r}"}} {n}'
                    for r, n in sorted(self.success.items())])
            metric("rcn_fast:memory_errors_total", "counter", "Requests answered 503 after a MemoryError.",
                   [f"rcn_fast:memory_errors_total{{{L}}} {self.memory_errors}"])
            metric("http_requests_total", "counter", "Total number of requests by method, status and handler.",
                   [f'http_requests_total{{handler="{_label(h)}",method="{m}",status="{s}"}} {n}'
                    for (h, m, s), n in sorted(self.http.items())])
            for name, h, doc in (
                ("rcn_fast:time_to_first_token_seconds", self.ttft, "Histogram of time to first token in seconds."),
                ("rcn_fast:e2e_request_latency_seconds", self.latency, "Histogram of e2e request latency in seconds."),
                ("rcn_fast:request_prompt_tokens", self.req_prompt, "Number of prefill tokens processed."),
                ("rcn_fast:request_generation_tokens", self.req_generation, "Number of generation tokens processed."),
            ):
                metric(name, "histogram", doc, h.lines(name, L))
        return "\n".join(out) + "\n"


def _shown(prompt: Any) -> str:
    """A prompt for the log: text as it is, token ids and lists shortened."""
    if isinstance(prompt, str):
        return prompt
    short = reprlib.Repr()
    short.maxlist, short.maxstring, short.maxlevel = 64, PROMPT_CHARS, 3
    return short.repr(prompt)


def log_request(client: Any, method: str, path: str, status: int, *, prompt_tokens: int, generated: int,
                latency: float, ttft: float | None = None, stream: bool = False, prompt: Any = None) -> None:
    """One INFO line of ``rcn_fast.serve`` per request: client, method,
    path, status, tokens and latency; the prompt only when given
    (``--log-prompts``: a chat's rendered text, a completion's ``prompt``),
    cut to :data:`PROMPT_CHARS` characters."""
    where = f"{client[0]}:{client[1]}" if isinstance(client, tuple) and len(client) >= 2 else str(client)
    line = (f'{where} "{method} {path[:200]}" {status} prompt_tokens={prompt_tokens} completion_tokens={generated} '
            f"latency={latency:.3f}s")
    if ttft is not None:
        line += f" ttft={ttft:.3f}s"
    if stream:
        line += " stream"
    if prompt is not None:
        text = _shown(prompt)
        line += f" prompt={text[:PROMPT_CHARS]!r}" + (f" (+{len(text) - PROMPT_CHARS} chars)"
                                                      if len(text) > PROMPT_CHARS else "")
    log.info(line)


__all__ = ["ServerMetrics", "Histogram", "log_request", "buckets_1_2_5", "log", "TTFT_BUCKETS", "LATENCY_BUCKETS"]
