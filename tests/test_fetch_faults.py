"""Faults of pinned URL downloads (rcn_fast.data.fetch): a body far larger
than the pinned file, a server that drips bytes, a body cut short, SIGTERM
in the middle, stale ``.part-*`` files. Servers listen on 127.0.0.1 only,
in a thread, and every loop is bounded."""

from __future__ import annotations

import hashlib
import http.server
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rcn_fast.data.fetch import FetchError, cached_path, fetch_pinned

BODY = b'{"id": "q1", "question": {"stem": "?", "choices": [{"label": "A", "text": "a"}]}, "answerKey": "A"}\n' * 220
SHA = hashlib.sha256(BODY).hexdigest()
ROOT = Path(__file__).resolve().parents[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _send(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client went away
            return False
        self.server.sent += len(data)
        return True

    def do_GET(self):  # noqa: N802 - http.server's naming
        mode = self.path.strip("/").split("?")[0]
        self.server.hits.append(mode)
        if mode == "ok":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self._send(BODY)
        elif mode == "huge":  # 64 MiB with no length announced: the client must stop early
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            block = b"x" * (64 << 10)
            for _ in range(1024):
                if not self._send(block):
                    break
        elif mode == "announced":  # announces 2 GiB and sends a little
            self.send_response(200)
            self.send_header("Content-Length", str(2 << 30))
            self.end_headers()
            self._send(b"x" * 1024)
        elif mode == "drip":  # one byte every 0.2 s, for at most 30 s
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            for i in range(150):
                if self.server.stop.is_set() or not self._send(BODY[i:i + 1]):
                    break
                time.sleep(0.2)
        elif mode == "slow-headers":  # the status line, then a header one byte every 0.2 s, for at most 30 s
            if not self._send(b"HTTP/1.1 200 OK\r\nX-Pad: "):
                return
            for _ in range(150):
                if self.server.stop.is_set() or not self._send(b"x"):
                    break
                time.sleep(0.2)
        elif mode == "cut":  # a chunked body that ends without its last chunk
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            part = BODY[:1000]
            self._send(f"{len(part):x}\r\n".encode() + part + b"\r\n" + f"{len(BODY):x}\r\n".encode() + BODY[:10])
            self.close_connection = True


class _Server:
    def __init__(self) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.hits, self.httpd.sent, self.httpd.stop = [], 0, threading.Event()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def sent(self) -> int:
        return self.httpd.sent

    def close(self) -> None:
        self.httpd.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "RCN_FAST_OFFLINE"):
        monkeypatch.delenv(k, raising=False)


def _parts(url: str) -> list[Path]:
    folder = cached_path(url, SHA).parent
    return sorted(folder.glob(".part-*")) if folder.is_dir() else []


def test_a_pinned_size_stops_a_huge_body_early(server):
    url = f"{server.url}/huge"
    with pytest.raises(FetchError, match=f"more than {len(BODY)} bytes and the task pins size {len(BODY)}"):
        fetch_pinned(url, SHA, size=len(BODY))
    time.sleep(0.2)
    assert server.sent < (16 << 20)  # of 64 MiB: the client hung up long before the end
    assert not cached_path(url, SHA).exists() and not _parts(url)


def test_without_a_size_the_download_is_capped(server):
    url = f"{server.url}/huge"
    with pytest.raises(FetchError, match="more than 100000 bytes.*add size: to the task"):
        fetch_pinned(url, SHA, max_bytes=100_000)
    assert server.sent < (16 << 20) and not _parts(url)


def test_an_announced_length_over_the_pin_is_refused_before_reading(server):
    url = f"{server.url}/announced"
    with pytest.raises(FetchError, match=f"announces {2 << 30} bytes and the task pins size {len(BODY)}"):
        fetch_pinned(url, SHA, size=len(BODY))


def test_a_pinned_size_and_checksum_download_and_cache(server):
    url = f"{server.url}/ok"
    path = fetch_pinned(url, SHA, size=len(BODY))
    assert path.read_bytes() == BODY and fetch_pinned(url, SHA, size=len(BODY)) == path
    assert server.httpd.hits == ["ok"]  # the second call is a cache hit
    with pytest.raises(FetchError, match=f"has the pinned sha256 but {len(BODY)} bytes, and the task pins size "
                                         f"{len(BODY) + 1}: correct the task's size:"):
        fetch_pinned(url, SHA, size=len(BODY) + 1)  # the verified cache entry is kept
    assert path.read_bytes() == BODY
    path.unlink()
    with pytest.raises(FetchError, match=f"sent {len(BODY)} bytes, the task pins size {len(BODY) + 1}"):
        fetch_pinned(url, SHA, size=len(BODY) + 1)
    assert not path.exists() and not _parts(url)


def test_a_dripping_server_meets_the_overall_deadline(server):
    url = f"{server.url}/drip"
    with pytest.raises(FetchError, match=r"not finished after 1 s \(\d+ bytes received"):
        fetch_pinned(url, SHA, timeout=5.0, deadline=1.0)  # each byte comes well within the socket timeout
    assert not _parts(url)


def test_a_server_dripping_its_headers_meets_the_deadline_too(server):
    url = f"{server.url}/slow-headers"
    with pytest.raises(FetchError, match=r"not finished after 1 s \(0 bytes received; the server is too slow\)"):
        fetch_pinned(url, SHA, timeout=5.0, deadline=1.0)
    assert not _parts(url)


def test_a_chunked_body_cut_short_is_the_usual_download_error(server):
    url = f"{server.url}/cut"
    with pytest.raises(FetchError, match=r"cannot download .*/cut \(the connection closed after \d+ bytes, before "
                                         r"the end of the file\); download the file yourself"):
        fetch_pinned(url, SHA)
    assert not _parts(url)


def test_stale_part_files_are_removed_and_live_ones_kept(server, tmp_path):
    url = f"{server.url}/ok"
    folder = cached_path(url, SHA).parent
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = folder / f".part-{int(dead.stdout)}-abc"  # its process has exited
    old = folder / ".part-k2j4h5"  # the old naming, untouched for a day
    live = folder / f".part-{os.getppid()}-xyz"  # a running process's download
    for p in (stale, old, live):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 86400, time.time() - 86400))
    fetch_pinned(url, SHA)
    assert not stale.exists() and not old.exists() and live.exists()


