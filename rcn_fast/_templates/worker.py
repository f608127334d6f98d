"""The render worker: a child process that renders templates for the door,
under kernel limits it cannot lift, speaking a small pipe protocol.

Started by :mod:`rcn_fast._templates.pool` as ``python -I -c BOOT ROOT
DIRS...``: isolated mode (no ``PYTHON*`` variables, no user site, neither
the current folder nor the script's on ``sys.path``; the folders of the
parent's jinja2 and markupsafe are appended, so the worker imports the
same ones), and without running ``rcn_fast/__init__.py`` (the package is
registered by path, so only this package's modules and jinja2 are
imported: no numpy, no torch).

Before it reads a request it sets, for itself:

* ``RLIMIT_AS`` (:data:`MEMORY_BYTES` of address space in all, or the
  lower limit it inherited; the hard limit too, so it cannot be raised
  again): an allocation past it is a
  ``MemoryError``, reported as a limit, after which the worker exits and
  is replaced;
* ``RLIMIT_CORE`` 0 (a worker killed for CPU leaves no core file);
* per render, ``RLIMIT_CPU``: the CPU seconds used so far plus the
  render's limit, rounded up, plus one; past it the kernel sends SIGXCPU,
  which ends the process.

Protocol: each message is 4 bytes of big-endian length, then that many
bytes of UTF-8 JSON (no pickles: plain values cross the pipe). Requests:
``{"id": n, "kind": "chat"|"task", "source": str|null, "vars": {...},
"seconds": s}`` (``source`` is sent once per worker; a worker that does not
hold template ``n`` answers ``{"need": n}``). Answers: ``{"text": str}`` or
``{"error": "limit"|"render", "message": str, "compile": bool, "exit":
bool}``. The first message, sent once it is ready, is ``{"ready": pid}``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, BinaryIO

#: Address space of the worker, all of it (Python with jinja2 takes about 26 MB of it when it starts).
MEMORY_BYTES = 512 << 20
#: Bytes of one message, either way.
MAX_MESSAGE = 64 << 20
#: Templates one worker keeps compiled.
MAX_TEMPLATES = 256

_HEADER = struct.Struct(">I")

BOOT = ("import sys, types; sys.path.extend(sys.argv[2:]); p = types.ModuleType('rcn_fast'); "
        "p.__path__ = [sys.argv[1] + '/rcn_fast']; sys.modules['rcn_fast'] = p; "
        "from rcn_fast._templates.worker import main; main()")


def encode(message: Any) -> bytes:
    """One framed message: length, then UTF-8 JSON."""
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"a template message of {len(body):,} bytes, more than {MAX_MESSAGE:,}")
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> Any:
    return json.loads(body.decode("utf-8", "surrogatepass"))


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def set_limits() -> None:
    """This process's memory and core limits (module notes)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]  # a lower limit inherited from the parent stays
    cap = MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_BYTES, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _cpu_limit(seconds: float) -> None:
    import math
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime + seconds) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def answer(request: dict[str, Any], templates: dict[int, tuple[str, str]]) -> dict[str, Any]:
    """The answer to one render request (module notes)."""
    from rcn_fast._templates import sandbox
    from rcn_fast._templates.limits import TemplateLimitError, TemplateRenderError

    tid, kind = request["id"], request["kind"]
    if request.get("source") is not None:
        if len(templates) >= MAX_TEMPLATES:
            templates.clear()
        templates[tid] = (kind, request["source"])
    if tid not in templates:
        return {"need": tid}
    _, source = templates[tid]
    try:
        sandbox.compiled(kind, source)
    except (TemplateLimitError, TemplateRenderError) as exc:
        return {"error": "limit" if isinstance(exc, TemplateLimitError) else "render", "message": str(exc),
                "compile": True}
    try:
        _cpu_limit(float(request["seconds"]))
        return {"text": sandbox.render(kind, source, request["vars"], float(request["seconds"]))}
    except TemplateLimitError as exc:
        return {"error": "limit", "message": str(exc), "exit": "memory" in str(exc)}
    except TemplateRenderError as exc:
        return {"error": "render", "message": str(exc)}


def main() -> None:
    """Serve render requests on stdin/stdout until stdin closes."""
    import jinja2  # noqa: F401 -- imported before the limits are measured

    from rcn_fast._templates import sandbox

    sandbox.environment("chat")
    sandbox.environment("task")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the protocol
    set_limits()
    stdout.write(encode({"ready": os.getpid()}))
    stdout.flush()
    templates: dict[int, tuple[str, str]] = {}
    while True:
        head = _read_exact(stdin, _HEADER.size)
        if head is None:
            return
        (n,) = _HEADER.unpack(head)
        body = _read_exact(stdin, n) if n <= MAX_MESSAGE else None
        if body is None:
            return
        try:
            reply = answer(decode(body), templates)
        except MemoryError:
            reply = {"error": "limit", "message": "the template needs more memory than its limit", "exit": True}
        try:
            data = encode(reply)
        except (MemoryError, ValueError):
            data = encode({"error": "limit", "message": "the rendered text is too large to send", "exit": True})
        stdout.write(data)
        stdout.flush()
        if reply.get("exit"):
            return


__all__ = ["BOOT", "MEMORY_BYTES", "MAX_MESSAGE", "encode", "decode", "answer", "set_limits", "main"]
