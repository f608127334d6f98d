"""Chat validation and rendering: pre-filled turns, system-role fallback."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from llm_helpers import CHATML, NO_SYSTEM, build_tokenizer  # noqa: E402

from rcn_fast.llm.chat import fold_system, render_chat, render_plain, template_supports_system, validate_chats  # noqa: E402

# drops system turns silently and trims content (as several real templates do)
DROPS_SYSTEM_TRIMS = (
    "{% for m in messages %}{% if m['role'] != 'system' %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CHAT = [
    {"role": "system", "content": "Follow the instructions."},
    {"role": "user", "content": "Do you understand?"},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "Q: where is the plate? A. cupboard B. floor"},
    {"role": "assistant", "content": "Answer: "},
]


@pytest.fixture(scope="module")
def toks():
    return {name: build_tokenizer(t) for name, t in [("chatml", CHATML), ("nosys", NO_SYSTEM), ("drops", DROPS_SYSTEM_TRIMS)]}


def test_prefill_is_kept_exactly_and_left_open(toks):
    text = render_chat(toks["chatml"], CHAT)
    assert text.endswith("<|im_start|>assistant\nAnswer: ")
    assert text.count("<|im_end|>") == 4  # system, user, assistant, user: the pre-fill is not closed
    assert text.startswith("<|im_start|>system\nFollow the instructions.<|im_end|>")
    # a template that trims content keeps the pre-fill's trailing space
    trimmed = render_chat(toks["nosys"], CHAT)
    assert trimmed.endswith("<|im_start|>assistant\nAnswer: ")


def test_no_prefill_ends_with_generation_prompt(toks):
    text = render_chat(toks["chatml"], CHAT[:4])
    assert text.endswith("B. floor<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("name", ["nosys", "drops"])
def test_system_fallback_merges_into_first_user_turn(toks, name):
    tok = toks[name]
    assert not template_supports_system(tok)
    text = render_chat(tok, CHAT)
    assert text.startswith("<|im_start|>user\nFollow the instructions.\n\nDo you understand?<|im_end|>")
    assert "system" not in text
    assert template_supports_system(toks["chatml"])


def test_fold_system_cases():
    assert fold_system(CHAT[1:]) == CHAT[1:]
    only = fold_system([{"role": "system", "content": "S"}, {"role": "assistant", "content": "ok"}])
    assert only == [{"role": "user", "content": "S"}, {"role": "assistant", "content": "ok"}]


def test_plain_rendering_without_template():
    assert render_plain(CHAT[:2] + [CHAT[-1]]) == "System: Follow the instructions.\n\nUser: Do you understand?\n\nAssistant: Answer: "
    assert render_plain(CHAT[1:2]).endswith("User: Do you understand?\n\nAssistant: ")


def test_validation_names_the_problem():
    assert validate_chats([CHAT]) == [CHAT]
    with pytest.raises(ValueError, match="wrap a single chat"):
        validate_chats(CHAT)
    with pytest.raises(TypeError, match="expected a list of chats"):
        validate_chats("hello")
    with pytest.raises(ValueError, match=r"chats\[0\]\[0\]\['role'\]: expected one of"):
        validate_chats([[{"role": "bot", "content": "x"}]])
    with pytest.raises(TypeError, match=r"\['content'\]: expected str"):
        validate_chats([[{"role": "user", "content": 3}]])
    with pytest.raises(ValueError, match="system turn must be the first"):
        validate_chats([[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]])
    with pytest.raises(ValueError, match="empty chat"):
        validate_chats([[]])
