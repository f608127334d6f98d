"""The limits of one template render, and the checks made *inside* the
render worker before an operation allocates (the first line of defence;
the worker's kernel limits are the guarantee: :mod:`rcn_fast._templates.pool`).

Per render:

* a step budget (:data:`MAX_STEPS`): every loop iteration, call, filter,
  operator and written expression counts one;
* a time limit (:data:`MAX_SECONDS`, or the door's shorter ``timeout``),
  checked at every step -- and enforced from outside by the parent, which
  kills the worker when it overruns;
* a size limit (:data:`MAX_CHARS`) on everything written and on every value
  a call, filter or operator makes; :func:`text_cost` counts what turning a
  value into text costs -- the characters of its strings, through lists,
  dicts, dict views and namespace objects, each reference counted -- so a
  list of a thousand references to one long string is a long value;
  integers are held to :data:`MAX_INT_BITS`;
* a memory budget (:data:`MAX_MADE`): the characters and items of every
  value made in one render, added up;
* the operations that could allocate more than :data:`MAX_CHARS` in one
  step are refused *before* they run, from their arguments (generators and
  dict views are first drawn into a list, a step an item): ``+``, ``~``,
  ``join`` (filter and method), ``replace``, ``indent``, ``string`` and the
  other filters that turn their value into text, ``tojson`` indents and
  separators, ``%`` formatting widths and precisions and ``strftime_now``.

Each limit is one :class:`TemplateLimitError` naming it. The budgets are
far above any real prompt or chat template.
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Iterable, Mapping, Sized
from typing import Any, Sequence

#: Loop iterations, calls, filters, operators and written expressions of one render.
MAX_STEPS = 100_000
#: Seconds one render may take (wall clock; the door's ``timeout`` may only shorten it).
MAX_SECONDS = 2.0
#: Characters (or items) written by one render, and of any one value made while rendering.
MAX_CHARS = 1_000_000
#: Characters and items of all the values one render makes, added up.
MAX_MADE = 64 * MAX_CHARS
#: Bits of any integer made while rendering.
MAX_INT_BITS = 65_536
#: Characters of a template's source.
MAX_TEMPLATE_CHARS = 200_000

_DIGITS = re.compile(r"\d+")
#: a printf conversion: %[(key)][flags][width][.precision][length]type
_PRINTF = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
#: filters that turn their value into text first (the cost of that text is checked before)
TEXT_FILTERS = frozenset({"trim", "upper", "lower", "title", "capitalize", "string", "replace", "indent", "safe",
                          "e", "escape", "join"})
_ESCAPES = {"escape": 6, "e": 6}


class TemplateLimitError(ValueError):
    """A template exceeds a limit of :mod:`rcn_fast._templates` (steps, time,
    sizes, memory, CPU); the message says which."""


class TemplateRenderError(ValueError):
    """A template that is refused or fails: it does not compile, uses what
    the allowlist does not hold (a filter, method, function or statement;
    the message names it), names an undefined variable, includes another
    template, or calls ``raise_exception``."""


# ------------------------------------------------------------------ the budget of one render
class Budget:
    """Steps, characters written and characters made so far in one render, and its deadline."""

    def __init__(self, seconds: float = MAX_SECONDS) -> None:
        self.steps = 0
        self.chars = 0
        self.made = 0
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimitError(f"the template runs more than {MAX_STEPS:,} steps (loop iterations, calls, "
                                     "filters and operators)")
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the template takes longer than {self.seconds:.3g} s to render")


BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("rcn_fast_template_budget", default=None)


def tick() -> None:
    b = BUDGET.get()
    if b is not None:
        b.tick()


def _namespace_attrs(v: Any) -> dict | None:
    try:  # jinja2.utils.Namespace keeps its values here (read past any __getattr__, e.g. an Undefined's)
        attrs = object.__getattribute__(v, "_Namespace__attrs")
    except AttributeError:
        return None
    return attrs if isinstance(attrs, dict) else None


def text_cost(v: Any, limit: int = MAX_CHARS + 1) -> int:
    """Characters plus items of ``v`` with the contents of its containers
    (lists, tuples, sets, dicts, dict views, namespace objects), every
    reference counted: an upper bound, within a constant factor, of what
    ``str(v)`` makes. Counted up to ``limit`` (so the count is bounded too)."""
    if isinstance(v, (str, bytes)):
        return len(v)
    total, stack = 0, [v]
    while stack and total < limit:
        x = stack.pop()
        if isinstance(x, (str, bytes)):
            total += len(x)
        elif isinstance(x, (list, tuple, set, frozenset, type({}.keys()), type({}.values()))):
            total += len(x) + 1
            stack.extend(x)
        elif isinstance(x, (dict, type({}.items()))):
            total += 2 * len(x) + 1
            stack.extend(x.keys() if isinstance(x, dict) else (k for kv in x for k in kv))
            if isinstance(x, dict):
                stack.extend(x.values())
        elif isinstance(x, int) and not isinstance(x, bool):
            total += x.bit_length() // 3 + 1
        else:
            attrs = _namespace_attrs(x)
            if attrs is not None:
                total += 2 * len(attrs) + 1
                stack.extend(attrs.keys())
                stack.extend(attrs.values())
            else:
                total += 1
    return total


def nodes_depth(v: Any, limit: int = MAX_CHARS + 1) -> tuple[int, int]:
    """(values, deepest nesting) of a JSON-like ``v``, counted up to ``limit`` values."""
    nodes, depth, stack = 0, 0, [(v, 1)]
    while stack and nodes < limit:
        x, d = stack.pop()
        nodes += 1
        depth = max(depth, d)
        if isinstance(x, Mapping):
            stack.extend((c, d + 1) for c in x.values())
            nodes += len(x)
        elif isinstance(x, (list, tuple)):
            stack.extend((c, d + 1) for c in x)
    return nodes, depth


def made(v: Any, what: str) -> Any:
    """``v``, a value just made: held to :data:`MAX_CHARS`, :data:`MAX_INT_BITS` and the render's :data:`MAX_MADE`."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"{what} makes an integer of more than {MAX_INT_BITS:,} bits")
    n = text_cost(v)
    if n > MAX_CHARS:
        raise TemplateLimitError(f"{what} makes a value of more than {MAX_CHARS:,} characters and items")
    b = BUDGET.get()
    if b is not None:
        b.made += n
        if b.made > MAX_MADE:
            raise TemplateLimitError(f"the template makes more than {MAX_MADE:,} characters and items in all")
    return v


