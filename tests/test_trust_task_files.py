"""Issue 34 items 1 and 4: task files. A task is keyed by the content of
every file it reads (a ``name=FOLDER`` of JSON-lines files, a YAML's
``local:`` file or folder, an lm-eval task's local data), cheaply: a file
is hashed again only when its stats change, through a small memo that is
never trusted when size, mtime, ctime or inode differ. A small task file
cannot exhaust memory or time: a YAML alias bomb and a Jinja template of
nested ``range(99999)`` loops each fail at once with one message naming the
file (exit 2). Tiny random-weight models built in code."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from rcn_fast._hashing import content_fingerprint  # noqa: E402
from tests.conftest import REPO  # noqa: E402

LETTERS = "ABCD"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test's memos in its own cache folder (and none in the user's)."""
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    import rcn_fast._hashing as h

    monkeypatch.setattr(h, "_PROCESS_MEMO", {})


def _obqa_rows(answers: str, stems: list[str] | None = None) -> str:
    rows = [{"id": f"q{i}", "question": {"stem": (stems or [])[i] if stems else f"Which is option {i}?",
                                        "choices": [{"label": c, "text": f"option {c} of {i}"} for c in LETTERS]},
             "answerKey": a} for i, a in enumerate(answers)]
    return "".join(json.dumps(r) + "\n" for r in rows)


# ------------------------------------------------------------------ item 1: keys
def test_the_key_follows_a_data_folders_content(tmp_path):
    from rcn_fast.eval.tasks.catalog import resolve_task, spec_key

    d = tmp_path / "obqa"
    d.mkdir()
    (d / "obqa-test.jsonl").write_text(_obqa_rows("ABCD"))
    k1 = spec_key(resolve_task(f"obqa={d}"))
    assert spec_key(resolve_task(f"obqa={d}")) == k1
    (d / "obqa-test.jsonl").write_text(_obqa_rows("BBCD"))  # one gold answer edited
    k2 = spec_key(resolve_task(f"obqa={d}"))
    assert k2 != k1
    os.utime(d / "obqa-test.jsonl")  # touched, same bytes: same key (hashed again, same content)
    assert spec_key(resolve_task(f"obqa={d}")) == k2
    (d / "sub").mkdir()
    (d / "sub" / "extra.parquet").write_bytes(b"PAR1")  # any file a hub-style loader could read
    assert spec_key(resolve_task(f"obqa={d}")) != k2
    (d / ".DS_Store").write_bytes(b"x")  # hidden files are not data (the datasets loader skips them too)
    assert spec_key(resolve_task(f"obqa={d}")) == spec_key(resolve_task(f"obqa={d}"))


def test_a_yaml_tasks_local_file_or_folder_is_keyed_by_content(tmp_path):
    from rcn_fast.eval.tasks.catalog import resolve_task, spec_key

    inc = tmp_path / "tasks"
    (inc / "data").mkdir(parents=True)
    (inc / "data" / "q-dev.jsonl").write_text(_obqa_rows("ABCD"))
    (inc / "t.yaml").write_text("name: mine\nlocal: data\nsplit: dev\n")
    (inc / "f.yaml").write_text("name: minefile\nlocal: data/q-dev.jsonl\n")
    keys = {t: spec_key(resolve_task(t, include_paths=[str(inc)])) for t in ("mine", "minefile")}
    (inc / "data" / "q-dev.jsonl").write_text(_obqa_rows("ABCA"))
    for t, k in keys.items():
        assert spec_key(resolve_task(t, include_paths=[str(inc)])) != k, t


