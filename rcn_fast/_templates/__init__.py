"""The one door for every template rcn_fast renders: task templates
(lm-evaluation-harness ``doc_to_*`` settings), the chat template of a GGUF
file (``tokenizer.chat_template``), the chat template of a model folder
(``tokenizer_config.json`` / ``chat_template.jinja``, whichever tokenizer
loaded it), and a task file's ``question_template`` (:func:`fill_fields`).
Nothing else in the package imports jinja2 or calls a tokenizer's
``apply_chat_template`` (tests/test_trust_doors.py walks the package).

Every template is untrusted, and three mechanisms hold it:

1. **An allowlist** (:mod:`rcn_fast._templates.allowlist`): a template may
   use only the statements, operators, filters, tests, functions and
   methods that real chat templates and lm-eval templates use (derived
   from a corpus of both); anything else is refused when it is compiled,
   with one :class:`TemplateRenderError` naming what was used.
2. **Budgets inside the render** (:mod:`rcn_fast._templates.limits`):
   steps, time, the size of every value made and written, checked before
   the operations that could allocate much in one step.
3. **Kernel limits around it** (:mod:`rcn_fast._templates.pool`,
   :mod:`rcn_fast._templates.worker`): every render runs in a persistent
   worker process with ``RLIMIT_AS`` and ``RLIMIT_CPU`` set, killed by this
   process at the render's deadline and replaced; only plain JSON values
   cross the pipe. This is the guarantee: whatever a template does in one
   step, it cannot take this process's memory or time.

Refusals are one of two ``ValueError`` subclasses: :class:`TemplateLimitError`
(a limit: steps, time, size, memory, CPU, a killed worker) and
:class:`TemplateRenderError` (a syntax error, an undefined name, anything
outside the allowlist -- ``include`` / ``import`` / ``extends`` among them
--, ``raise_exception``, a value of a type a template cannot be given).
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any, Sequence

from rcn_fast._templates.limits import (MAX_CHARS, MAX_INT_BITS, MAX_MADE, MAX_SECONDS, MAX_STEPS,
                                        MAX_TEMPLATE_CHARS, TemplateLimitError, TemplateRenderError)

HINT = "pip install jinja2  (or pip install \"rcn_fast[eval]\" / \"rcn_fast[llm]\")"
#: Nesting of a value given to a template (messages, docs).
MAX_VALUE_DEPTH = 64


def _seconds(timeout: float | None) -> float:
    if timeout is None:
        return MAX_SECONDS
    if isinstance(timeout, bool) or not isinstance(timeout, Real) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    return min(float(timeout), MAX_SECONDS)


def plain(value: Any, where: str = "value", depth: int = 0) -> Any:
    """``value`` as plain JSON values (what crosses the pipe to the worker):
    strings, booleans, None, integers, finite or not floats, lists (from any
    sequence) and dicts with string keys (other keys become strings); any
    other value becomes its ``str()``.

    Raises
    ------
    TemplateRenderError
        The value nests deeper than :data:`MAX_VALUE_DEPTH` or refers to itself.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        return float(value)
    if depth >= MAX_VALUE_DEPTH:
        raise TemplateRenderError(f"{where}: a value nested more than {MAX_VALUE_DEPTH} levels deep cannot be "
                                  "given to a template")
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): plain(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, range)):
        return [plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    return str(value)


def _render(kind: str, template: Any, variables: dict[str, Any], timeout: float | None) -> str:
    if not isinstance(template, str):
        raise TypeError(f"template: expected a string, got {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateLimitError(f"the template is {len(template):,} characters long, more than "
                                 f"{MAX_TEMPLATE_CHARS:,}")
    seconds = _seconds(timeout)
    from rcn_fast._arrays import require
    from rcn_fast._templates import pool

    require("jinja2", HINT)
    return pool.render(kind, template, plain(variables, "variables"), seconds)


# ------------------------------------------------------------------ the door
def render_task_template(template: str, doc: dict[str, Any], *, timeout: float | None = None) -> str:
    """Render a task's Jinja ``template`` (an lm-evaluation-harness
    ``doc_to_*`` setting) over the record ``doc`` in the render worker,
    within the limits of the module notes; an undefined name is an error.

    ``timeout``: seconds for this render (at most :data:`MAX_SECONDS`, the default).

    Raises
    ------
    TemplateLimitError
        A limit is exceeded (the message says which).
    TemplateRenderError
        The template is invalid, uses what the allowlist does not hold, or names an undefined field.
    """
    return _render("task", template, dict(doc), timeout)


def render_chat_template(template: str, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False,
                         tools: Sequence[Any] | None = None, documents: Sequence[Any] | None = None,
                         timeout: float | None = None, **variables: Any) -> str:
    """Render a model's chat ``template`` as transformers'
    ``apply_chat_template`` renders it (the same environment options,
    globals and variables: ``messages`` -- copies, keys whose value is None
    left out --, ``tools``, ``documents``, ``add_generation_prompt`` and
    ``variables``, e.g. the special tokens), in the render worker within
    the limits of the module notes.

    ``timeout``: seconds for this render (at most :data:`MAX_SECONDS`, the
    default); a server passes what is left of its request's time.

    Raises
    ------
    TemplateLimitError
        A limit is exceeded (the message says which).
    TemplateRenderError
        The template does not compile, uses what the allowlist does not hold, or fails (``raise_exception``).
    """
    turns = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    return _render("chat", template, {**variables, "messages": turns, "tools": tools, "documents": documents,
                                      "add_generation_prompt": bool(add_generation_prompt)}, timeout)


def chat_template_of(tokenizer: Any) -> str | None:
    """The chat template text of ``tokenizer`` (a transformers tokenizer or
    :class:`~rcn_fast.llm.backends.engine.tokenizer.GGUFTokenizer`); of a
    dict of named templates, the ``"default"`` one. None without one."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def chat_prompt(tokenizer: Any, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False,
                timeout: float | None = None) -> str:
    """The text of ``messages`` under ``tokenizer``'s chat template
    (:func:`render_chat_template` with the tokenizer's special tokens as
    variables, as ``tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=...)`` renders it): the one way rcn_fast renders a
    chat. ``timeout`` as :func:`render_chat_template`.

    Raises
    ------
    ValueError
        The tokenizer has no chat template.
    TemplateLimitError, TemplateRenderError
        As :func:`render_chat_template`, the message naming the tokenizer.
    """
    name = getattr(tokenizer, "name_or_path", None) or getattr(tokenizer, "path", None) or type(tokenizer).__name__
    template = chat_template_of(tokenizer)
    if template is None:
        raise ValueError(f"tokenizer: {name} has no chat template")
    special = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    for reserved in ("messages", "tools", "documents", "add_generation_prompt", "timeout"):
        special.pop(reserved, None)
    try:
        return render_chat_template(template, messages, add_generation_prompt=add_generation_prompt, timeout=timeout,
                                    **special)
    except (TemplateLimitError, TemplateRenderError) as exc:
        raise type(exc)(f"the chat template of {name}: {exc}") from None


def check_fields_template(template: str) -> list[str]:
    """The field names of a ``question_template`` (``{field}`` only: plain
    substitution; ``{{`` and ``}}`` write braces).

    Raises
    ------
    TemplateRenderError
        A format spec (``{q:>9}``), a conversion (``{q!r}``), an attribute or
        index (``{q.x}``, ``{q[0]}``), an empty or positional field, or an
        unmatched brace -- naming it.
    """
    if not isinstance(template, str):
        raise TemplateRenderError(f"question_template: expected a string, got {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateLimitError(f"question_template: {len(template):,} characters, more than "
                                 f"{MAX_TEMPLATE_CHARS:,}")
    names = []
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise TemplateRenderError(f"question_template: {exc} in {template!r:.200}") from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if spec or conversion or not field.isidentifier():
            shown = "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise TemplateRenderError(f"question_template: {shown!r:.120} is not a plain field; only {{field}} "
                                      "substitutions are allowed (no format specs, conversions, attributes, "
                                      "indexes or positional fields; write {{ and }} for braces)")
        names.append(field)
    return names


def fill_fields(template: str, record: Mapping[str, Any]) -> str:
    """A ``question_template`` filled from ``record``: each ``{field}``
    replaced by ``str(record[field])`` (:func:`check_fields_template`
    rules). The result is held to :data:`MAX_CHARS` characters, checked
    before it is built.

    Raises
    ------
    KeyError
        A field the record does not have (its name).
    TemplateRenderError, TemplateLimitError
        As :func:`check_fields_template`; a result over :data:`MAX_CHARS`.
    """
    check_fields_template(template)
    out, total = [], 0
    for literal, field, _, _ in string.Formatter().parse(template):
        pieces = [literal] if field is None else [literal, str(record[field])]
        for piece in pieces:
            total += len(piece)
            if total > MAX_CHARS:
                raise TemplateLimitError(f"question_template: the question would be longer than {MAX_CHARS:,} "
                                         "characters")
            out.append(piece)
    return "".join(out)


__all__ = ["TemplateLimitError", "TemplateRenderError", "render_task_template", "render_chat_template",
           "chat_template_of", "chat_prompt", "check_fields_template", "fill_fields", "plain", "MAX_STEPS",
           "MAX_SECONDS", "MAX_CHARS", "MAX_MADE", "MAX_INT_BITS", "MAX_TEMPLATE_CHARS", "MAX_VALUE_DEPTH"]
