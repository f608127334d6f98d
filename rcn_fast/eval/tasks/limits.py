"""What one task file may cost: a YAML loader with an alias budget, and
Jinja rendering (lm-evaluation-harness templates) with a budget of steps,
time and sizes. A small file cannot exhaust memory or time: each limit
fails at once with one :class:`TaskLimitError` (the readers name the file).

YAML (:class:`BoundedLoader`, a ``yaml.SafeLoader``): anchors and aliases
are allowed, but everything the aliases repeat -- nodes plus scalar
characters, counted as if expanded -- is held to :data:`MAX_ALIAS_COST`
per file, and nesting to :data:`MAX_DEPTH` levels. A "billion laughs"
file (a few hundred bytes whose aliases expand to billions of nodes) is
refused while it is read, before anything is built from it.

Jinja (:func:`render`): Jinja's immutable sandbox (no attribute tricks, no
mutation of the record), plus

* a step budget per render (:data:`MAX_STEPS`): every loop iteration,
  call, filter and intercepted operator counts one;
* a time limit per render (:data:`MAX_SECONDS`), checked at every step;
* a size limit (:data:`MAX_CHARS`) on everything the template writes
  (counted as it is written, in macros and blocks too) and on every value a
  call, filter, operator or ``~`` produces (a list counts its items'
  characters too), integers held to :data:`MAX_INT_BITS`; the operations
  that could allocate more than that in one step (``*`` repetition,
  ``**``, padding, indent and format widths, ``replace``, ``join``) are
  refused before they run;
* recursion deeper than Python's stack is a limit too.

The budgets are generous for any real prompt template (a few loops over a
record's fields) and small enough that the worst template fails in well
under a second.
"""

from __future__ import annotations

import contextvars
import re
import time
from typing import Any, Iterable, Iterator

import yaml

#: Nodes plus scalar characters that a task file's aliases may repeat in all.
MAX_ALIAS_COST = 100_000
#: Nesting depth of a task file's YAML (mappings and lists).
MAX_DEPTH = 100
#: Loop iterations, calls, filters and operators of one template render.
MAX_STEPS = 100_000
#: Seconds one template render may take.
MAX_SECONDS = 2.0
#: Characters (or items) of a rendered template and of any value made while rendering it.
MAX_CHARS = 1_000_000
#: Bits of any integer made while rendering a template.
MAX_INT_BITS = 65_536


class TaskLimitError(ValueError):
    """A task file (or one of its templates) exceeds a limit of this
    module; the message says which."""


# ------------------------------------------------------------------ YAML
class BoundedYAMLError(yaml.MarkedYAMLError):
    """A YAML file exceeds :data:`MAX_ALIAS_COST` or :data:`MAX_DEPTH` (with its line)."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with an alias budget and a depth limit (module notes)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._alias_cost = 0
        self._depth = 0
        self._open: set[str] = set()  # anchors of the collections being composed

    def compose_sequence_node(self, anchor: Any) -> Any:
        return self._compose_open(anchor, super().compose_sequence_node)

    def compose_mapping_node(self, anchor: Any) -> Any:
        return self._compose_open(anchor, super().compose_mapping_node)

    def _compose_open(self, anchor: Any, compose: Any) -> Any:
        if anchor is None:
            return compose(anchor)
        self._open.add(anchor)
        try:
            return compose(anchor)
        finally:
            self._open.discard(anchor)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise BoundedYAMLError(None, None, f"alias *{event.anchor} refers to a collection that holds it "
                                       "(a recursive structure)", event.start_mark)
            node = self.anchors.get(event.anchor)
            if node is not None:  # an undefined alias is the base class's error
                left = MAX_ALIAS_COST - self._alias_cost
                self._alias_cost += _expanded_size(node, left + 1)
                if self._alias_cost > MAX_ALIAS_COST:
                    raise BoundedYAMLError(None, None, f"its aliases repeat more than {MAX_ALIAS_COST:,} nodes and "
                                           "characters (a YAML alias bomb?); write the values out or use fewer "
                                           "aliases", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise BoundedYAMLError(None, None, f"it nests more than {MAX_DEPTH} levels deep",
                                       self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes plus scalar characters of ``node`` with its aliases expanded
    (``node`` holds no alias to itself: :class:`BoundedLoader` refuses
    those), counted up to ``limit`` (so the work is bounded too)."""
    total = 0
    stack: list[Any] = [node]
    while stack and total < limit:
        n = stack.pop()
        total += 1
        if isinstance(n, yaml.ScalarNode):
            total += len(n.value)
        else:
            for child in n.value:
                stack.extend(child if isinstance(child, tuple) else (child,))
    return total