def refuse_over(n: int, what: str) -> None:
    if n > MAX_CHARS:
        raise TemplateLimitError(f"{what}: the result could be longer than {MAX_CHARS:,} characters")


def drawn(items: Any, what: str) -> Any:
    """``items`` itself when it is a string, list or tuple; else its items
    drawn into a list, at most :data:`MAX_CHARS` of them (a generator's one
    step an item)."""
    if isinstance(items, (str, bytes, list, tuple)) or not isinstance(items, Iterable):
        return items
    if isinstance(items, Sized):  # a dict, dict view, set or range: its size is known
        if len(items) > MAX_CHARS:
            raise TemplateLimitError(f"{what}: more than {MAX_CHARS:,} items")
        return list(items)
    out = []
    for x in items:
        tick()
        out.append(x)
        if len(out) > MAX_CHARS:
            raise TemplateLimitError(f"{what}: more than {MAX_CHARS:,} items")
    return out


# ------------------------------------------------------------------ formats: widths and precisions
def printf_size(fmt: Any, args: Any, what: str) -> None:
    """Refuse ``fmt % args`` when its widths and precisions -- written or
    taken from ``args`` by ``*`` -- could make more than :data:`MAX_CHARS` characters."""
    if not isinstance(fmt, (str, bytes)):
        return
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    seq = list(args) if isinstance(args, tuple) else [args]
    total, i = len(text), 0
    for m in _PRINTF.finditer(text):
        key, width, prec, kind = m.groups()
        if kind == "%":
            continue
        nums = []
        for part in (width, prec):
            if part == "*":
                v = seq[i] if i < len(seq) else 0
                i += 1
                nums.append(abs(v) if isinstance(v, int) and not isinstance(v, bool) else 0)
            elif part is not None:
                nums.append(MAX_CHARS if len(part) > 7 else int(part))
        if key is not None:
            value = args.get(key) if isinstance(args, Mapping) else None
        else:
            value = seq[i] if i < len(seq) else None
            i += 1
        if any(n >= MAX_CHARS for n in nums):
            raise TemplateLimitError(f"{what}: a width or precision of {MAX_CHARS:,} or more in a format string")
        total += sum(nums) + (text_cost(value) if kind in "rsa" else 32)
    refuse_over(total, what)


