"""Issue 17, evaluation files and the LLM layer: checkpoints shared by two
processes, a call cache that is corrupt, in the way or not writable, cached
rows that cannot be read back, and questions longer than the model's
context."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rcn_fast.eval.run.checkpoint import Checkpoint
from rcn_fast.llm.base import Cost, CostTracker, Generation
from rcn_fast.llm.cache import CachedLLM, CacheError, CallCache
from tests.conftest import REPO

fcntl = pytest.importorskip("fcntl")


# ------------------------------------------------------------------ checkpoints
def test_a_reader_never_truncates_an_append_in_progress(tmp_path):
    """Another process holds the file mid-append (the lock, half a line
    written): opening the checkpoint waits for it instead of cutting the
    half line off (before: the record was lost)."""
    path = tmp_path / "ck.jsonl"
    Checkpoint(path, {}).append([{"id": "q0", "pred": "A"}])
    line = (json.dumps({"id": "q1", "pred": "B", "pad": "x" * 65536}) + "\n").encode()
    seen: dict = {}
    with open(path, "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.write(line[:1000])
        f.flush()
        reader = threading.Thread(target=lambda: seen.update(Checkpoint(path, {}).records))
        reader.start()
        time.sleep(0.3)
        f.write(line[1000:])
        f.flush()
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    reader.join(10)
    assert set(seen) == {"q0", "q1"}
    assert set(Checkpoint(path, {}).done()) == {"q0", "q1"}


def test_a_line_cut_by_a_kill_is_still_dropped_and_appends_start_clean(tmp_path):
    path = tmp_path / "ck.jsonl"
    Checkpoint(path, {}).append([{"id": "q0"}])
    with open(path, "ab") as f:
        f.write(b'{"id": "q1", "pr')  # a writer killed mid-line (its lock died with it)
    ck = Checkpoint(path, {})
    assert ck.done() == {"q0"} and path.read_bytes().endswith(b"}\n")
    # a line cut short that could not be repaired (say a read-only moment) never swallows the next append
    with open(path, "ab") as f:
        f.write(b'{"id": "q2", "x')
    ck.append([{"id": "q3"}])
    assert Checkpoint(path, {}).done() == {"q0", "q3"}


_WRITER = """
import sys
from pathlib import Path
from rcn_fast.eval.run.checkpoint import Checkpoint
path, me, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    Checkpoint(path, {}).append([{"id": f"{me}-{i}", "pad": "x" * 65536}])
"""


def test_two_processes_appending_and_reopening_lose_nothing(tmp_path):
    """Two runs of one evaluation into one folder: each reopens the file
    (the reader's repair) between 64 KB appends."""
    path = tmp_path / "ck.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), w, "60"], env=env) for w in ("a", "b")]
    assert [p.wait(120) for p in procs] == [0, 0]
    done = Checkpoint(path, {}).done()
    assert done == {f"{w}-{i}" for w in ("a", "b") for i in range(60)}


# ------------------------------------------------------------------ the call cache
def test_a_corrupt_cache_file_names_the_file(tmp_path):
    (tmp_path / "llm_cache.sqlite").write_bytes(b"this is not a database " * 200)
    with pytest.raises(CacheError, match=r"llm_cache.sqlite is not a readable call cache .* delete it"):
        CallCache(tmp_path)


def test_a_folder_in_place_of_the_cache_file(tmp_path):
    (tmp_path / "llm_cache.sqlite").mkdir()
    with pytest.raises(CacheError, match=r"llm_cache.sqlite is a folder, where the cache file should be"):
        CallCache(tmp_path)


def test_a_cache_of_another_schema_names_the_file(tmp_path):
    con = sqlite3.connect(tmp_path / "llm_cache.sqlite")
    con.execute("CREATE TABLE calls (key TEXT PRIMARY KEY, answer TEXT)")
    con.commit()
    con.close()
    with pytest.raises(CacheError, match=r"is not a readable call cache \(no such column"):
        CallCache(tmp_path)


class CountingLLM:
    """A stand-in LLM: label log-probs and generations from the chat text."""

    identity = "counting-llm"

    def __init__(self) -> None:
        self.cost = CostTracker()
        self.calls = 0

    def label_logprobs(self, chats, labels, *, tags=None):
        self.calls += len(chats)
        n = len(labels) if isinstance(labels[0], str) else max(len(r) for r in labels)
        lp = np.log(np.full((len(chats), n), 1.0 / n, np.float32))
        self.cost.record_rows([Cost(1, 5, 0) for _ in chats], tags)
        self.cost.last = [Cost(1, 5, 0) for _ in chats]
        return lp

    def generate_samples(self, chats, sample_ids, **kw):
        self.calls += len(chats)
        return [[Generation(f"answer {s}", 5, 2, "stop") for s in ss] for ss in sample_ids]


CHAT = [{"role": "user", "content": "Which? A. x B. y"}]


@pytest.mark.parametrize("bad", ["{not json", json.dumps({"logprobs": "nope"}), json.dumps([1, 2])])
def test_unreadable_cached_rows_are_quarantined_and_asked_again(tmp_path, bad, caplog):
    """A damaged row made every question that reads it fail, on every rerun."""
    inner = CountingLLM()
    llm = CachedLLM(inner, CallCache(tmp_path))
    first = llm.label_logprobs([CHAT], ["A", "B"])
    key = llm.cache.key(inner.identity, "label_logprobs", {"chat": CHAT, "labels": ["A", "B"]})
    con = sqlite3.connect(llm.cache.path)
    assert con.execute("UPDATE calls SET response = ? WHERE key = ?", (bad, key)).rowcount == 1
    con.commit()
    with caplog.at_level("WARNING", logger="rcn_fast.llm"):
        again = CachedLLM(inner, CallCache(tmp_path)).label_logprobs([CHAT], ["A", "B"])
    np.testing.assert_array_equal(again, first)
    assert inner.calls == 2  # asked again once
    assert "moved them to its table calls_quarantine" in caplog.text and "llm_cache.sqlite" in caplog.text
    assert con.execute("SELECT COUNT(*) FROM calls_quarantine").fetchone()[0] == 1
    assert json.loads(con.execute("SELECT response FROM calls WHERE key = ?", (key,)).fetchone()[0])["logprobs"]
    CachedLLM(inner, CallCache(tmp_path)).label_logprobs([CHAT], ["A", "B"])
    assert inner.calls == 2  # the re-asked answer is cached


def test_a_generation_row_of_the_wrong_shape_is_asked_again(tmp_path):
    inner = CountingLLM()
    llm = CachedLLM(inner, CallCache(tmp_path))
    llm.generate([CHAT], max_new_tokens=4)
    con = sqlite3.connect(llm.cache.path)
    con.execute("UPDATE calls SET response = ?", (json.dumps({"text": "x", "tokens": 3}),))
    con.commit()
    out = CachedLLM(inner, CallCache(tmp_path)).generate([CHAT], max_new_tokens=4)
    assert out[0][0].text == "answer 0" and inner.calls == 2


# ------------------------------------------------------------------ the eval command line
def _eval_main(args, capsys):
    from rcn_fast.eval.cli import main

    code = main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("fault", ["corrupt", "folder"])
def test_eval_cli_reports_a_broken_cache_in_one_message(tmp_path, capsys, fault):
    out = tmp_path / "out"
    out.mkdir()
    if fault == "corrupt":
        (out / "llm_cache.sqlite").write_bytes(b"garbage " * 512)
        want = "is not a readable call cache"
    else:
        (out / "llm_cache.sqlite").mkdir()
        want = "is a folder, where the cache file should be"
    code, err = _eval_main(["--pipelines", "vanilla", "--limit", "1", "--output-path", str(out), "--no-progress",
                            "--no-plot"], capsys)
    assert code == 2, err
    assert f"rcn_fast.eval: error: llm cache: {out / 'llm_cache.sqlite'}" in err and want in err
    assert "Traceback" not in err


def _as_nobody() -> list[str]:
    """A command prefix that drops root (root writes into read-only folders)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be tested")
    return ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


def test_a_read_only_output_folder_is_one_message(capsys):
    if not sys.platform.startswith("linux"):
        pytest.skip("permissions are tested on Linux")
    prefix = _as_nobody()
    base = Path(tempfile.mkdtemp(prefix="rcn-ro-"))
    try:
        base.chmod(0o755)
        ro = base / "out"
        ro.mkdir()
        ro.chmod(0o555)
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HOME": str(base)}
        res = subprocess.run(prefix + [sys.executable, "-m", "rcn_fast.eval", "--pipelines", "vanilla", "--limit",
                                       "1", "--output-path", str(ro), "--no-progress"],
                             capture_output=True, text=True, timeout=300, env=env, cwd=str(base))
        assert res.returncode == 2, res.stderr[-2000:]
        assert f"rcn_fast.eval: error: output-path: {ro} is not writable" in res.stderr
        assert "Traceback" not in res.stderr
        # the cache on its own: a clear CacheError, not a raw sqlite3 error
        code = ("from rcn_fast.llm.cache import CallCache, CacheError\n"
                f"try:\n    CallCache({str(ro)!r})\nexcept CacheError as e:\n    print(e)\n")
        res = subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env=env, cwd=str(base))
        assert res.stdout.startswith(f"llm cache: cannot open {ro / 'llm_cache.sqlite'} for writing"), \
            res.stdout + res.stderr[-2000:]
    finally:
        (base / "out").chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ long questions
def test_a_question_longer_than_the_context_is_warned_about():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests" / "llm"))
    from llm_helpers import build_model, build_tokenizer, mcq_chat

    from rcn_fast.llm.base import ContextLengthWarning
    from rcn_fast.llm.backends.hf import HFLLM

    tok = build_tokenizer()
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)  # 512-token context
    llm = HFLLM(model, tok, name="tiny")
    assert llm.context_length == 512
    short, long = mcq_chat("Where is a plate kept? A. cupboard B. floor"), mcq_chat("plate " * 2000)
    with pytest.warns(ContextLengthWarning, match=r"1 of 2 prompt\(s\) are longer than the 512-token context of "
                                                  r"tiny \(the longest, row 1, has \d+ tokens\)"):
        ids = llm.encode_chats([short, long])
    assert len(ids[1]) > 512 and llm.long_prompts == 1  # untruncated, and counted
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextLengthWarning)
        llm.encode_chats([short])  # a prompt that fits says nothing