def test_sigterm_during_a_download_leaves_no_part_file(server, tmp_path):
    url = f"{server.url}/drip"
    script = textwrap.dedent(f"""
        from rcn_fast.data.fetch import fetch_pinned
        fetch_pinned({url!r}, {SHA!r}, timeout=10.0, deadline=60.0)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RCN_FAST_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(300):  # up to 30 s for the download to start
            if _parts(url) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert _parts(url), proc.communicate(timeout=5) if proc.poll() is not None else "no .part file appeared"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not _parts(url)


def test_a_task_yaml_pins_the_size_and_the_download_honours_it(server):
    from rcn_fast.eval.tasks.catalog import TaskError, load_task_questions, spec_from_dict, spec_key

    base = {"name": "pinned", "url": f"{server.url}/huge", "sha256": SHA}
    spec = spec_from_dict({**base, "size": len(BODY)}, "t.yaml")
    assert spec.size == len(BODY) and spec_key(spec) == spec_key(spec_from_dict(base, "t.yaml"))  # sha256 pins it
    with pytest.raises(FetchError, match=f"the task pins size {len(BODY)}"):
        load_task_questions(spec)
    for bad in (0, -5, "22kb", True):
        with pytest.raises(TaskError, match=r"t.yaml: size: expected a positive number of bytes"):
            spec_from_dict({**base, "size": bad}, "t.yaml")
    with pytest.raises(TaskError, match="'size' is the size of a 'url' file"):
        spec_from_dict({"name": "x", "local": "q.jsonl", "size": 10}, "t.yaml")