def load_yaml(text: str, loader: type[yaml.SafeLoader] = BoundedLoader) -> Any:
    """``yaml.load`` with a :class:`BoundedLoader` (or a subclass); the
    limits raise :class:`BoundedYAMLError`, a ``yaml.YAMLError``."""
    if not issubclass(loader, BoundedLoader):
        raise TypeError(f"loader: expected a BoundedLoader subclass, got {loader.__name__}")
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise BoundedYAMLError(None, None, "it nests too deeply", None) from None


# ------------------------------------------------------------------ Jinja
class _Budget:
    def __init__(self) -> None:
        self.steps = 0
        self.chars = 0  # written by ``{{ ... }}`` so far (macros and blocks included)
        self.deadline = time.monotonic() + MAX_SECONDS

    def emit(self, n: int) -> None:
        self.chars += n
        if self.chars > MAX_CHARS:
            raise TaskLimitError(f"the template writes more than {MAX_CHARS:,} characters")

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise TaskLimitError(f"the template runs more than {MAX_STEPS:,} steps (loop iterations, calls, filters "
                                 "and operators)")
        if time.monotonic() > self.deadline:
            raise TaskLimitError(f"the template takes longer than {MAX_SECONDS:g} s to render")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("rcn_fast_template_budget", default=None)
_WIDTH = re.compile(r"\d{7,}")  # a width or precision of 1,000,000 or more in a format string
_LOOP_GUARD = "rcn_fast_bounded_loop"


def _tick() -> None:
    b = _BUDGET.get()
    if b is not None:
        b.tick()


def _size(v: Any, limit: int = MAX_CHARS + 1) -> int:
    """Characters plus items of ``v`` with its containers' contents (what
    turning it into text costs), counted up to ``limit``."""
    if isinstance(v, (str, bytes)):
        return len(v)
    if not isinstance(v, (list, tuple, dict, set, frozenset)):
        return 0
    total, stack = 0, [v]
    while stack and total < limit:
        x = stack.pop()
        if isinstance(x, (str, bytes)):
            total += len(x)
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += len(x)
            stack.extend(x)
        elif isinstance(x, dict):
            total += len(x)
            stack.extend(x.keys())
            stack.extend(x.values())
    return total


def _check_result(v: Any, what: str) -> Any:
    n = _size(v)
    if n > MAX_CHARS:
        raise TaskLimitError(f"{what} makes a value of more than {MAX_CHARS:,} characters and items")
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
        raise TaskLimitError(f"{what} makes an integer of more than {MAX_INT_BITS:,} bits")
    return v


def _check_widths(text: Any, what: str) -> None:
    if isinstance(text, str) and _WIDTH.search(text):
        raise TaskLimitError(f"{what}: a width or precision of {MAX_CHARS:,} or more in a format string")