def test_a_packaged_task_included_by_a_users_file_keeps_its_package_paths(tmp_path):
    """The paths of an ``include:``d packaged task are relative to the package (before: made relative
    to the including file's folder, where no such file is); the user's own stay relative to it."""
    from rcn_fast.eval.tasks.spec import TASKS_DIR, package_path, task_corpus
    from rcn_fast.eval.tasks.catalog import load_task_questions, resolve_task

    inc = tmp_path / "mine"
    inc.mkdir()
    (inc / "t.yaml").write_text(f"name: mydemo\ninclude: {TASKS_DIR / 'demo.yaml'}\n")
    spec = resolve_task("mydemo", include_paths=[str(inc)])
    assert package_path(spec.local) == TASKS_DIR.parent / "demo" / "questions.jsonl"
    assert task_corpus(spec) == str(TASKS_DIR.parent / "demo" / "corpus.jsonl")
    assert len(load_task_questions(spec)) == 40
    (inc / "q.jsonl").write_text(_obqa_rows("AB"))
    (inc / "t.yaml").write_text(f"name: mydemo\ninclude: {TASKS_DIR / 'demo.yaml'}\nlocal: q.jsonl\n")
    assert resolve_task("mydemo", include_paths=[str(inc)]).local == str(inc / "q.jsonl")


def test_an_lm_eval_tasks_local_data_is_keyed_by_content(tmp_path):
    from rcn_fast.eval.tasks.catalog import resolve_task, spec_key

    inc = tmp_path / "lm"
    inc.mkdir()
    rows = [{"question": f"Q{i}?", "choices": ["a", "b"], "label": i % 2} for i in range(3)]
    (inc / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (inc / "t.yaml").write_text("task: lmt\ndataset_path: d.jsonl\noutput_type: multiple_choice\ntest_split: test\n"
                                "doc_to_text: '{{question}}'\ndoc_to_choice: choices\ndoc_to_target: label\n")
    k = spec_key(resolve_task("lmt", include_paths=[str(inc)]))
    rows[1]["label"] = 0
    (inc / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert spec_key(resolve_task("lmt", include_paths=[str(inc)])) != k


def _fd_name(fd: int) -> str:
    """The name of the file open as ``fd`` (what a hash counter records)."""
    return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))


def test_files_are_hashed_again_only_when_their_stats_change(tmp_path, monkeypatch):
    import rcn_fast._hashing as h

    d = tmp_path / "data"
    d.mkdir()
    for i in range(3):
        (d / f"f{i}.jsonl").write_text(f"row {i}\n" * 100)
    old = time.time() - 60
    for f in d.iterdir():
        os.utime(f, (old, old))
    hashed: list[str] = []
    real = h.sha256_fd
    monkeypatch.setattr(h, "sha256_fd", lambda fd: hashed.append(_fd_name(fd)) or real(fd))
    first = content_fingerprint(d)  # changed (ctime) just now: within the racy window, not remembered
    assert sorted(hashed) == ["f0.jsonl", "f1.jsonl", "f2.jsonl"]
    hashed.clear()
    assert content_fingerprint(d) == first and len(hashed) == 3
    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)  # (instead of waiting 2 s)
    hashed.clear()
    assert content_fingerprint(d) == first and len(hashed) == 3  # now remembered
    hashed.clear()
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})  # a new process: the memo file answers
    assert content_fingerprint(d) == first and hashed == []
    # same size, mtime set back: the ctime (and the content) differ, so it is hashed again
    (d / "f1.jsonl").write_text("ROW 1\n" * 100)
    os.utime(d / "f1.jsonl", (old, old))
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    assert content_fingerprint(d) != first and hashed == ["f1.jsonl"]
    # a memo that lies about a file whose stats still match is not what protects: the stats are
    # part of every entry, and a memo file that cannot be read is ignored
    memo = next((tmp_path / "cache" / "content_hashes").glob("*.json"))
    memo.write_text("{not json")
    hashed.clear()
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    assert content_fingerprint(d) != first and len(hashed) == 3


