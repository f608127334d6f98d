"""The bounded Jinja environment, used inside the render worker
(:mod:`rcn_fast._templates.worker`): Jinja's immutable sandbox, held to the
allowlist (:mod:`rcn_fast._templates.allowlist`) when a template is
compiled and when it calls anything, and to the budgets of
:mod:`rcn_fast._templates.limits` at every step.

Two configurations: task templates (lm-evaluation-harness ``doc_to_*``:
undefined names are an error) and chat templates (configured as
transformers configures them -- ``trim_blocks``, ``lstrip_blocks``, the
``generation`` and loop-control extensions, its ``tojson``,
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` -- so a
chat renders byte for byte as ``apply_chat_template`` renders it).

:func:`render` renders in the calling process: the door never calls it
there (it runs in the worker, under kernel limits); the benchmark does, to
measure what the worker costs.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from rcn_fast._templates import allowlist
from rcn_fast._templates.limits import (BUDGET, MAX_CHARS, MAX_INT_BITS, MAX_SECONDS, MAX_TEMPLATE_CHARS, Budget,
                                        TemplateLimitError, TemplateRenderError, drawn, made, precheck, printf_size,
                                        text_cost, tick)

_LOOP_GUARD = "rcn_fast_bounded_loop"


def _bounded_iter(iterable: Any) -> Any:
    for item in iterable:
        tick()
        yield item


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter of chat templates (no HTML escaping; its options)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    """transformers' ``strftime_now`` global of chat templates."""
    precheck("strftime_now", fmt, (), {})
    return datetime.now().strftime(fmt)


def raise_exception(message: str) -> None:
    """transformers' ``raise_exception`` global of chat templates."""
    raise TemplateRenderError(str(message))


def _guarded_filter(name: str, func: Any) -> Any:
    passes = getattr(func, "jinja_pass_arg", None) is not None

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        tick()
        head, (value, *rest) = (args[:1], args[1:]) if passes else ((), args)
        if name == "join":
            value = drawn(value, "join")
            sep = rest[0] if rest else kwargs.get("d", "")
            precheck("join", sep, [value], {})
        else:
            precheck(name, value, rest, kwargs)
        return made(func(*head, value, *rest, **kwargs), f"the filter {name!r}")

    return guarded


