"""Issue 53 item 3 (N2): budgets on everything a request body can make.

On fca19ce ten 8 MiB bodies of ``{"junk": [{}, {}, ...]}`` -- a field the
server never reads -- took ``python -m rcn_fast.serve`` from 99 MB to
5.0 GB; with twenty, handler threads died of MemoryError and the server
never answered again. Here the body is measured on its bytes before it is
parsed (rcn_fast.llm.server.body), every request's bytes are charged to
one server-wide cap, and a MemoryError that still happens is a 503 after
which the server goes on. The servers of the subprocess tests run the real
command line over the tiny GGUF of tests/llm/data (the native engine, no
torch) under ``RLIMIT_AS`` (set with ``prlimit`` once it listens:
``MALLOC_ARENA_MAX=2`` keeps glibc's per-thread arenas from reserving
address space the limit would count)."""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import select
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from rcn_fast.llm.server.body import InflightBytes, parse_request, scan_body, scan_cost
from rcn_fast.llm.server.limits import APIError, ServeLimits

GGUF = Path(__file__).resolve().parent / "data" / "converter" / "llama_default.gguf"
MIB = 1 << 20


def junk(size: int) -> bytes:
    """The N2 body: ``{"junk": [{}, {}, ...]}`` of at most ``size`` bytes."""
    n = (size - 64) // 3
    return b'{"junk":[' + b"{}," * n + b'{}],"prompt":"hi","max_tokens":1}'


# ------------------------------------------------------------ the scan, in process


def test_a_junk_body_is_refused_for_its_node_count_before_any_object_exists():
    raw = junk(8 * MIB)
    tracemalloc.start()
    with pytest.raises(APIError) as e:
        parse_request(raw, ServeLimits())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert e.value.status == 400
    m = re.match(r"request body: ([\d,]+) JSON values and keys, more than the server's max_json_nodes \(1,000,000\)",
                 str(e.value))
    assert m and int(m.group(1).replace(",", "")) > 2_796_000, str(e.value)  # each {} counts, and its comma
    assert peak < scan_cost(len(raw)) - len(raw) + MIB  # the scan's blocks, not 2.8 million dicts (~200 MB)


@pytest.mark.parametrize("raw, want", [
    (b'{"a": "' + b"x" * 5000 + b'"}', "max_json_string_bytes (4,096)"),
    (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", "nested too deeply (66 levels"),
    (b'{"a": "[[[[' + b"[" * 100 + b'", "b": [' + b"1," * 2000 + b"1]}", "max_json_nodes (1,000)"),
])
def test_each_budget_names_itself(raw, want):
    lim = ServeLimits(max_json_nodes=1000, max_json_string_bytes=4096, max_json_depth=64)
    with pytest.raises(APIError, match=re.escape(want)):
        parse_request(raw, lim)


def _values_and_keys(v) -> int:
    if isinstance(v, dict):
        return 1 + sum(1 + _values_and_keys(x) for x in v.values())
    if isinstance(v, list):
        return 1 + sum(_values_and_keys(x) for x in v)
    return 1


def _depth(v) -> int:
    if isinstance(v, (dict, list)):
        return 1 + max((_depth(x) for x in (v.values() if isinstance(v, dict) else v)), default=0)
    return 0


def _string_bytes(raw: bytes) -> int:
    return sum(len(m.group(0)) - 2 for m in re.finditer(rb'"(?:[^"\\]|\\.)*"', raw, re.S))


def _empty_containers(v) -> int:
    if isinstance(v, (dict, list)):
        inner = v.values() if isinstance(v, dict) else v
        return (not v) + sum(_empty_containers(x) for x in inner)
    return 0


def test_the_scan_counts_what_the_parser_makes_on_every_kind_of_json():
    """Against a plain reference (the parsed object itself): the count is
    the values and keys plus the empty containers (1 + commas + colons +
    opening brackets: every value but the first follows one of them); the
    depth and the string bytes are exact; escapes and brackets inside
    strings never count. A generated JSON grammar (hypothesis), ASCII and
    not, with a padding string that moves it across the scan's blocks."""
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies
    chars = st.sampled_from(list('ab"\\[]{},:\u00e9\U0001f600\n'))
    scalars = st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=False) \
        | st.text(alphabet=chars, max_size=12)
    values = st.recursive(scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(
        st.text(alphabet=chars, max_size=4), c, max_size=5), max_leaves=40)
    wide = ServeLimits(max_json_nodes=10**9, max_json_depth=10**6, max_json_string_bytes=10**9)

    @hyp.settings(max_examples=200, deadline=None, derandomize=True)
    @hyp.given(st.dictionaries(st.text(max_size=3), values, max_size=4), st.integers(0, 7),
               st.integers(0, 300), st.booleans())
    def check(obj, pad, shift, ascii_only):
        if pad >= 6:  # a string across the first block boundary (256 KiB), its end shifted byte by byte
            obj = {"pad": "\\" * (pad % 2) + "x" * ((1 << 18) - 300 + shift), **obj}
        raw = json.dumps(obj, ensure_ascii=ascii_only).encode()
        shape = scan_body(raw, wide)
        assert shape.nodes == _values_and_keys(obj) + _empty_containers(obj)
        assert shape.string_bytes == _string_bytes(raw)
        try:  # the depth is computed (and named) once more brackets open than max_json_depth
            scan_body(raw, ServeLimits(max_json_nodes=10**9, max_json_depth=1, max_json_string_bytes=10**9))
            assert _depth(obj) <= 1
        except APIError as e:
            assert f"nested too deeply ({_depth(obj)} levels" in str(e)
        assert parse_request(raw, wide) == obj

    check()


def test_escapes_across_the_scans_blocks():
    """A run of backslashes ending at or near a block boundary, odd and
    even, then a quote: escaped (odd) or closing (even), as JSON reads it."""
    lim = ServeLimits(max_json_nodes=10**9, max_json_string_bytes=10**9)
    for run in range(0, 6):
        for end in range((1 << 18) - 4, (1 << 18) + 4):
            head = b'{"a":"' + b"x" * (end - 6 - run)
            tail = b'"[,:{"' if run % 2 else b'"'  # odd: an escaped quote, brackets in the string, its end
            text = head + b"\\" * run + tail + b', "b": [1, 2]}'
            body = json.loads(text)
            shape = scan_body(text, lim)
            assert shape.nodes == _values_and_keys(body), (run, end)
            assert shape.string_bytes == _string_bytes(text), (run, end)


@pytest.mark.parametrize("item", [b"{}", b"[]", b'{"a":1}', b"[[]]", b"12345678901234567890123456789012345678",
                                  b"1.5e300", b'"a"', b'""', b'"\\ud83d\\ude00"', '"\U0001f600"'.encode(), b"true",
                                  b"null", b'{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9}'])
def test_the_charge_bounds_what_the_parse_allocates(item):
    """parse_cost (and the scan's own cost) is an upper bound of the
    memory ``tracemalloc`` sees the whole parse take, for every kind of
    JSON value."""
    raw = b'{"junk":[' + b",".join([item] * 50_000) + b"]}"
    lim = ServeLimits(max_json_nodes=10**9, max_json_string_bytes=10**9)
    cost = scan_body(raw, lim).cost + scan_cost(len(raw)) - len(raw)
    tracemalloc.start()
    try:
        body = parse_request(raw, lim)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body["junk"]) == 50_000 and peak <= cost, (peak, cost)


