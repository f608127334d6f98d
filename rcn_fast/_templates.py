"""The one door for every Jinja template rcn_fast renders: task templates
(lm-evaluation-harness ``doc_to_*`` settings), the chat template of a GGUF
file (``tokenizer.chat_template``) and the chat template of a model folder
(``tokenizer_config.json`` / ``chat_template.jinja``, whichever tokenizer
loaded it). Nothing else in the package imports jinja2 or calls a
tokenizer's ``apply_chat_template`` (tests/test_trust_doors.py walks the
package for such a path).

One bounded environment class, :class:`BoundedEnvironment` (Jinja's
immutable sandbox), in two configurations: task templates
(:func:`render_task_template`: undefined names are an error) and chat
templates (:func:`render_chat_template`, :func:`chat_prompt`: configured as
transformers configures it -- ``trim_blocks``, ``lstrip_blocks``, the
``generation`` and loop-control extensions, its ``tojson``,
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` -- so a
chat renders byte for byte as ``apply_chat_template`` renders it). Per
render:

* a step budget (:data:`MAX_STEPS`): every loop iteration, call, filter,
  operator and written expression counts one;
* a time limit (:data:`MAX_SECONDS`), checked at every step;
* a size limit (:data:`MAX_CHARS`) on everything written (counted as it is
  written, in macros and blocks too) and on every value a call, filter or
  operator makes (a list counts its items' characters too); integers are
  held to :data:`MAX_INT_BITS`;
* a memory budget (:data:`MAX_MADE`): the characters and items of every
  value made in one render, added up;
* the operations that could allocate more than :data:`MAX_CHARS` in one
  step are refused *before* they run, from their arguments: ``*`` on
  strings and lists, ``**``, ``+``, ``~``, ``join``, ``replace``,
  ``translate``, padding and indent widths (``center``, ``indent``,
  ``expandtabs``, ...), ``batch`` / ``slice`` counts, ``int.to_bytes``,
  ``lipsum``, ``tojson`` indents and separators, HTML / URL escaping, ``%``
  formatting and the ``format`` filter (widths and precisions, ``*`` ones
  included), ``str.format`` / ``format_map`` (every field's resolved
  format spec, nested ``{}`` widths included) and ``strftime_now``;
* a template source longer than :data:`MAX_TEMPLATE_CHARS` is refused
  before it is compiled; recursion deeper than Python's stack is a limit.

Each limit is one :class:`TemplateLimitError` naming it. The budgets are
far above any real prompt or chat template and small enough that the worst
template fails in well under a second.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import time
from datetime import datetime
from typing import Any, Iterable, Iterator, Sequence

#: Loop iterations, calls, filters, operators and written expressions of one render.
MAX_STEPS = 100_000
#: Seconds one render may take.
MAX_SECONDS = 2.0
#: Characters (or items) written by one render, and of any one value made while rendering.
MAX_CHARS = 1_000_000
#: Characters and items of all the values one render makes, added up.
MAX_MADE = 64 * MAX_CHARS
#: Bits of any integer made while rendering.
MAX_INT_BITS = 65_536
#: Characters of a template's source.
MAX_TEMPLATE_CHARS = 200_000

HINT = "pip install jinja2  (or pip install \"rcn_fast[eval]\" / \"rcn_fast[llm]\")"
_LOOP_GUARD = "rcn_fast_bounded_loop"
_DIGITS = re.compile(r"\d+")
#: a printf conversion: %[(key)][flags][width][.precision][length]type
_PRINTF = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([diouxXeEfFgGcrsa%])")
_WIDTH_NAMES = frozenset({"center", "ljust", "rjust", "zfill", "truncate", "wordwrap", "batch", "slice", "to_bytes"})
_ESCAPES = {"escape": 6, "e": 6, "forceescape": 6, "urlencode": 12}


class TemplateLimitError(ValueError):
    """A template exceeds a limit of :mod:`rcn_fast._templates`; the message says which."""


class TemplateRenderError(ValueError):
    """A template that does not compile or fails while rendering (Jinja's
    ``TemplateError``, e.g. an undefined name or ``raise_exception``)."""


# ------------------------------------------------------------------ the budget of one render
class _Budget:
    def __init__(self) -> None:
        self.steps = 0
        self.chars = 0  # written so far
        self.made = 0  # characters and items of every value made so far
        self.deadline = time.monotonic() + MAX_SECONDS

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimitError(f"the template runs more than {MAX_STEPS:,} steps (loop iterations, calls, "
                                     "filters and operators)")
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"the template takes longer than {MAX_SECONDS:g} s to render")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("rcn_fast_template_budget", default=None)


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


def _nodes_depth(v: Any, limit: int = MAX_CHARS + 1) -> tuple[int, int]:
    """(values, deepest nesting) of a JSON-like ``v``, counted up to ``limit`` values."""
    nodes, depth, stack = 0, 0, [(v, 1)]
    while stack and nodes < limit:
        x, d = stack.pop()
        nodes += 1
        depth = max(depth, d)
        if isinstance(x, dict):
            stack.extend((c, d + 1) for c in x.values())
            nodes += len(x)  # the keys
        elif isinstance(x, (list, tuple)):
            stack.extend((c, d + 1) for c in x)
    return nodes, depth


def _made(v: Any, what: str) -> Any:
    """``v``, a value just made: held to :data:`MAX_CHARS`, :data:`MAX_INT_BITS` and the render's :data:`MAX_MADE`."""
    n = _size(v)
    if n > MAX_CHARS:
        raise TemplateLimitError(f"{what} makes a value of more than {MAX_CHARS:,} characters and items")
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"{what} makes an integer of more than {MAX_INT_BITS:,} bits")
    b = _BUDGET.get()
    if b is not None:
        b.made += n
        if b.made > MAX_MADE:
            raise TemplateLimitError(f"the template makes more than {MAX_MADE:,} characters and items in all")
    return v