@functools.lru_cache(maxsize=2)
def environment(kind: str) -> Any:
    """The bounded environment of ``kind`` ``"task"`` or ``"chat"`` (built
    once; the budget of a render lives in a context variable)."""
    import jinja2
    import jinja2.ext
    from jinja2.compiler import CodeGenerator
    from jinja2.runtime import Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: checked before it is joined
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox with the allowlist and the budgets of :mod:`rcn_fast._templates`."""

        code_generator_class = _Generator
        intercepted_binops = frozenset({"+", "%"})

        def _parse(self, source: str, name: Any, filename: Any) -> Any:
            tree = super()._parse(source, name, filename)
            allowlist.check(tree, kind)
            for loop in list(tree.find_all(jinja2.nodes.For)):  # every loop iteration counts a step
                loop.iter = jinja2.nodes.Call(jinja2.nodes.Name(_LOOP_GUARD, "load"), [loop.iter], [], None, None)
            return tree

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            if not super().is_safe_attribute(obj, attr, value):
                return False
            return not callable(value) or isinstance(value, Macro) or allowlist.allowed_method(value)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            tick()
            name = getattr(__obj, "__name__", type(__obj).__name__)
            if allowlist.allowed_method(__obj):
                if name == "join" and isinstance(__obj.__self__, str) and args:
                    args = (drawn(args[0], "join"), *args[1:])
                precheck(name, __obj.__self__, args, kwargs)
            elif not (isinstance(__obj, Macro) or __obj is _bounded_iter
                      or any(__obj is g for g in __self.allowed_functions)
                      or isinstance(getattr(__obj, "__self__", None), jinja2.ext.Extension)):
                raise TemplateRenderError(f"the template calls {name!r}, which is not a macro of the template nor "
                                          "an allowed function or method")
            return made(super().call(__context, __obj, *args, **kwargs), f"calling {name}")

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            tick()
            if operator == "%":
                printf_size(left, right, "'%'")
            elif operator == "+" and text_cost(left) + text_cost(right) > MAX_CHARS:
                raise TemplateLimitError(f"'+': the result would hold more than {MAX_CHARS:,} characters or items")
            return made(super().call_binop(context, operator, left, right), f"{operator!r}")

        @staticmethod
        def bounded_concat(parts: tuple[Any, ...]) -> str:
            tick()
            if sum(text_cost(p) for p in parts) > MAX_CHARS:
                raise TemplateLimitError(f"'~': the result would hold more than {MAX_CHARS:,} characters")
            return made("".join(str(p) for p in parts), "'~'")

    def finalize(value: Any) -> Any:  # every ``{{ ... }}`` written, in macros and blocks too
        b = BUDGET.get()
        if b is not None:
            b.tick()
            b.chars += len(value) if isinstance(value, str) else text_cost(value) + 16
            if b.chars > MAX_CHARS:
                raise TemplateLimitError(f"the template writes more than {MAX_CHARS:,} characters")
        return value

    # nothing is evaluated at compile time (optimized=False); every output expression is counted
    if kind == "task":
        env = BoundedEnvironment(undefined=jinja2.StrictUndefined, optimized=False, finalize=finalize)
        global_names = allowlist.TASK_GLOBALS
    else:
        env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, optimized=False, finalize=finalize,
                                 extensions=[_generation_extension(jinja2), jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                           namespace=_namespace_class(jinja2))
        global_names = allowlist.CHAT_GLOBALS
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items() if name in allowlist.FILTERS}
    env.tests = {name: t for name, t in env.tests.items() if name in allowlist.TESTS}
    env.globals = {name: g for name, g in env.globals.items() if name in global_names}
    env.allowed_functions = tuple(env.globals.values())
    env.globals[_LOOP_GUARD] = _bounded_iter
    return env


def _generation_extension(jinja2: Any) -> Any:
    class Generation(jinja2.ext.Extension):  # {% generation %}...{% endgeneration %}: rendered as is
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller: Any) -> str:
            return caller()

    return Generation


def _namespace_class(jinja2: Any) -> Any:
    class TemplateNamespace(jinja2.utils.Namespace):  # transformers': no underscore-prefixed attributes
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- Jinja's signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"Chat templates cannot store underscore-prefixed attributes "
                                                      f"on a namespace, but got {name!r}.")

    return TemplateNamespace


@functools.lru_cache(maxsize=64)
def compiled(kind: str, source: str) -> Any:
    """``source`` compiled in the environment of ``kind`` (allowlist checked), cached.

    Raises
    ------
    TemplateLimitError
        The source is longer than :data:`MAX_TEMPLATE_CHARS` or nests too deeply.
    TemplateRenderError
        It does not compile, or uses what the allowlist does not hold.
    """
    if not isinstance(source, str):
        raise TypeError(f"template: expected a string, got {type(source).__name__}")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateLimitError(f"the template is {len(source):,} characters long, more than "
                                 f"{MAX_TEMPLATE_CHARS:,}")
    with _errors():
        return environment(kind).from_string(source)


class _errors:
    """Every failure of a compile or render as one of the door's two errors."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if exc is None or isinstance(exc, (TemplateLimitError, TemplateRenderError)):
            return False
        if isinstance(exc, RecursionError):
            raise TemplateLimitError("the template recurses too deeply (or nests too deeply)") from None
        if isinstance(exc, MemoryError):
            raise TemplateLimitError("the template needs more memory than its limit") from None
        if isinstance(exc, Exception):
            import jinja2

            what = "" if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: "
            raise TemplateRenderError(f"{what}{exc}") from None
        return False


def render(kind: str, source: str, variables: dict[str, Any], seconds: float = MAX_SECONDS) -> str:
    """Render ``source`` (a template of ``kind``) over ``variables`` in this
    process, within the budgets of :mod:`rcn_fast._templates.limits`.

    Raises
    ------
    TemplateLimitError, TemplateRenderError
        As the door (:mod:`rcn_fast._templates`).
    """
    template = compiled(kind, source)
    token = BUDGET.set(Budget(seconds))
    try:
        with _errors():
            out = template.render(**variables)
    finally:
        BUDGET.reset(token)
    if len(out) > MAX_CHARS:
        raise TemplateLimitError(f"the rendered template is longer than {MAX_CHARS:,} characters")
    return out


__all__ = ["environment", "compiled", "render", "strftime_now", "raise_exception", "MAX_INT_BITS"]
