"""The check a model gets once before a run (rcn_fast.llm.preflight), and the
eval command's exit statuses around it: a dead or misconfigured server is
one message and exit 2 before any question; a run in which every question
failed exits 3."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

from stub_server import INF, LETTERS, NAN, StubServer, chat_answer, well_behaved

from rcn_fast.llm import load_llm
from rcn_fast.llm.preflight import PreflightError, preflight


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_a_dead_server_is_reported_at_once_without_retries():
    llm = load_llm(f"openai:http://127.0.0.1:{_dead_port()}/v1#x")
    with pytest.raises(PreflightError, match=r"cannot reach the server \(ConnectionRefusedError.*is the server "
                                             r"running, and are the address and port right\?"):
        preflight(llm)
    assert llm.retries == 0


def test_a_name_the_server_does_not_serve_lists_the_names_it_does():
    with StubServer(well_behaved(name="real")) as srv:
        with pytest.raises(PreflightError, match=r"does not serve 'x' \(it lists \['real'\].*does not exist"):
            preflight(load_llm(f"openai:{srv.base_url}#x", backoff=0.0))


def test_a_server_that_ignores_the_name_passes_with_a_warning(caplog):
    base = well_behaved(name="x", models=[{"id": "/models/real.gguf"}])
    with StubServer(base) as srv, caplog.at_level(logging.WARNING, "rcn_fast.llm.openai.client"):
        llm = load_llm(f"openai:{srv.base_url}#x", backoff=0.0)
        preflight(llm)
        assert "not among the models the server lists" in caplog.text
        n = len(srv.requests)
        assert llm.identity and len(srv.requests) == n  # the identity was fixed by the check


def test_a_bad_tokenizer_path_is_one_message(tmp_path):
    pytest.importorskip("transformers")
    with StubServer(well_behaved()) as srv:
        llm = load_llm(f"openai:{srv.base_url}#x", tokenizer=str(tmp_path / "no-such-tokenizer"))
        with pytest.raises(PreflightError, match=r"the tokenizer '.*no-such-tokenizer' cannot be loaded"):
            preflight(llm)


def test_a_server_that_ignores_prefills_without_a_tokenizer_is_refused(tiny_llm):
    from rcn_fast.llm.server.app import make_server

    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name="tiny", extensions=False)
    srv.start()
    try:
        with pytest.raises(PreflightError, match=r"ignores the field.*pass tokenizer="):
            preflight(load_llm(f"openai:{srv.base_url}#tiny", backoff=0.0))
    finally:
        srv.shutdown()
        srv.server_close()


def test_prompt_logprobs_asked_for_but_not_served_is_refused(tiny_llm, tiny_llama_dir):
    from rcn_fast.llm.server.app import make_server

    srv = make_server(tiny_llm, "127.0.0.1", 0, model_name="tiny", prompt_logprobs=False)
    srv.start()
    try:
        llm = load_llm(f"openai:{srv.base_url}#tiny", tokenizer=str(tiny_llama_dir), label_scoring="prompt_logprobs")
        with pytest.raises(PreflightError, match=r"label_scoring='prompt_logprobs' but the server returns no prompt"):
            preflight(llm)
        preflight(load_llm(f"openai:{srv.base_url}#tiny", tokenizer=str(tiny_llama_dir)))  # auto falls back
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_server_without_logprobs_is_refused_for_label_scoring():
    base = well_behaved()

    def handle(method, route, body):
        status, payload, headers = base(method, route, body)
        if route == "/chat/completions" and status == 200:
            payload["choices"][0].pop("logprobs", None)
        return status, payload, headers

    with StubServer(handle) as srv:
        with pytest.raises(PreflightError, match="returns no next-token log-probs"):
            preflight(load_llm(f"openai:{srv.base_url}#x", backoff=0.0))
        preflight(load_llm(f"openai:{srv.base_url}#x", backoff=0.0), label_scoring=False)


def test_other_backends_need_no_check(tiny_llm):
    preflight(tiny_llm)


# ------------------------------------------------------------ the eval command


@pytest.fixture()
def task_dir(tmp_path) -> Path:
    d = tmp_path / "obqa"
    d.mkdir()
    rows = [{"id": f"q{i}", "question": {"stem": f"Question {i}?", "choices": [
        {"label": c, "text": f"option {c}"} for c in "ABCD"]}, "answerKey": "ABCD"[i % 4]} for i in range(4)]
    (d / "obqa-test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _eval(task_dir: Path, out: Path, spec: str) -> int:
    from rcn_fast.eval.cli import main

    return main(["--tasks", f"obqa={task_dir}", "--pipelines", "vanilla", "--model", spec, "--limit", "3",
                 "--output-path", str(out), "--no-progress", "--no-plot"])


def test_eval_with_a_dead_server_exits_2_before_any_question(task_dir, tmp_path, capsys):
    code = _eval(task_dir, tmp_path / "out", f"openai:http://127.0.0.1:{_dead_port()}/v1#x")
    err = capsys.readouterr().err
    assert code == 2
    assert "rcn_fast.eval: error: model http://127.0.0.1:" in err and "cannot reach the server" in err
    assert "a batch failed" not in err and not list((tmp_path / "out").glob("results_*"))


@pytest.mark.parametrize("bad", [NAN, INF])
def test_eval_in_which_every_question_failed_exits_3(task_dir, tmp_path, capsys, bad):
    top = {c: bad for c in LETTERS}
    probe_ok = well_behaved(top={"Paris": -0.1, "the": -2.0})

    def handle(method, route, body):  # the probe prompt is answered well, every question with broken numbers
        if route == "/chat/completions" and body.get("messages", [{}])[0].get("content") == "The capital of France is":
            return probe_ok(method, route, body)
        return well_behaved(top=top)(method, route, body)

    with StubServer(handle) as srv:
        code = _eval(task_dir, tmp_path / "out", f"openai:{srv.base_url}#x")
    err = capsys.readouterr().err
    assert code == 3, err
    assert "every question failed" in err and "LabelScoreError" in err
    doc = json.loads(next((tmp_path / "out").glob("results_*.json")).read_text())
    assert doc["results"]["obqa"]["vanilla"]["n_failed"] == 3


def test_eval_with_a_working_server_exits_0(task_dir, tmp_path, capsys):
    with StubServer(well_behaved()) as srv:
        assert _eval(task_dir, tmp_path / "out", f"openai:{srv.base_url}#x") == 0
    doc = json.loads(next((tmp_path / "out").glob("results_*.json")).read_text())
    assert doc["results"]["obqa"]["vanilla"]["n_failed"] == 0
    assert doc["model"]["identity"].startswith(f"openai:{srv.base_url}#x:") and ":served-" in doc["model"]["identity"]


def test_eval_counts_a_question_with_nan_scores_as_failed_and_answers_the_others(task_dir, tmp_path, capsys):
    good, bad = well_behaved(), well_behaved(top={c: NAN for c in LETTERS})

    def handle(method, route, body):
        text = json.dumps((body or {}).get("messages", ""))
        return (bad if "Question 1?" in text else good)(method, route, body)

    with StubServer(handle) as srv:
        assert _eval(task_dir, tmp_path / "out", f"openai:{srv.base_url}#x") == 0
    err = capsys.readouterr().err
    doc = json.loads(next((tmp_path / "out").glob("results_*.json")).read_text())
    assert doc["results"]["obqa"]["vanilla"]["n_failed"] == 1 and doc["results"]["obqa"]["vanilla"]["n"] == 2
    [failure] = doc["failures"]
    assert failure["question_id"] == "q1" and "LabelScoreError" in failure["error"] and "'q1'" in failure["error"]
    assert "label 'A'" in failure["error"] and "openai:" in failure["error"]


def test_a_server_that_fails_every_request_is_reported_after_few_retries():
    def handle(method, route, body):
        if method == "GET":
            return 200, {"data": [{"id": "x"}]}, {}
        return 503, {"error": {"message": "model is still loading"}}, {"Retry-After": "30"}

    with StubServer(handle) as srv:
        llm = load_llm(f"openai:{srv.base_url}#x", backoff=0.0)
        with pytest.raises(PreflightError, match=r"gave up after 3 attempts; last error: HTTP 503: model is still"):
            preflight(llm)
        assert llm.config.max_retries == 6 and llm.retries == 2  # the client's own settings are back