def _spec_numbers(spec: str, what: str) -> int:
    total = 0
    for m in _DIGITS.finditer(spec):
        if len(m.group()) > 7 or int(m.group()) >= MAX_CHARS:
            raise TemplateLimitError(f"{what}: a width or precision of {MAX_CHARS:,} or more in a format string")
        total += int(m.group())
    return total


# ------------------------------------------------------------------ the checks made before an operation
def _ints(values: Iterable[Any]) -> list[int]:
    return [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]


def precheck(name: str, value: Any, rest: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Refuse, before it runs, a filter or method ``name`` on ``value``
    (with the other arguments ``rest`` and ``kwargs``) that could allocate
    more than :data:`MAX_CHARS` at once. ``join`` gets its items already
    :func:`drawn`."""
    opts = list(rest) + list(kwargs.values())
    if name in TEXT_FILTERS and not isinstance(value, (str, bytes)):
        refuse_over(text_cost(value), name)
    if name == "indent" and isinstance(value, str):
        strs, ints = [len(v) for v in opts if isinstance(v, str)], _ints(opts)
        if any(n > MAX_CHARS for n in ints):
            raise TemplateLimitError(f"indent: a width over {MAX_CHARS:,}")
        refuse_over(len(value) + (value.count("\n") + 1) * max(strs + ints + [4]), name)
    elif name == "replace":
        old, new = (list(rest) + ["", ""])[:2]
        if isinstance(value, str) and isinstance(old, str) and isinstance(new, str):
            hits = len(value) + 1 if not old else value.count(old)
            refuse_over(len(value) + hits * max(len(new) - len(old), 0), "replace")
    elif name == "join":  # (separator, items): the method's self, or the filter's argument
        sep, items = value, rest[0] if rest else ()
        if isinstance(sep, str) and isinstance(items, (list, tuple, str)):
            refuse_over(len(sep) * len(items) + sum(text_cost(x) for x in items), "join")
    elif name in _ESCAPES and isinstance(value, str):
        refuse_over(len(value) * _ESCAPES[name], name)
    elif name == "tojson":
        seps = kwargs.get("separators", rest[2] if len(rest) > 2 else None)
        step = max([len(v) for v in opts if isinstance(v, str)] + _ints(opts) + [0])
        sep = sum(len(s) for s in seps if isinstance(s, str)) if isinstance(seps, (list, tuple)) else 2
        nodes, depth = nodes_depth(value)
        if step > MAX_CHARS or sep > MAX_CHARS:
            raise TemplateLimitError(f"{name}: an indent or separator over {MAX_CHARS:,}")
        refuse_over(text_cost(value) + nodes * (depth * step + sep + 2), name)
    elif name == "strftime_now" and isinstance(value, str):
        refuse_over(len(value) * 8 + _spec_numbers(value, "strftime_now"), "strftime_now")


__all__ = ["TemplateLimitError", "TemplateRenderError", "Budget", "BUDGET", "tick", "text_cost", "nodes_depth",
           "made", "refuse_over", "drawn", "printf_size", "precheck", "TEXT_FILTERS", "MAX_STEPS", "MAX_SECONDS",
           "MAX_CHARS", "MAX_MADE", "MAX_INT_BITS", "MAX_TEMPLATE_CHARS"]