def _precheck(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], self_: Any = None) -> None:
    """Refuse, before it runs, an operation that would allocate more than :data:`MAX_CHARS` at once."""
    values = list(args) + list(kwargs.values())
    if name in ("center", "ljust", "rjust", "zfill", "indent", "expandtabs", "truncate", "wordwrap"):
        if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_CHARS for v in values):
            raise TaskLimitError(f"{name}: a width over {MAX_CHARS:,}")
        text = self_ if isinstance(self_, str) else (args[0] if args and isinstance(args[0], str) else "")
        extra = [v for v in (list(args[1:]) if self_ is None else list(args)) + list(kwargs.values())
                 if isinstance(v, str)]  # an indent string, a wrap string: written once a line at most
        if extra and len(text) + (text.count("\n") + len(text) // 8 + 1) * max(map(len, extra)) > MAX_CHARS:
            raise TaskLimitError(f"{name}: the result could be longer than {MAX_CHARS:,} characters")
    elif name in ("format", "format_map"):
        _check_widths(self_ if self_ is not None else (args[0] if args else None), name)
    elif name == "replace":
        s = self_ if self_ is not None else (args[0] if args else "")
        rest = list(args) if self_ is not None else list(args[1:])
        old, new = (rest + ["", ""])[:2]
        if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
            hits = len(s) + 1 if not old else s.count(old)
            if len(s) + hits * max(len(new) - len(old), 0) > MAX_CHARS:
                raise TaskLimitError(f"replace: the result would be longer than {MAX_CHARS:,} characters")
    elif name == "join":
        seq = self_ if self_ is not None and not isinstance(self_, str) else (args[0] if args else ())
        sep = self_ if isinstance(self_, str) else (args[1] if len(args) > 1 else kwargs.get("d", ""))
        if isinstance(sep, str) and isinstance(seq, (list, tuple, str, range)):
            parts = sum(len(x) for x in seq if isinstance(x, str)) if isinstance(seq, (list, tuple)) else 0
            if len(sep) * len(seq) + parts > MAX_CHARS:
                raise TaskLimitError(f"join: the result would be longer than {MAX_CHARS:,} characters")


def _guarded_filter(name: str, func: Any) -> Any:
    import functools

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        # a filter's first argument (after a passed context/environment) is its value
        _precheck(name, args[1:] if getattr(func, "jinja_pass_arg", None) is not None else args, kwargs)
        return _check_result(func(*args, **kwargs), f"filter {name!r}")

    return guarded


def _bounded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    for item in iterable:
        _tick()
        yield item


_ENV: Any = None


def _environment() -> Any:
    """The bounded sandbox (built once; its state per render lives in a context variable)."""
    global _ENV
    if _ENV is not None:
        return _ENV
    from rcn_fast._arrays import require

    require("jinja2", 'pip install jinja2  (or pip install "rcn_fast[eval]")')
    from jinja2 import StrictUndefined, nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: held to MAX_CHARS
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        code_generator_class = _Generator
        intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/"})

        def _parse(self, source: str, name: Any, filename: Any) -> Any:
            tree = super()._parse(source, name, filename)
            for loop in list(tree.find_all(nodes.For)):  # every loop iteration counts a step
                loop.iter = nodes.Call(nodes.Name(_LOOP_GUARD, "load"), [loop.iter], [], None, None)
            return tree

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            _tick()
            if __obj is not _bounded_iter:
                _precheck(getattr(__obj, "__name__", ""), args, kwargs, getattr(__obj, "__self__", None))
            return _check_result(super().call(__context, __obj, *args, **kwargs),
                                 f"calling {getattr(__obj, '__name__', type(__obj).__name__)}")

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _tick()
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and (isinstance(seq, (str, bytes, list, tuple))) \
                            and _size(seq) * max(n, 0) > MAX_CHARS:
                        raise TaskLimitError(f"'*': repeating {_size(seq):,} characters or items {n:,} times")
                if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise TaskLimitError(f"'*': an integer of more than {MAX_INT_BITS:,} bits")
            elif operator == "**" and all(isinstance(v, (int, float)) for v in (left, right)):
                bits = max(abs(left), 2).bit_length() if ints else 64
                if abs(left) > 1 and (abs(right) > 4096 or (ints and bits * abs(right) > MAX_INT_BITS)):
                    raise TaskLimitError(f"'**': an exponent of {right!r}")
            elif operator == "%":
                _check_widths(left, "'%'")
            elif operator == "+" and _size(left) + _size(right) > MAX_CHARS:
                raise TaskLimitError(f"'+': the result would hold more than {MAX_CHARS:,} characters or items")
            return _check_result(super().call_binop(context, operator, left, right), f"{operator!r}")

        def wrap_str_format(self, value: Any) -> Any:
            f_self = getattr(value, "__self__", None)
            if getattr(value, "__name__", "") in ("format", "format_map"):
                _check_widths(f_self, "format")
            return super().wrap_str_format(value)

        @staticmethod
        def bounded_concat(parts: tuple[Any, ...]) -> str:
            _tick()
            texts = [str(p) for p in parts]
            if sum(len(t) for t in texts) > MAX_CHARS:
                raise TaskLimitError(f"'~': the result would hold more than {MAX_CHARS:,} characters")
            return "".join(texts)

    def finalize(value: Any) -> Any:  # every ``{{ ... }}`` written, in macros and blocks too
        b = _BUDGET.get()
        if b is not None:
            b.tick()
            b.emit(len(value) if isinstance(value, str) else _size(value) + 16)
        return value

    # nothing is evaluated at compile time (optimized=False); every output expression is counted
    env = BoundedEnvironment(undefined=StrictUndefined, optimized=False, finalize=finalize)
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
    env.globals[_LOOP_GUARD] = _bounded_iter
    _ENV = env
    return env


def render(template: str, doc: dict[str, Any]) -> str:
    """Render a Jinja ``template`` over the record ``doc`` within the
    limits of the module notes.

    Raises
    ------
    TaskLimitError
        A limit is exceeded (the message says which).
    jinja2.TemplateError
        The template is invalid or names an undefined field.
    """
    env = _environment()
    token = _BUDGET.set(_Budget())
    try:
        out = env.from_string(template).render(**doc)
    except RecursionError:
        raise TaskLimitError("the template recurses too deeply") from None
    except MemoryError:
        raise TaskLimitError("the template needs more memory than there is") from None
    finally:
        _BUDGET.reset(token)
    return _check_result(out, "the rendered template")


__all__ = ["TaskLimitError", "BoundedLoader", "BoundedYAMLError", "load_yaml", "render", "MAX_ALIAS_COST",
           "MAX_DEPTH", "MAX_STEPS", "MAX_SECONDS", "MAX_CHARS", "MAX_INT_BITS"]