def test_the_in_flight_cap_refuses_at_once_with_retry_after():
    cap = InflightBytes(1000)
    a, b = [0], [0]
    cap.charge(600, a)
    with pytest.raises(APIError) as e:
        cap.charge(600, b)
    assert e.value.status == 503 and e.value.headers == {"Retry-After": "1"} and "max_inflight_bytes (1,000)" in str(e.value)
    with pytest.raises(APIError) as e:
        cap.charge(1001, [0])
    assert e.value.status == 413
    cap.release(a)
    cap.charge(600, b)
    assert cap.held == 600 and b == [600]


# ------------------------------------------------------------ the server under RLIMIT_AS


class Served:
    """``python -m rcn_fast.serve`` over the tiny GGUF, its address space
    limited to what it holds once listening plus ``headroom`` bytes."""

    def __init__(self, tmp_path: Path, headroom: int, *args: str) -> None:
        env = dict(os.environ, RCN_FAST_CACHE=str(tmp_path / "cache"), RCN_FAST_NUM_THREADS="1", MALLOC_ARENA_MAX="2")
        self.proc = subprocess.Popen([sys.executable, "-m", "rcn_fast.serve", "--model", str(GGUF), "--port", "0",
                                      "--name", "tiny", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], 180)
        line = self.proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        m = re.search(r"at http://([\d.]+):(\d+)/v1", line)
        if not m:
            self.close()
            pytest.fail(f"the server did not start: {line!r}")
        self.host, self.port = m.group(1), int(m.group(2))
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        vm = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
        resource.prlimit(self.proc.pid, resource.RLIMIT_AS, (vm + headroom, vm + headroom))

    def post(self, body: bytes, timeout: float = 60.0) -> tuple[int, str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.kill()  # the server this test started
        self.proc.wait(timeout=60)


def _flood(srv: Served, bodies: list[bytes]) -> list[object]:
    out: list[object] = [None] * len(bodies)

    def go(i: int) -> None:
        try:
            out[i] = srv.post(bodies[i], timeout=120)
        except Exception as exc:  # noqa: BLE001 -- a refused or reset connection is an answer too
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    return out


NORMAL = json.dumps({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}).encode()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit and /proc are Linux's")
def test_n2_twenty_junk_bodies_under_rlimit_as_and_the_server_still_answers(tmp_path):
    """The repro of N2: twenty 8 MiB junk bodies at once, the server limited
    to 1 GiB more address space than it holds idle. Each is refused for its
    node count (400) and the server answers the next request."""
    srv = Served(tmp_path, 1 << 30)
    try:
        assert srv.post(NORMAL)[0] == 200
        answers = _flood(srv, [junk(8 * MIB)] * 20)
        statuses = [a[0] if isinstance(a, tuple) else type(a).__name__ for a in answers]
        assert all(a[0] in (400, 503) for a in answers if isinstance(a, tuple)), statuses
        assert any(isinstance(a, tuple) and a[0] == 400 and "max_json_nodes" in a[1] for a in answers), statuses
        status, out = srv.post(NORMAL)
        assert status == 200, out
    finally:
        srv.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prlimit and /proc are Linux's")
def test_a_memory_error_in_a_handler_is_503_and_the_server_goes_on(tmp_path):
    """With the body budgets opened wide, a junk body's parse (~250 MB of
    dicts) cannot fit in 160 MB of headroom: MemoryError inside the
    handler, answered 503 with Retry-After; the server keeps serving."""
    srv = Served(tmp_path, 160 * MIB, "--max-json-nodes", str(10**9), "--max-inflight-bytes", str(1 << 40),
                 "--max-json-string-bytes", str(1 << 30))
    try:
        for round_ in range(2):
            answers = _flood(srv, [junk(8 * MIB)] * 3)
            tuples = [a for a in answers if isinstance(a, tuple)]
            assert any(s == 503 and "ran out of memory" in o for s, o in tuples), answers
            status, out = srv.post(NORMAL)
            assert status == 200, (round_, out)
        assert srv.proc.poll() is None
    finally:
        srv.close()
