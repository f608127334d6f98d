"""Issue 53 item 5: the technique, not the instance. Hypothesis builds
templates from a grammar of what amplifies -- calls, joins (method and
filter, over lists, generators, dict keys), literals (big ones too),
filters (allowed and refused ones), macros, loops that double a value,
string methods, ``~`` concatenation, ``|string`` of lists, namespace
objects, repetition -- and every render must end within its limits or be
refused with ``TemplateLimitError`` / ``TemplateRenderError``: never
hang, never take this process down, never grow this process's memory, and
the worker never past its address-space cap.

A regression that renders in this process instead of the worker fails the
first test (the worker and its limits must exist) before any template is
generated.
"""

from __future__ import annotations

import resource
import time

import pytest

pytest.importorskip("jinja2")

from hypothesis import HealthCheck, event, given, settings, strategies as st  # noqa: E402

from rcn_fast._templates import TemplateLimitError, TemplateRenderError, pool, render_chat_template  # noqa: E402
from rcn_fast._templates import render_task_template, worker  # noqa: E402
from rcn_fast._templates.limits import MAX_SECONDS  # noqa: E402
from tests.test_trust_templates_worker import expected_cap  # noqa: E402

#: variables every generated template may use (``big``: 200,000 characters, given from outside)
VARS = {"big": "x" * 200_000, "xs": list(range(50)), "word": "ab", "d": {"a": "1", "b": "2"}}
SETUP = "{% set ns = namespace(s='ab', l=[], n=namespace(a=big)) %}"

_names = st.sampled_from(["big", "word", "xs", "d", "ns.s", "ns.l", "ns.n", "'lit'", "loop_i"])
_small = st.integers(min_value=0, max_value=30)
_big_int = st.sampled_from([999, 99_999, 999_999, 10**9, 2**31])
_literal = st.one_of(
    st.text(alphabet="abc xyz\n{}%'", max_size=8).map(lambda s: repr(s)),
    _small.map(str), _big_int.map(str),
    st.integers(min_value=1, max_value=4000).map(lambda n: repr("y" * n)),  # big literals in the source
    st.just("[big, big, big, big]"), st.just("[ns.n, ns.n, ns.n]"), st.just("{'k': big, 'j': word}"),
)
_filters = st.sampled_from([
    "string", "list", "join", "join(big)", "join(', ')", "upper", "trim", "length", "first", "unique|list",
    "replace('x', 'yy')", "replace('', big)", "indent(4)", "indent(big)", "tojson", "tojson(indent=99999)", "e",
    "map('string')|list", "map('upper')|join(big)", "items|list", "dictsort", "default(big)", "int", "safe",
    "select|list", "wordwrap(1)", "center(999999999)", "format(big)", "batch(3)|list", "sum", "sort", "pprint",
])
_methods = st.sampled_from([
    "join(xs|map('string'))", "join(d)", "join([big, big, big])", "split('x')", "replace('x', big)", "strip()",
    "upper()", "startswith('a')", "encode('punycode')", "format(big)", "center(99999999)", "zfill(99999999)",
    "expandtabs(9999999)", "translate({120: big})", "__class__", "index('a')", "count('x')", "splitlines()",
])


def _expr(depth: int) -> st.SearchStrategy[str]:
    base = st.one_of(_names, _literal, st.just("range(99999)"), st.just("namespace(a=big)"),
                     st.just("dict(a=big, b=big)"), st.just("lipsum(99)"))
    if depth == 0:
        return base
    sub = _expr(depth - 1)
    return st.one_of(
        base,
        st.tuples(sub, _filters).map(lambda t: f"({t[0]})|{t[1]}"),
        st.tuples(sub, _methods).map(lambda t: f"({t[0]}).{t[1]}"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]}) ~ ({t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]}) + ({t[1]})"),
        st.tuples(sub, _big_int).map(lambda t: f"({t[0]}) * {t[1]}"),
        st.tuples(sub, sub).map(lambda t: f"'%s%s' % (({t[0]}), ({t[1]}))"),
        st.tuples(sub, sub).map(lambda t: f"[{t[0]}, {t[1]}]"),
        st.tuples(sub, sub).map(lambda t: f"m({t[0]}, {t[1]})"),
    )