def _refuse_over(n: int, what: str) -> None:
    if n > MAX_CHARS:
        raise TemplateLimitError(f"{what}: the result could be longer than {MAX_CHARS:,} characters")


# ------------------------------------------------------------------ formats: widths and precisions
def _spec_numbers(spec: str, what: str) -> int:
    """The sum of the numbers (widths, precisions) written in a format spec;
    one of :data:`MAX_CHARS` or more is refused (before any ``int()`` of it)."""
    total = 0
    for m in _DIGITS.finditer(spec):
        if len(m.group()) > 7 or int(m.group()) >= MAX_CHARS:
            raise TemplateLimitError(f"{what}: a width or precision of {MAX_CHARS:,} or more in a format string")
        total += int(m.group())
    return total


def _printf_size(fmt: Any, args: Any, what: str) -> None:
    """Refuse ``fmt % args`` (``%`` or the ``format`` filter) when its
    widths and precisions -- written or taken from ``args`` by ``*`` --
    could make more than :data:`MAX_CHARS` characters."""
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
            value = args.get(key) if isinstance(args, dict) else None
        else:
            value = seq[i] if i < len(seq) else None
            i += 1
        if any(n >= MAX_CHARS for n in nums):
            raise TemplateLimitError(f"{what}: a width or precision of {MAX_CHARS:,} or more in a format string")
        total += sum(nums) + (_size(value) if kind in "rsa" else 32)
    _refuse_over(total, what)


def _check_strftime(fmt: Any) -> None:
    if isinstance(fmt, str):
        _refuse_over(len(fmt) * 8 + _spec_numbers(fmt, "strftime_now"), "strftime_now")