def test_files_remembered_in_this_process_are_not_looked_up_on_disk(tmp_path, monkeypatch):
    """The process memo answers first: the memo file is read only when a file misses it."""
    import rcn_fast._hashing as h

    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)
    d = tmp_path / "data"
    d.mkdir()
    for i in range(3):
        (d / f"f{i}.jsonl").write_text(f"row {i}\n")
    first = {p: content_fingerprint(p) for p in (d, d / "f1.jsonl")}
    hashed: list[str] = []
    memos: list[str] = []
    real_hash, real_memo = h.sha256_fd, h._read_memo
    monkeypatch.setattr(h, "sha256_fd", lambda fd: hashed.append(_fd_name(fd)) or real_hash(fd))
    monkeypatch.setattr(h, "_read_memo", lambda f, what: memos.append(f) or real_memo(f, what))
    assert {p: content_fingerprint(p) for p in first} == first
    assert hashed == [] and memos == []
    (d / "f2.jsonl").write_text("row two\n")  # one file changed: the folder's memo is read, that file hashed
    assert content_fingerprint(d) != first[d]
    assert hashed == ["f2.jsonl"] and len(memos) == 1 and "content_hashes" in memos[0]


def test_a_model_file_is_hashed_once_for_its_key_and_its_fingerprint(tmp_path, monkeypatch):
    """A GGUF's results key (content_fingerprint) and its converted-weights key (file_fingerprint) share
    one hash, remembered across processes."""
    import rcn_fast._hashing as h
    from rcn_fast.model_files import file_fingerprint

    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF" + bytes(100))
    hashed: list[str] = []
    real = h.sha256_fd
    monkeypatch.setattr(h, "sha256_fd", lambda fd: hashed.append(_fd_name(fd)) or real(fd))
    sha = content_fingerprint(g)
    st = g.stat()
    assert file_fingerprint(g) == {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})  # a new process: the memo file answers
    assert file_fingerprint(g)["sha256"] == sha == hashlib.sha256(g.read_bytes()).hexdigest()
    assert hashed == ["m.gguf"]
    with pytest.raises(IsADirectoryError):
        file_fingerprint(tmp_path)


def test_a_file_replaced_by_another_with_the_same_size_and_mtime_is_hashed_again(tmp_path, monkeypatch):
    import rcn_fast._hashing as h

    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)

    f = tmp_path / "q.jsonl"
    f.write_text("A" * 50)
    old = time.time() - 60
    os.utime(f, (old, old))
    a = content_fingerprint(f)
    other = tmp_path / "other"
    other.write_text("B" * 50)
    os.utime(other, (old, old))
    os.replace(other, f)  # another inode, same size and mtime
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    assert content_fingerprint(f) != a


# the eval end to end: edit the gold answers (or a question) of a folder task, rerun into the same output
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from rcn_fast.testing.tiny_llm import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("llama") / "m")


def _run(d: Path, out: Path, model: Path) -> dict:
    from rcn_fast.eval import EvalConfig, evaluate

    return evaluate(EvalConfig(tasks=[f"obqa={d}"], pipelines=["vanilla"], model=str(model), output_path=str(out),
                               progress=False, plot=False, device="cpu", batch_size=4), print_table=False)


