"""Issue 53 item 1: every render of an untrusted template runs in a
persistent worker process under limits it cannot overrun from inside --
``RLIMIT_AS`` and ``RLIMIT_CPU`` set in the worker, a wall-clock kill by
this process, a fresh worker after a kill -- reused across renders, with
plain JSON over its pipe; and the door's other promises (a ``timeout``
argument, the values a template may be given, ``{field}`` question
templates)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

pytest.importorskip("jinja2")

from rcn_fast._templates import (TemplateLimitError, TemplateRenderError, check_fields_template,  # noqa: E402
                                 fill_fields, plain, render_chat_template, render_task_template)
from rcn_fast._templates import pool, worker  # noqa: E402

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where do plates go?"}]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def expected_cap() -> int:
    """The worker's address-space cap: MEMORY_BYTES, or the lower hard limit this process passes down."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return worker.MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(worker.MEMORY_BYTES, hard)


def _limits(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/limits") as f:
        for line in f.readlines()[1:]:
            name, soft = line[:26].strip(), line[26:47].strip()
            out[name] = soft
    return out


def _worker_pid() -> int:
    render_task_template("{{ x }}", {"x": 1})
    pids = pool.worker_pids()
    assert pids, "no idle render worker after a render"
    return pids[-1]


def test_the_worker_runs_under_kernel_limits_and_without_numpy():
    pid = _worker_pid()
    assert pid != os.getpid()
    limits = _limits(pid)
    assert int(limits["Max address space"]) == expected_cap()
    assert limits["Max core file size"] == "0"
    assert limits["Max cpu time"] != "unlimited"  # set before each render
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    assert "numpy" not in maps and "torch" not in maps  # only the door's modules and jinja2 are imported


def test_the_worker_is_reused_across_renders():
    pid = _worker_pid()
    for i in range(200):
        assert render_chat_template(CHATML, [{"role": "user", "content": f"q{i}"}], add_generation_prompt=True) == \
            f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\n"
    assert pid in pool.worker_pids()


def test_a_worker_that_does_not_answer_is_killed_at_the_deadline_and_replaced():
    pid = _worker_pid()
    os.kill(pid, signal.SIGSTOP)  # a worker stuck inside one step, as far as this process can tell
    t0 = time.monotonic()
    with pytest.raises(TemplateLimitError, match="takes longer than 0.5 s to render"):
        render_task_template("{{ x }}", {"x": 1}, timeout=0.5)
    assert time.monotonic() - t0 < 30  # a guard against a hang, not a timing
    assert not os.path.exists(f"/proc/{pid}/status") or "zombie" not in open(f"/proc/{pid}/status").read()
    assert pid not in pool.worker_pids()
    assert render_task_template("{{ x }}", {"x": 2}) == "2"
    assert pid not in pool.worker_pids()


def test_a_worker_ended_by_its_cpu_limit_is_a_limit_error_and_is_replaced():
    pid = _worker_pid()
    os.kill(pid, signal.SIGXCPU)  # what the kernel sends past RLIMIT_CPU
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            if "zombie" in f.read():
                break
        time.sleep(0.01)
    with pytest.raises(TemplateLimitError, match="CPU"):
        render_task_template("{{ x }}", {"x": 1})
    assert render_task_template("{{ x }}", {"x": 3}) == "3"


def test_threads_share_a_few_workers():
    out, errors = {}, []

    def one(i: int) -> None:
        try:
            for j in range(20):
                out[(i, j)] = render_task_template("{{ a }}-{{ b }}", {"a": i, "b": j})
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(v == f"{i}-{j}" for (i, j), v in out.items()) and len(out) == 160
    assert len(pool.worker_pids()) <= pool.MAX_WORKERS


def test_a_forked_child_starts_its_own_worker():
    parent = _worker_pid()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover -- the child reports through the pipe
        try:
            text = render_task_template("{{ x }}", {"x": "child"})
            ok = text == "child" and parent not in pool.worker_pids()
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(child, 0)
    assert render_task_template("{{ x }}", {"x": "parent"}) == "parent" and parent in pool.worker_pids()


def test_a_timeout_shortens_a_render_and_is_checked():
    t0 = time.monotonic()
    with pytest.raises(TemplateLimitError, match="takes longer than 0.2 s"):
        # few steps (under MAX_STEPS), each slow: a substring search over 900,000 characters, about 10x
        # the timeout in all on this machine -- so the time limit, not the step budget, ends the render
        render_task_template('{% for i in range(90000) %}{% if "xxy" in s %}{% endif %}{% endfor %}',
                             {"s": "x" * 900_000}, timeout=0.2)
    assert time.monotonic() - t0 < 30
    for bad in (0, -1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="timeout"):
            render_task_template("x", {}, timeout=bad)
    assert render_task_template("ok", {}, timeout=600) == "ok"  # longer than MAX_SECONDS: held to it


@pytest.mark.parametrize("template, why", [
    ("{% include 'other.jinja' %}", "include"), ("{% extends 'base.jinja' %}", "extends"),
    ("{% import 'm.jinja' as m %}", "import"), ("{% if %}", "Expected an expression"),
    ("{{ nope }}", "'nope' is undefined"), ("{{ x.__class__ }}", "__class__"), ("{{ x['__class__'] }}", "attribute"),
    ("{% set f = x.encode %}{{ f('punycode') }}", "encode|not a macro"), ("{{ (x|string).format(1) }}", "'format'"),
])
def test_every_refusal_is_a_render_error_never_a_crash(template, why):
    with pytest.raises(TemplateRenderError, match=why):
        render_task_template(template, {"x": "abc"})
    assert render_task_template("{{ x }}", {"x": "still here"}) == "still here"


def test_a_refused_template_costs_nothing_again():
    bad = "{{ x.encode('punycode') }}" + "{# pad #}" * 10
    with pytest.raises(TemplateRenderError, match="encode"):
        render_task_template(bad, {"x": "a"})
    t0 = time.perf_counter()
    for _ in range(200):
        with pytest.raises(TemplateRenderError, match="encode"):
            render_task_template(bad, {"x": "a"})
    assert time.perf_counter() - t0 < 10  # remembered, not sent again (a guard, not a timing)


def test_values_given_to_a_template_are_plain_json():
    import numpy as np

    loop: list = []
    loop.append(loop)
    assert plain({"a": (1, 2), 3: {"b": None}, "c": np.int64(4), "d": np.float32(0.5), "e": {1, 1}}) == \
        {"a": [1, 2], "3": {"b": None}, "c": 4, "d": 0.5, "e": [1]}
    assert plain(object.__new__(type("Odd", (), {"__str__": lambda self: "odd"}))) == "odd"
    with pytest.raises(TemplateRenderError, match="nested more than"):
        plain(loop)
    assert render_task_template("{{ t[1] }} {{ d['3'] }}", {"t": (5, 6), "d": {3: "three"}}) == "6 three"


def test_question_templates_are_plain_field_substitution():
    rec = {"sentence": "The cup fell off {the} table.", "option1": "cup", "n": 3}
    assert fill_fields("{sentence} What fell? {{braces}} {n}", rec) == "The cup fell off {the} table. What fell? {braces} 3"
    assert check_fields_template("{a} and {b_2}") == ["a", "b_2"]
    for bad in ("{q:>1500000000}", "{q.__class__.__mro__[1].__subclasses__}", "{q[0]}", "{q!r}", "{}", "{0}",
                "{q", "q}"):
        with pytest.raises(TemplateRenderError, match="question_template"):
            fill_fields(bad, {"q": "x"})
    with pytest.raises(KeyError, match="missing"):
        fill_fields("{missing}", rec)
    with pytest.raises(TemplateLimitError, match="longer than"):
        fill_fields("{a}{a}", {"a": "x" * 600_000})


def test_a_question_template_with_a_format_spec_is_refused_when_the_task_file_is_read(tmp_path):
    from rcn_fast.eval.tasks.catalog import TaskError, resolve_task

    (tmp_path / "q.jsonl").write_text("")
    (tmp_path / "t.yaml").write_text("name: mine\nlocal: q.jsonl\nquestion_template: '{q:>1500000000}'\n")
    with pytest.raises(TaskError, match=r"t\.yaml: question_template: '\{q:>1500000000\}' is not a plain field"):
        resolve_task("mine", include_paths=[str(tmp_path)])


def test_the_pipe_protocol_is_length_prefixed_json():
    data = worker.encode({"text": "é\n"})
    assert data[:4] == len(data[4:]).to_bytes(4, "big") and worker.decode(data[4:]) == {"text": "é\n"}
    assert b"pickle" not in data and data[4:5] == b"{"
