"""The parent side of the render workers: spawned lazily, reused across
renders, killed on a deadline, replaced after a kill.

A render sends one request to an idle worker (:mod:`rcn_fast._templates.worker`)
and waits for the answer with ``poll`` until the render's deadline plus
:data:`GRACE_SECONDS`; a worker that has not answered by then is killed
(SIGKILL) and the render fails with :class:`TemplateLimitError` ("takes
longer than ..."). A worker that dies while rendering (its kernel CPU
limit, or anything else) fails the render the same way. The next render
starts a fresh worker. Up to :data:`MAX_WORKERS` render at once (threads of
a server); more wait for one, within their own deadline. A render's time
starts when a worker takes it: starting a worker (once, about a tenth of a
second) is bounded by :data:`START_SECONDS` instead, so a slow start never
fails a template.

Each worker is started with ``subprocess.Popen`` (fork and exec: no
interpreter state is shared, and a parent with threads is safe); a process
forked from this one forgets the workers it inherited (their pipes are
closed in the child) and starts its own. At exit the workers' pipes are
closed, which ends them.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rcn_fast._templates.limits import TemplateLimitError, TemplateRenderError
from rcn_fast._templates.worker import BOOT, decode, encode

#: Render workers alive at once.
MAX_WORKERS = 4
#: Seconds past a render's deadline before its worker is killed (the worker's own check reports first).
GRACE_SECONDS = 0.25
#: Seconds a new worker may take to start.
START_SECONDS = 60.0
#: Characters of the template texts remembered by id (then forgotten; ids are never reused).
MAX_ID_CHARS = 16_000_000
#: Compile-time refusals remembered (template text -> error), so a refused template costs nothing again.
MAX_REFUSED = 256

_ROOT = str(Path(__file__).resolve().parents[2])
_HEADER = struct.Struct(">I")


def _library_dirs() -> list[str]:
    """The folders holding this process's jinja2 and markupsafe (the worker appends them to its path)."""
    import jinja2
    import markupsafe

    return sorted({str(Path(m.__file__).resolve().parents[1]) for m in (jinja2, markupsafe)})