def _preds(out: Path) -> dict[str, int]:
    recs = {}
    for f in (out / "checkpoints" / "obqa" / "vanilla").glob("seed0-*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            recs[r["id"]] = r["prediction"]["pred"]
    return recs


def test_edited_gold_answers_in_a_task_folder_are_scored_afresh(tmp_path, tiny_model):
    d = tmp_path / "obqa"
    d.mkdir()
    (d / "obqa-test.jsonl").write_text(_obqa_rows("ABCD"))
    out = tmp_path / "out"
    first = _run(d, out, tiny_model)["results"]["obqa"]["vanilla"]["acc"]
    preds = _preds(out)
    # gold = the predictions (acc 1) unless the first run already scored 1: then gold = another choice (acc 0)
    want = 1.0 if first < 1.0 else 0.0
    gold = "".join(LETTERS[(preds[f"q{i}"] + (0 if want == 1.0 else 1)) % 4] for i in range(4))
    (d / "obqa-test.jsonl").write_text(_obqa_rows(gold))
    again = _run(d, out, tiny_model)
    assert again["results"]["obqa"]["vanilla"]["acc"] == want  # before: the stale checkpoint's `first`
    fresh = _run(d, tmp_path / "fresh", tiny_model)
    assert fresh["results"]["obqa"]["vanilla"]["acc"] == want
    assert len(list((out / "checkpoints" / "obqa" / "vanilla").glob("seed0-*.jsonl"))) == 2  # a new key


def test_an_edited_question_in_a_task_folder_is_answered_again(tmp_path, tiny_model):
    d = tmp_path / "obqa"
    d.mkdir()
    (d / "obqa-test.jsonl").write_text(_obqa_rows("ABCD"))
    out = tmp_path / "out"
    assert _run(d, out, tiny_model)["llm_usage"]["loaded"]
    assert not _run(d, out, tiny_model)["llm_usage"]["loaded"]  # unchanged: nothing to do
    stems = [f"Which is option {i}?" for i in range(4)]
    stems[2] = "Which of these is made of stone?"
    (d / "obqa-test.jsonl").write_text(_obqa_rows("ABCD", stems))
    doc = _run(d, out, tiny_model)
    assert doc["llm_usage"]["loaded"] and doc["llm_usage"]["model_calls"] >= 1  # before: the old answers, no call


# ------------------------------------------------------------------ item 4: bounded files
# 9 levels of 9 aliases: 9**9 (387 million) strings once expanded, 643 bytes
_BOMB = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
         + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)))
_NESTED_RANGE = ("{% for i in range(99999) %}{% for j in range(99999) %}{% for k in range(99999) %}"
                 "{% endfor %}{% endfor %}{% endfor %}{{question}}")


