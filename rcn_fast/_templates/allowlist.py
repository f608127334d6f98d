"""What an untrusted template may use: the statements, operators, filters,
tests, functions and methods that real chat templates and
lm-evaluation-harness ``doc_to_*`` templates use, and nothing else.

How the list was made: every template of a corpus was parsed and what it
uses was counted (``tests/data/templates/usage.json`` records the counts,
per source, with where each template came from): 89 chat templates of
widely used models (Llama 2/3/3.1/3.2, Mistral/Mixtral/Nemo, Qwen 1.5/2.5/3/3.5,
Gemma, Phi-3, DeepSeek LLM/Coder/R1, SmolLM2/3, Command-R/A, Granite,
Hermes, Zephyr, ChatML, Jamba, MiniCPM3, Kimi, GLM, ...) and the 1,775
distinct Jinja templates of lm-evaluation-harness's task YAMLs (3,863 uses).
The list is their union, plus the few neighbours llama.cpp's minja (a
chat-template subset of Jinja) also implements (``first``, ``unique``,
``count``, ``escape``; the type tests). What none of them uses is refused
when the template is compiled, with one :class:`TemplateRenderError`
naming what was used and where: ``*``, ``**``, ``/``, ``//``, ``format``,
``wordwrap``, ``center``, ``lipsum``, ``str.format`` / ``encode`` /
``translate``, ``include`` / ``import`` / ``extends``, ``{% filter %}``,
``{% with %}``, calling anything that is not a macro, ``caller`` or an
allowed function or method.

The same lists hold at run time (:mod:`rcn_fast._templates.sandbox`): the
environment holds only the allowed filters, tests and globals, and a call
is made only to a macro, an allowed global, or an allowed method of a
string, list or dict, so a method fetched by a name the compiler could not
see (``x[name]()``) is refused too.
"""

from __future__ import annotations

from typing import Any

from rcn_fast._templates.limits import TemplateRenderError

#: Jinja syntax nodes a template may hold (statements, expressions, operators).
NODES = frozenset({
    "Template", "Output", "TemplateData", "For", "If", "Assign", "AssignBlock", "Macro", "CallBlock", "Break",
    "Continue", "Const", "Name", "NSRef", "Getattr", "Getitem", "Slice", "Call", "Filter", "Test", "Keyword",
    "CondExpr", "And", "Or", "Not", "Compare", "Operand", "Add", "Sub", "Mod", "Neg", "Pos", "Concat", "List",
    "Tuple", "Dict", "Pair", "ExtensionAttribute",
})
#: Filters (Jinja's, and transformers' ``tojson``).
FILTERS = frozenset({
    "trim", "length", "count", "tojson", "string", "items", "list", "safe", "map", "upper", "lower", "title",
    "capitalize", "default", "d", "dictsort", "selectattr", "rejectattr", "select", "reject", "join", "indent",
    "int", "first", "last", "replace", "unique", "escape", "e",
})
#: Tests (``is defined``; also the names ``select`` / ``selectattr`` take).
TESTS = frozenset({
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "boolean", "true", "false",
    "number", "integer", "float", "equalto", "eq", "==", "ne", "!=", "in",
})
#: Methods, by the type they are called on.
METHODS: dict[type, frozenset[str]] = {
    str: frozenset({"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "lower",
                    "upper", "title", "capitalize", "replace", "index", "find", "rfind", "count", "join"}),
    list: frozenset({"index", "count"}),
    dict: frozenset({"get", "items", "keys", "values"}),
}
ALL_METHODS = frozenset().union(*METHODS.values())
#: Functions a chat template may call (transformers' globals and Jinja's).
CHAT_GLOBALS = frozenset({"raise_exception", "namespace", "range", "strftime_now", "dict"})
#: Functions a task template (lm-eval ``doc_to_*``) may call.
TASK_GLOBALS = frozenset({"range", "namespace", "dict"})

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


__all__ = ["NODES", "FILTERS", "TESTS", "METHODS", "ALL_METHODS", "CHAT_GLOBALS", "TASK_GLOBALS", "check",
           "allowed_method"]