class Worker:
    """One render worker process and its pipes."""

    def __init__(self) -> None:
        env = {k: os.environ[k] for k in ("PATH", "TZ") if k in os.environ}  # TZ: strftime_now's "today"
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", BOOT, _ROOT, *_library_dirs()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     close_fds=True, cwd="/", env=env)
        self.known: set[int] = set()  # template ids this worker holds
        self.owner = os.getpid()
        ready = self.receive(time.monotonic() + START_SECONDS, starting=True)
        if not isinstance(ready, dict) or ready.get("ready") != self.proc.pid:
            self.kill()
            raise RuntimeError(f"the template render worker did not start (it answered {ready!r:.200})")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        data = encode(message)
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(data)
        stdin.flush()

    def _read(self, n: int, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        chunks, left = [], n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not poller.poll(max(wait, 0) * 1000):
                return None
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def receive(self, deadline: float, starting: bool = False) -> Any:
        """The next message, or None past ``deadline``; EOFError when the worker ended."""
        try:
            head = self._read(_HEADER.size, deadline)
            if head is None:
                return None
            body = self._read(_HEADER.unpack(head)[0], deadline + GRACE_SECONDS)
        except EOFError:
            if starting:
                self.kill()
                raise RuntimeError("the template render worker ended while starting (is jinja2 installed for "
                                   f"{sys.executable}?)") from None
            raise
        return None if body is None else decode(body)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def end(self) -> None:
        """Close its input (it exits) and reap it; kill it if it lingers."""
        self.close()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.kill()


class Pool:
    """Idle workers, and how many are alive."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.idle: list[Worker] = []
        self.alive = 0
        self.ids: dict[str, int] = {}  # template text -> id (ids are never reused)
        self.next_id = 1
        self.id_chars = 0
        self.refused: dict[tuple[str, int], tuple[type, str]] = {}

    def template_id(self, source: str) -> int:
        with self.cond:
            tid = self.ids.get(source)
            if tid is None:
                if len(self.ids) >= 4096 or self.id_chars + len(source) > MAX_ID_CHARS:
                    self.ids.clear()
                    self.id_chars = 0
                tid = self.ids[source] = self.next_id
                self.next_id += 1
                self.id_chars += len(source)
            return tid

    def acquire(self, deadline: float) -> Worker | None:
        with self.cond:
            while not self.idle and self.alive >= MAX_WORKERS:
                if not self.cond.wait(max(deadline - time.monotonic(), 0)) and time.monotonic() >= deadline:
                    raise TemplateLimitError("no template render worker was free before the render's deadline")
            if self.idle:
                return self.idle.pop()
            self.alive += 1
        try:
            return Worker()
        except BaseException:
            self.release(None)
            raise

    def release(self, worker: Worker | None) -> None:
        with self.cond:
            if worker is not None and worker.proc.returncode is None and worker.owner == os.getpid():
                self.idle.append(worker)
            else:
                self.alive -= 1
            self.cond.notify()

    def forget(self) -> None:
        """In a forked child: drop the parent's workers (closing the inherited pipes)."""
        for w in self.idle:
            w.close()
        self.cond = threading.Condition()
        self.idle, self.alive = [], 0

    def shutdown(self) -> None:
        with self.cond:
            idle, self.idle = self.idle, []
        for w in idle:
            w.end()


POOL = Pool()
os.register_at_fork(after_in_child=POOL.forget)
atexit.register(POOL.shutdown)


def _died(worker: Worker, seconds: float) -> TemplateLimitError:
    code = worker.proc.wait()
    if code == -signal.SIGXCPU:
        return TemplateLimitError(f"the template takes longer than {seconds:.3g} s of CPU to render (the kernel's "
                                  "CPU limit stopped its worker)")
    return TemplateLimitError(f"the template's render worker ended while rendering (exit status {code}); "
                              "it is replaced for the next render")


def render(kind: str, source: str, variables: dict[str, Any], seconds: float) -> str:
    """Render in a worker: ``source`` of ``kind`` over plain ``variables``
    (JSON values), within ``seconds`` of wall clock (then the worker is killed).

    Raises
    ------
    TemplateLimitError, TemplateRenderError
        As the door.
    """
    tid = POOL.template_id(source)
    known = POOL.refused.get((kind, tid))
    if known is not None:
        raise known[0](known[1])
    worker = POOL.acquire(time.monotonic() + seconds)  # waiting for a busy worker counts; starting one does not
    assert worker is not None
    deadline = time.monotonic() + seconds
    ok = False
    try:
        request = {"id": tid, "kind": kind, "source": None if tid in worker.known else source, "vars": variables,
                   "seconds": max(deadline - time.monotonic(), 0.001)}
        while True:
            try:
                worker.send(request)
                reply = worker.receive(deadline + GRACE_SECONDS)
            except (EOFError, BrokenPipeError):
                raise _died(worker, seconds) from None
            if reply is None:
                worker.kill()
                raise TemplateLimitError(f"the template takes longer than {seconds:.3g} s to render (its worker was "
                                         "stopped)")
            if "need" in reply:
                worker.known.discard(tid)
                request["source"] = source
                continue
            break
        worker.known.add(tid)
        if reply.get("exit"):
            worker.end()
        else:
            ok = True
        if "text" in reply:
            return reply["text"]
        cls = TemplateLimitError if reply.get("error") == "limit" else TemplateRenderError
        if reply.get("compile"):
            with POOL.cond:
                if len(POOL.refused) >= MAX_REFUSED:
                    POOL.refused.clear()
                POOL.refused[(kind, tid)] = (cls, reply["message"])
        raise cls(reply["message"])
    finally:
        if not ok and worker.proc.returncode is None:
            worker.kill()
        POOL.release(worker if ok else None)


def worker_pids() -> list[int]:
    """The process ids of the idle workers (for tests and diagnostics)."""
    with POOL.cond:
        return [w.pid for w in POOL.idle]


__all__ = ["render", "worker_pids", "Worker", "Pool", "POOL", "MAX_WORKERS", "GRACE_SECONDS", "START_SECONDS"]