# ------------------------------------------------------------------ the checks made before an operation
def _ints(values: Iterable[Any]) -> list[int]:
    return [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _precheck(name: str, args: Sequence[Any], kwargs: dict[str, Any], self_: Any = None) -> None:
    """Refuse, before it runs, a call that could allocate more than
    :data:`MAX_CHARS` at once. ``self_``: the object of a method call
    (else ``args[0]`` is a filter's value)."""
    value = self_ if self_ is not None else (args[0] if args else None)
    rest = list(args) if self_ is not None else list(args[1:])
    opts = rest + list(kwargs.values())
    if name in _WIDTH_NAMES and any(n > MAX_CHARS for n in _ints(opts)):
        raise TemplateLimitError(f"{name}: a width or count over {MAX_CHARS:,}")
    if name in ("indent", "expandtabs", "wordwrap") and isinstance(value, (str, bytes)):
        strs, ints = [len(v) for v in opts if isinstance(v, (str, bytes))], _ints(opts)
        nl, tab = ("\n", "\t") if isinstance(value, str) else (b"\n", b"\t")
        if name == "indent":  # a width (or indent string) written once a line
            lines, per_line = value.count(nl) + 1, max(strs + ints + [4])
        elif name == "expandtabs":  # each tab becomes at most tabsize spaces
            lines, per_line = value.count(tab) + 1, max(ints + [8])
        else:  # wordwrap: a wrap string at most once a word
            lines, per_line = len(value) // 2 + 1, max(strs + [1])
        _refuse_over(len(value) + lines * per_line, name)
    elif name in ("format", "format_map"):
        if self_ is None:  # the format filter: printf formatting of its value
            _printf_size(value, tuple(rest) if not kwargs else dict(kwargs), "format")
    elif name == "replace":
        old, new = (rest + ["", ""])[:2]
        if isinstance(value, (str, bytes)) and isinstance(old, (str, bytes)) and isinstance(new, (str, bytes)):
            hits = len(value) + 1 if not old else value.count(old)  # type: ignore[arg-type]
            _refuse_over(len(value) + hits * max(len(new) - len(old), 0), "replace")
    elif name == "join":
        seq = self_ if self_ is not None and not isinstance(self_, (str, bytes)) else \
            (rest[0] if self_ is not None and rest else value)
        sep = self_ if isinstance(self_, (str, bytes)) else (rest[0] if rest else kwargs.get("d", ""))
        if isinstance(sep, (str, bytes)) and isinstance(seq, (list, tuple, str, range)):
            parts = sum(len(x) for x in seq if isinstance(x, (str, bytes))) if isinstance(seq, (list, tuple)) else 0
            _refuse_over(len(sep) * len(seq) + parts, "join")
    elif name == "translate" and isinstance(value, str) and rest and isinstance(rest[0], dict):
        longest = max([len(v) for v in rest[0].values() if isinstance(v, str)] + [1])
        _refuse_over(len(value) * longest, "translate")
    elif name in _ESCAPES and isinstance(value, str):
        _refuse_over(len(value) * _ESCAPES[name], name)
    elif name in ("tojson", "dumps"):  # jinja's tojson(indent) and transformers' tojson(ensure_ascii, indent, ...)
        seps = kwargs.get("separators", rest[2] if len(rest) > 2 else None)
        step = max([len(v) for v in opts if isinstance(v, str)] + _ints(opts) + [0])
        sep = sum(len(s) for s in seps if isinstance(s, str)) if isinstance(seps, (list, tuple)) else 2
        nodes, depth = _nodes_depth(value)
        if step > MAX_CHARS or sep > MAX_CHARS:
            raise TemplateLimitError(f"{name}: an indent or separator over {MAX_CHARS:,}")
        _refuse_over(_size(value) + nodes * (depth * step + sep + 2), name)
    elif name == "generate_lorem_ipsum":  # lipsum(n, html, min, max): n paragraphs of up to max words
        n, mx = kwargs.get("n", 5 if value is None else value), kwargs.get("max", rest[2] if len(rest) > 2 else 100)
        if len(_ints([n, mx])) == 2:
            _refuse_over(abs(n) * (abs(mx) + 1) * 24, "lipsum")
    elif name == "strftime_now":
        _check_strftime(value)
    elif name == "sum" and isinstance(kwargs.get("start", rest[1] if len(rest) > 1 else 0), (list, tuple, str)):
        _refuse_over(_size(value) * 2, "sum")


def _guarded_filter(name: str, func: Any) -> Any:
    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        # a filter's first argument (after a passed context/environment) is its value
        _precheck(name, args[1:] if getattr(func, "jinja_pass_arg", None) is not None else args, kwargs)
        return _made(func(*args, **kwargs), f"filter {name!r}")

    return guarded


def _bounded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    for item in iterable:
        _tick()
        yield item


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter of chat templates (no HTML escaping; its options)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:  # the name the checks know it by
    """transformers' ``strftime_now`` global of chat templates."""
    return datetime.now().strftime(fmt)


# ------------------------------------------------------------------ the environment
@functools.lru_cache(maxsize=2)
def _environment(kind: str) -> Any:
    """The bounded environment of ``kind`` ``"task"`` or ``"chat"`` (built
    once; the budget of a render lives in a context variable)."""
    from rcn_fast._arrays import require

    jinja2 = require("jinja2", HINT)
    import jinja2.ext
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
    from markupsafe import Markup

    class _Generator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:  # ``a ~ b``: checked before it is joined
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class _Bounded:
        """``str.format``: every field's resolved spec (nested ``{}`` widths
        included) is checked before the field is formatted."""

        def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
            self._total = len(format_string)
            return super().vformat(format_string, args, kwargs)  # type: ignore[misc]

        def format_field(self, value: Any, format_spec: str) -> Any:
            _tick()
            self._total += _spec_numbers(format_spec, "format") + max(_size(value), 32)
            _refuse_over(self._total, "format")
            return super().format_field(value, format_spec)  # type: ignore[misc]

    class _Formatter(_Bounded, SandboxedFormatter):
        pass

    class _EscapeFormatter(_Bounded, SandboxedEscapeFormatter):
        pass

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox with the budgets of :mod:`rcn_fast._templates`."""

        code_generator_class = _Generator
        intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/"})

        def _parse(self, source: str, name: Any, filename: Any) -> Any:
            tree = super()._parse(source, name, filename)
            for loop in list(tree.find_all(jinja2.nodes.For)):  # every loop iteration counts a step
                loop.iter = jinja2.nodes.Call(jinja2.nodes.Name(_LOOP_GUARD, "load"), [loop.iter], [], None, None)
            return tree

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            _tick()
            if __obj is not _bounded_iter and not getattr(__obj, "rcn_fast_bounded", False):
                _precheck(getattr(__obj, "__name__", ""), args, kwargs, getattr(__obj, "__self__", None))
            return _made(super().call(__context, __obj, *args, **kwargs),
                         f"calling {getattr(__obj, '__name__', type(__obj).__name__)}")

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _tick()
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(n, int) and isinstance(seq, (str, bytes, list, tuple)) \
                            and _size(seq) * max(n, 0) > MAX_CHARS:
                        raise TemplateLimitError(f"'*': repeating {_size(seq):,} characters or items {n:,} times")
                if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise TemplateLimitError(f"'*': an integer of more than {MAX_INT_BITS:,} bits")
            elif operator == "**" and all(isinstance(v, (int, float)) for v in (left, right)):
                bits = max(abs(left), 2).bit_length() if ints else 64
                if abs(left) > 1 and (abs(right) > 4096 or (ints and bits * abs(right) > MAX_INT_BITS)):
                    raise TemplateLimitError(f"'**': an exponent of {right!r}")
            elif operator == "%":
                _printf_size(left, right, "'%'")
            elif operator == "+" and _size(left) + _size(right) > MAX_CHARS:
                raise TemplateLimitError(f"'+': the result would hold more than {MAX_CHARS:,} characters or items")
            return _made(super().call_binop(context, operator, left, right), f"{operator!r}")

        def wrap_str_format(self, value: Any) -> Any:  # jinja's, with the bounded formatters
            if super().wrap_str_format(value) is None:
                return None
            f_self, is_map = value.__self__, value.__name__ == "format_map"
            formatter = _EscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup) else _Formatter(self)

            def wrapper(*args: Any, **kwargs: Any) -> str:
                if is_map:
                    if kwargs:
                        raise TypeError("format_map() takes no keyword arguments")
                    if len(args) != 1:
                        raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                    args, kwargs = (), args[0]
                return type(f_self)(formatter.vformat(f_self, args, kwargs))

            wrapper = functools.update_wrapper(wrapper, value)
            wrapper.rcn_fast_bounded = True  # type: ignore[attr-defined]
            return wrapper

        @staticmethod
        def bounded_concat(parts: tuple[Any, ...]) -> str:
            _tick()
            texts = [str(p) for p in parts]
            if sum(len(t) for t in texts) > MAX_CHARS:
                raise TemplateLimitError(f"'~': the result would hold more than {MAX_CHARS:,} characters")
            return _made("".join(texts), "'~'")

    def finalize(value: Any) -> Any:  # every ``{{ ... }}`` written, in macros and blocks too
        b = _BUDGET.get()
        if b is not None:
            b.tick()
            b.chars += len(value) if isinstance(value, str) else _size(value) + 16
            if b.chars > MAX_CHARS:
                raise TemplateLimitError(f"the template writes more than {MAX_CHARS:,} characters")
        return value

    # nothing is evaluated at compile time (optimized=False); every output expression is counted
    if kind == "task":
        env = BoundedEnvironment(undefined=jinja2.StrictUndefined, optimized=False, finalize=finalize)
    else:
        env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, optimized=False, finalize=finalize,
                                 extensions=[_generation_extension(jinja2), jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                           dict=_TemplateDict(), namespace=_namespace_class(jinja2))
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
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


def raise_exception(message: str) -> None:
    """transformers' ``raise_exception`` global of chat templates."""
    raise TemplateRenderError(message)


class _TemplateDict:
    """transformers' ``dict`` global of chat templates (a call, ``fromkeys``; no other attribute)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


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
def _compiled(kind: str, template: str) -> Any:
    return _environment(kind).from_string(template)


def _render(kind: str, template: Any, variables: dict[str, Any]) -> str:
    if not isinstance(template, str):
        raise TypeError(f"template: expected a string, got {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateLimitError(f"the template is {len(template):,} characters long, more than "
                                 f"{MAX_TEMPLATE_CHARS:,}")
    from jinja2 import TemplateError

    token = _BUDGET.set(_Budget())
    try:
        out = _compiled(kind, template).render(**variables)
    except RecursionError:
        raise TemplateLimitError("the template recurses too deeply") from None
    except MemoryError:
        raise TemplateLimitError("the template needs more memory than there is") from None
    except TemplateError as exc:
        raise TemplateRenderError(str(exc)) from None
    finally:
        _BUDGET.reset(token)
    if len(out) > MAX_CHARS:
        raise TemplateLimitError(f"the rendered template is longer than {MAX_CHARS:,} characters")
    return out


# ------------------------------------------------------------------ the door
def render_task_template(template: str, doc: dict[str, Any]) -> str:
    """Render a task's Jinja ``template`` (an lm-evaluation-harness
    ``doc_to_*`` setting) over the record ``doc`` within the limits of the
    module notes; an undefined name is an error.

    Raises
    ------
    TemplateLimitError
        A limit is exceeded (the message says which).
    TemplateRenderError
        The template is invalid or names an undefined field.
    """
    return _render("task", template, dict(doc))


def render_chat_template(template: str, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False,
                         **variables: Any) -> str:
    """Render a model's chat ``template`` as transformers'
    ``apply_chat_template`` renders it (the same environment options,
    globals and variables: ``messages`` -- copies, keys whose value is None
    left out --, ``tools=None``, ``documents=None``,
    ``add_generation_prompt`` and ``variables``, e.g. the special tokens),
    within the limits of the module notes.

    Raises
    ------
    TemplateLimitError
        A limit is exceeded (the message says which).
    TemplateRenderError
        The template does not compile, or fails (``raise_exception``).
    """
    turns = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
    return _render("chat", template, {**variables, "messages": turns, "tools": None, "documents": None,
                                      "add_generation_prompt": bool(add_generation_prompt)})


def chat_template_of(tokenizer: Any) -> str | None:
    """The chat template text of ``tokenizer`` (a transformers tokenizer or
    :class:`~rcn_fast.llm.backends.engine.tokenizer.GGUFTokenizer`); of a
    dict of named templates, the ``"default"`` one. None without one."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def chat_prompt(tokenizer: Any, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
    """The text of ``messages`` under ``tokenizer``'s chat template
    (:func:`render_chat_template` with the tokenizer's special tokens as
    variables, as ``tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=...)`` renders it): the one way rcn_fast renders a
    chat.

    Raises
    ------
    ValueError
        The tokenizer has no chat template.
    TemplateLimitError, TemplateRenderError
        As :func:`render_chat_template`.
    """
    name = getattr(tokenizer, "name_or_path", None) or getattr(tokenizer, "path", None) or type(tokenizer).__name__
    template = chat_template_of(tokenizer)
    if template is None:
        raise ValueError(f"tokenizer: {name} has no chat template")
    special = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    try:
        return render_chat_template(template, messages, add_generation_prompt=add_generation_prompt, **special)
    except (TemplateLimitError, TemplateRenderError) as exc:
        raise type(exc)(f"the chat template of {name}: {exc}") from None


__all__ = ["TemplateLimitError", "TemplateRenderError", "render_task_template", "render_chat_template",
           "chat_template_of", "chat_prompt", "MAX_STEPS", "MAX_SECONDS", "MAX_CHARS", "MAX_MADE", "MAX_INT_BITS",
           "MAX_TEMPLATE_CHARS"]