def _limited_cli(args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess:
    """The eval CLI in a child with 3 GiB of address space and a time limit
    (so the code before this issue fails here instead of taking the machine)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        return subprocess.run([sys.executable, "-m", "rcn_fast.eval", *args], capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the eval did not stop within {timeout} s")


def _mini_questions(path: Path) -> Path:
    path.write_text(_obqa_rows("ABCD"))
    return path


@pytest.mark.parametrize("form", ["rcn_fast", "lm_eval"])
def test_a_yaml_alias_bomb_fails_at_once_naming_the_file(tmp_path, form):
    inc = tmp_path / "tasks"
    inc.mkdir()
    _mini_questions(inc / "q.jsonl")
    if form == "rcn_fast":
        text = _BOMB + "name: bomb\nlocal: q.jsonl\ndescription: *i\n"
    else:
        text = _BOMB + ("task: bomb\ndataset_path: q.jsonl\noutput_type: multiple_choice\ntest_split: test\n"
                        "doc_to_text: '{{question}}'\ndoc_to_choice: choices\ndoc_to_target: answerKey\n"
                        "description: *i\n")
    assert len(text) < 800
    f = inc / "bomb.yaml"
    f.write_text(text)
    t0 = time.monotonic()
    run = _limited_cli(["--include_path", str(inc), "--tasks", "bomb", "--pipelines", "vanilla", "--model",
                        str(tmp_path / "no-model"), "--output-path", str(tmp_path / "out"), "--no-progress",
                        "--no-plot"])
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [ln for ln in run.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and f"task file {f}:" in errors[0] and "alias bomb" in errors[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr and time.monotonic() - t0 < 120


def test_a_template_of_nested_ranges_fails_at_once_naming_the_file(tmp_path):
    inc = tmp_path / "lm"
    inc.mkdir()
    rows = [{"question": f"Q{i}?", "choices": ["a", "b"], "label": 0} for i in range(2)]
    (inc / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = inc / "slow.yaml"
    f.write_text("task: slow\ndataset_path: d.jsonl\noutput_type: multiple_choice\ntest_split: test\n"
                 f"doc_to_text: {json.dumps(_NESTED_RANGE)}\ndoc_to_choice: choices\ndoc_to_target: label\n")
    run = _limited_cli(["--include_path", str(inc), "--tasks", "slow", "--pipelines", "vanilla", "--model",
                        str(tmp_path / "no-model"), "--output-path", str(tmp_path / "out"), "--no-progress",
                        "--no-plot"])
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [ln for ln in run.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and f"task file {f}:" in errors[0], run.stderr[-2000:]
    assert "doc_to_text: the template runs more than 100,000 steps" in errors[0] and "Traceback" not in run.stderr


def test_aliases_within_the_budget_still_work(tmp_path):
    from rcn_fast.eval.tasks.catalog import resolve_task

    inc = tmp_path / "tasks"
    inc.mkdir()
    _mini_questions(inc / "q.jsonl")
    (inc / "t.yaml").write_text("name: ok\nlocal: q.jsonl\npaper_table: &t My table\ndescription: *t\n")
    spec = resolve_task("ok", include_paths=[str(inc)])
    assert spec.description == "My table" == spec.paper_table


@pytest.mark.parametrize("text, why", [
    ("name: x\nlocal: q.jsonl\nd: &a [1, *a]\n", "recursive structure"),
    ("name: x\nlocal: q.jsonl\nd: " + "[" * 500 + "]" * 500 + "\n", "nests more than 100 levels"),
    ("name: x\nlocal: q.jsonl\nd: &a [" + ",".join(['"' + "y" * 5000 + '"'] * 4) + "]\ne: [" + ",".join(["*a"] * 6)
     + "]\n", "alias bomb"),
])
def test_other_costly_yaml_is_refused_naming_the_file_and_line(tmp_path, text, why):
    from rcn_fast.eval.tasks.catalog import TaskError, resolve_task

    inc = tmp_path / "tasks"
    inc.mkdir()
    f = inc / "t.yaml"
    f.write_text(text)
    with pytest.raises(TaskError, match=rf"task file {f}:\d+: .*{why}"):
        resolve_task("x", include_paths=[str(inc)])


#: a value of 524,288 characters built within the allowlist (19 doublings by ``~``)
_BIG = "{% set ns = namespace(s='x') %}{% for i in range(19) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% set big = ns.s %}"
_BIG_LINES = ("{% set ns = namespace(s='x\\n') %}{% for i in range(18) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
              "{% set big = ns.s %}")


@pytest.mark.parametrize("template, why", [
    (_BIG + "{% for i in range(9000) %}{{ big }}{% endfor %}", "writes more than"),
    ("{% macro m() %}" + _BIG + "{% for i in range(9000) %}{{ big }}{% endfor %}{% endmacro %}{% set r = m() %}ok",
     "writes more than"),
    ("{% macro m(n) %}{% if n %}{{ m(n-1) }}{{ m(n-1) }}{% endif %}{% endmacro %}{{ m(40) }}", "steps"),
    ("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "recurses too deeply"),
    (_BIG + "{{ big|replace('x', 'yy') }}", "replace"), ("{{ range(99999)|join('" + "x" * 100 + "') }}", "join"),
    ("{% set ns = namespace(s='xx') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'\\+'"),
    ("{% for a in xs %}{% for b in xs %}{% for c in xs %}{{ a }}{% endfor %}{% endfor %}{% endfor %}", "steps"),
    (_BIG + "{{ [big, big]|string }}", "string"), (_BIG + "{{ [big, big] ~ '' }}", "'~'"),
    (_BIG_LINES + "{{ big|indent('" + "y" * 100 + "') }}", "indent"),
    ("{{ xs|tojson(indent=900000) }}", "tojson"), ('{{ "%.*f" % (2500000000, 1.0) }}', "width or precision"),
    ('{{ "%0999999999d" % 1 }}', "width or precision"), (_BIG + "{{ big|e }}", "e: the result"),
    ("{% set nv = namespace(v=[]) %}" + _BIG + "{% for i in range(100) %}{% set nv.v = nv.v + [big] %}{% endfor %}",
     "'\\+'"),
    (_BIG + "{% for i in range(200) %}{% set s = big ~ 'y' %}{{ s|length }}{% endfor %}", "in all"),
    ("x" * 200001, "characters long"),
])
def test_every_amplifier_the_allowlist_keeps_is_refused_at_once(template, why):
    from rcn_fast._templates import TemplateLimitError, render_task_template as render

    t0 = time.monotonic()
    with pytest.raises(TemplateLimitError, match=why):
        render(template, {"xs": list(range(100))})
    assert time.monotonic() - t0 < 30  # a guard against a hang, not a timing


@pytest.mark.parametrize("template, why", [
    ("{{ 'x' * 999999999 }}", "the operator '\\*'"), ("{{ 2 ** 99999999 }}", "the operator '\\*\\*'"),
    ("{{ 'x'|center(999999999) }}", "the filter 'center'"), ("{{ '{:>99999999}'.format(1) }}", "the method 'format'"),
    ("{{ lipsum(n=3000000) }}", "'lipsum'"), ('{{ "%*s"|format(2500000000, "a") }}', "the filter 'format'"),
    ("{{ ('\\t').expandtabs(999999) }}", "the method 'expandtabs'"), ("{{ (1).to_bytes(9, 'big') }}", "'to_bytes'"),
    ("{{ [1]|batch(999999999, 'x') }}", "the filter 'batch'"), ("{{ 'a'.translate({97: 'b'}) }}", "'translate'"),
    ("{{ 'a b'|wordwrap(1, wrapstring='') }}", "the filter 'wordwrap'"), ("{{ 'a'.encode('punycode') }}", "'encode'"),
    ("{% include 'x.j2' %}", "include"), ("{% import 'x.j2' as y %}", "import"), ("{% extends 'x.j2' %}", "extends"),
    ("{% from 'x.j2' import y %}", "import"), ("{{ ''.__class__ }}", "'__class__'"), ("{{ 4 / 2 }}", "'/'"),
    ("{% filter upper %}x{% endfilter %}", "filter"), ("{{ cycler(1, 2) }}", "'cycler'"),
    ("{{ xs['__class__'] }}", "attribute"), ("{{ (xs|first).__class__ }}", "'__class__'"),
])
def test_what_real_templates_do_not_use_is_refused_at_compile_time(template, why):
    from rcn_fast._templates import TemplateRenderError, render_task_template as render

    t0 = time.monotonic()
    with pytest.raises(TemplateRenderError, match=why):
        render(template, {"xs": list(range(100))})
    assert time.monotonic() - t0 < 30  # a guard against a hang, not a timing


def test_ordinary_templates_render_as_before():
    from rcn_fast._templates import render_task_template as render

    doc = {"question": "Why?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B"}
    assert render("Question: {{question}}\nAnswer:", doc) == "Question: Why?\nAnswer:"
    assert render("{{choices.text}}", doc) == "['a', 'b']"
    assert render("{{choices.label.index(answerKey)}}", doc) == "1"
    assert render("{% for t in choices.text %}({{ loop.index }}) {{ t|upper }} {% endfor %}", doc) == "(1) A (2) B "
    assert render("{{ '%s-%03d' % ('q', 7) }} {{ choices.text|join(', ') }}", doc) == "q-007 a, b"
    assert render("{{ '%5s|%-3d|%.2f|%*d' % ('a', 7, 1.5, 3, 9) }} {{ choices.text|tojson(indent=1) }}"
                  " {{ '%(k)s' % {'k': 'v'} }} {{ 'a\nb'|indent(2) }} {{ question.strip('?').lower() }}", doc) == \
        '    a|7  |1.50|  9 [\n "a",\n "b"\n] v a\n  b why'


def test_local_data_files_of_a_json_dataset_are_keyed_by_content(tmp_path, monkeypatch):
    """lm-eval's ``dataset_path: json`` with ``dataset_kwargs: {data_files: ...}`` reads local files too
    (in the task file's own folder: issue 53)."""
    from rcn_fast.eval.tasks.catalog import resolve_task, spec_key

    monkeypatch.chdir(tmp_path)
    inc = tmp_path / "lm"
    (inc / "data").mkdir(parents=True)
    rows = [{"question": f"Q{i}?", "choices": ["a", "b"], "label": i % 2} for i in range(3)]
    for name in ("test.jsonl", "extra-1.jsonl"):
        (inc / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (inc / "t.yaml").write_text("task: lmjson\ndataset_path: json\noutput_type: multiple_choice\ntest_split: test\n"
                                "dataset_kwargs: {data_files: {test: [data/test.jsonl, 'data/extra-*.jsonl']}}\n"
                                "doc_to_text: '{{question}}'\ndoc_to_choice: choices\ndoc_to_target: label\n")
    k = spec_key(resolve_task("lmjson", include_paths=[str(inc)]))
    for name in ("test.jsonl", "extra-1.jsonl"):
        with open(inc / "data" / name, "a") as f:
            f.write(json.dumps({"question": f"More in {name}?", "choices": ["a", "b"], "label": 0}) + "\n")
        k2 = spec_key(resolve_task("lmjson", include_paths=[str(inc)]))
        assert k2 != k, name
        k = k2


def test_a_json_dataset_of_local_data_files_is_planned_with_the_hub_unreachable(tmp_path, monkeypatch):
    """``dataset_path: json`` with local ``data_files`` reads no hub data: an unreachable hub does not
    refuse it (before: "is on the Hugging Face hub, which cannot be reached"); a hub id still is."""
    from rcn_fast.eval import EvalConfig
    from rcn_fast.eval.run import plan as plan_module
    from rcn_fast.eval.tasks.sources import needs_hub
    from rcn_fast.eval.tasks.catalog import resolve_task

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(plan_module, "hub_access", lambda: ("unreachable", "no network in this test"))
    inc = tmp_path / "lm"
    (inc / "data").mkdir(parents=True)
    rows = [{"question": f"Which is {i}?", "choices": ["a", "b"], "label": i % 2} for i in range(3)]
    (inc / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (inc / "t.yaml").write_text("task: lmjson\ndataset_path: json\noutput_type: multiple_choice\ntest_split: test\n"
                                "dataset_kwargs: {data_files: {test: data/test.jsonl}}\n"
                                "doc_to_text: '{{question}}'\ndoc_to_choice: choices\ndoc_to_target: label\n")
    assert not needs_hub(resolve_task("lmjson", include_paths=[str(inc)]))
    assert needs_hub(resolve_task("csqa"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "contents": "a passage"}) + "\n")
    out = tmp_path / "out"
    cfg = EvalConfig(pipelines=["single_retrieval"], tasks=["lmjson"], include_path=[str(inc)], corpus=str(corpus),
                     output_path=str(out))
    _, questions, _ = plan_module.plan(cfg, out)
    assert [q.question for q in questions["lmjson"]] == [r["question"] for r in rows]
    cfg.tasks = ["csqa"]
    with pytest.raises(plan_module.EvalError, match="which cannot be reached"):
        plan_module.plan(cfg, out)


def test_the_memo_folder_stays_bounded_and_keeps_the_newest(tmp_path, monkeypatch):
    import rcn_fast._hashing as h

    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)
    monkeypatch.setattr(h, "MAX_MEMO_FILES", 8)
    memos = tmp_path / "cache" / "content_hashes"
    files = []
    for i in range(30):
        f = tmp_path / f"f{i}.txt"
        f.write_text(f"content {i}\n")
        files.append(f)
        content_fingerprint(f)
        assert len(list(memos.iterdir())) <= 8
        name = hashlib.sha256(os.path.realpath(f).encode()).hexdigest()[:32] + ".json"
        assert (memos / name).is_file()  # never the one just written
    # a pruned memo costs one hash, never a wrong fingerprint
    hashed: list[str] = []
    real = h.sha256_fd
    monkeypatch.setattr(h, "sha256_fd", lambda fd: hashed.append(_fd_name(fd)) or real(fd))
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    assert content_fingerprint(files[0]) == hashlib.sha256(files[0].read_bytes()).hexdigest() and hashed == ["f0.txt"]
    hashed.clear()
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    assert content_fingerprint(files[0]) == hashlib.sha256(files[0].read_bytes()).hexdigest() and hashed == []  # remembered again
