"""The Python API refuses what the CLI and the server refuse (issue 43 item
5), on both local backends: a non-finite ``temperature`` / ``top_p``, and a
token id (prompt or label) that is negative or past the vocabulary (numpy
would read another row, torch would fail deep inside)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from rcn_fast.llm import load_llm  # noqa: E402
from rcn_fast._validate import check_token_ids  # noqa: E402
from rcn_fast.llm.base import GenerationParams  # noqa: E402

GGUF = Path(__file__).resolve().parent / "data" / "converter" / "llama_default.gguf"
CHAT = [{"role": "user", "content": "Answer: A"}]


@pytest.fixture(scope="module", params=["native", "transformers"])
def llm(request, tmp_path_factory):
    if request.param == "transformers":
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RCN_FAST_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_llm(str(GGUF), engine=request.param, **({"num_threads": 1} if request.param == "native" else
                                                              {"device": "cpu"}))


@pytest.mark.parametrize("field,value", [("temperature", math.nan), ("temperature", math.inf),
                                         ("temperature", -1.0), ("temperature", True), ("top_p", math.nan),
                                         ("top_p", math.inf), ("top_p", 0.0), ("top_p", False)])
def test_non_finite_or_out_of_range_sampling_numbers_are_refused(llm, field, value):
    with pytest.raises(ValueError, match=field):
        llm.generate([CHAT], max_new_tokens=2, **{field: value})
    with pytest.raises(ValueError, match=field):
        GenerationParams(**{field: value})


@pytest.mark.parametrize("bad", [-1, -300, 300, 10**12, 1.5, "3"])
def test_label_and_prompt_ids_outside_the_vocabulary_are_refused(llm, bad):
    prompt = llm.encode_chats([CHAT])
    with pytest.raises(ValueError, match=r"label_ids\[0\]\[1\]\[0\]: expected a token id in \[0, 300\)"):
        llm.score_ids(prompt, [[[5], [bad]]])
    with pytest.raises(ValueError, match=r"prompt_ids\[0\]\[1\]: expected a token id in \[0, 300\)"):
        llm.score_ids([[prompt[0][0], bad]], [[[5], [6]]])
    with pytest.raises(ValueError, match=r"prompt_ids\[0\]\[0\]"):
        llm.generate_ids([[bad]], GenerationParams(max_new_tokens=1))
    with pytest.raises(ValueError, match=r"prompt_ids\[0\]\[0\]"):
        llm.top_logprobs_ids([[bad]], 3)
    assert len(llm.score_ids(prompt, [[[5], [299]]])[0]) == 2  # the last id is fine


def test_the_check_walks_nested_rows():
    check_token_ids([[0, 1], []], 2, "p")
    check_token_ids([[[0], [1, 1]]], 2, "l", depth=2)
    with pytest.raises(ValueError, match=r"l\[0\]\[1\]\[1\]: expected a token id in \[0, 2\), got 2"):
        check_token_ids([[[0], [1, 2]]], 2, "l", depth=2)
    with pytest.raises(ValueError, match=r"p\[1\]: expected a list, got str"):
        check_token_ids([[0], "ab"], 2, "p")