_exprs = _expr(2)
_doublings = st.sampled_from([0, 3, 12, 19, 22, 30])
_amplifiers = st.one_of(
    st.tuples(_doublings, _exprs).map(lambda t: "{% for loop_i in range(" + str(t[0]) + ") %}{% set ns.s = ns.s ~ ns.s %}"
                                      "{% set ns.l = ns.l + [" + t[1] + "] %}{% endfor %}{{ ns.s|length }}"),
    st.tuples(_doublings, _filters).map(lambda t: "{% for loop_i in range(" + str(t[0]) + ") %}{% set ns.s = (ns.s ~ "
                                        "big)|" + t[1] + " %}{% endfor %}{{ ns.s|string|length }}"),
    st.tuples(_big_int, _exprs).map(lambda t: "{% for loop_i in range(" + str(t[0]) + ") %}{{ " + t[1]
                                    + " }}{% endfor %}"),
    st.tuples(_doublings, _exprs).map(lambda t: "{% for loop_i in range(" + str(t[0]) + ") %}{% set ns.l = ns.l + "
                                      "[ns.n, " + t[1] + "] %}{% endfor %}{{ ns.l|string|length }}{{ (ns.l ~ ns.l)|length }}"),
    st.tuples(_doublings, _methods).map(lambda t: "{% for loop_i in range(" + str(t[0]) + ") %}{% set ns.s = (ns.s ~ "
                                        "ns.s)." + t[1] + " %}{% endfor %}{{ ns.s|length }}"),
)
_statement = st.one_of(
    _amplifiers, _amplifiers,
    _exprs.map(lambda e: "{{ " + e + " }}"),
    _exprs.map(lambda e: "{% set v = " + e + " %}{{ v|length }}"),
    _exprs.map(lambda e: "{% set ns.s = " + e + " %}"),
    st.just("{{ ns.l|string }}{{ ns.l ~ ns.l }}"),
    st.just("{% include 'x.jinja' %}"), st.just("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}"),
    st.just("{% macro r(n) %}{% if n %}{{ r(n - 1) }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(30) }}"),
)
_templates = st.lists(_statement, min_size=1, max_size=4).map(
    lambda parts: SETUP + "{% macro m(a, b) %}{{ a }}{{ b }}{{ caller is defined }}{% endmacro %}" + "".join(parts))


def _rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_renders_happen_in_a_worker_under_its_limits():
    """The guard of the generated tests below: without the worker they would run here."""
    assert render_task_template("{{ x }}", {"x": 1}) == "1"
    pids = pool.worker_pids()
    assert pids
    with open(f"/proc/{pids[-1]}/limits") as f:
        assert any(line.startswith("Max address space") and str(expected_cap()) in line for line in f)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
          derandomize=True)
@given(template=_templates, chat=st.booleans())
def test_every_generated_template_ends_within_its_limits_or_is_refused(template, chat):
    before = _rss_kb()
    t0 = time.monotonic()
    try:
        if chat:
            out = render_chat_template(template, [{"role": "user", "content": "hi"}], **VARS)
        else:
            out = render_task_template(template, {**VARS, "loop_i": 0})
        assert isinstance(out, str) and len(out) <= 1_000_000
        event("rendered")
    except TemplateLimitError as exc:
        event("limit: " + str(exc).split(":")[0][:40])
    except TemplateRenderError as exc:
        event("refused: " + ("allowlist" if "does not allow" in str(exc) else "other"))
    # the worker is killed at its deadline; the slack is for a loaded machine (a guard against a hang)
    assert time.monotonic() - t0 < MAX_SECONDS + 20
    assert _rss_kb() - before < 200_000, "the render grew this process's memory"
    for pid in pool.worker_pids():
        with open(f"/proc/{pid}/status") as f:
            peak = [int(line.split()[1]) for line in f if line.startswith("VmPeak:")]
        assert peak and peak[0] * 1024 <= worker.MEMORY_BYTES
