"""Issue 53's template repros (N1, N8, N6), and a runner that tries them
through one entry point in this process: run by
tests/test_trust_templates_repros.py as a child under ``RLIMIT_AS`` and a
time limit (so a regression fails there instead of taking the machine).

``python tests/template_probes.py ENTRY FOLDER``, ENTRY one of

* ``gguf``: a tiny GGUF whose ``tokenizer.chat_template`` is the probe,
  ``load_llm`` + ``generate``;
* ``folder``: the eval CLI on a model folder whose ``chat_template.jinja``
  is the probe;
* ``lmeval``: the eval CLI on an lm-eval task YAML whose ``doc_to_text`` is
  the probe (and rcn_fast task YAMLs whose ``question_template`` is an N6 probe);

prints the process's peak memory before the probes, then one JSON line per
probe: its name, the process's return code or the exception's type, the
first error message, the peak memory so far and the seconds it took.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path

#: 524,288 characters made within the allowlist (19 doublings by ``~``)
BIG = "{% set ns = namespace(s='x') %}{% for i in range(19) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% set big = ns.s %}"
#: 30,000 distinct non-ASCII characters (punycode's encoder is quadratic in them)
DISTINCT = "".join(chr(0x100 + i) for i in range(30000))

PROBES = {
    # N1: one step that ran unbounded (the deadline was checked between steps)
    "n1_punycode": "{% set s = '" + DISTINCT + "' %}{{ s.encode('punycode')|length }}",
    "n1_wordwrap": "{{ ('a' * 660000)|wordwrap(1, wrapstring='') }}",
    "n1_wordwrap_big": BIG + "{{ big|wordwrap(1, wrapstring='') }}",
    # N8: values built in one step from things the size count skipped
    "n8_method_join_generator": BIG + "{{ big.join(range(4000)|map('string')) }}",
    "n8_filter_join_generator": BIG + "{{ range(4000)|map('string')|join(big) }}",
    "n8_join_dict_keys": BIG + "{{ big.join({'a': 1, 'b': 2, 'c': 3, 'd': 4}) }}",
    "n8_list_literals_concat": BIG + "{{ [" + ", ".join(["big"] * 1000) + "] ~ [" + ", ".join(["big"] * 1000) + "] }}",
    "n8_string_of_list": BIG + "{{ [" + ", ".join(["big"] * 2000) + "]|string }}",
    "n8_namespace_repeat": "{{ ([namespace(a='x'*999999)] * 4000)|string }}",
    "n8_namespace_list": BIG + "{% set n = namespace(a=big) %}{{ [" + ", ".join(["n"] * 2000) + "]|string }}",
    # N6: format strings that size a result or reach Python internals
    "n6_format_width": "{{ '{q:>1500000000}'.format(q='x') }}",
    "n6_format_mro": "{{ '{q.__class__.__mro__[1].__subclasses__}'.format(q='x') }}",
}
#: N6 as a ``question_template`` of an rcn_fast task file
QUESTION_TEMPLATES = {"n6_question_width": "{q:>1500000000}", "n6_question_mro": "{q.__class__.__mro__[1].__subclasses__}"}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where do plates go?"}]


def _questions(path: Path) -> Path:
    rows = [{"id": f"q{i}", "question": {"stem": f"Which is option {i}?",
                                        "choices": [{"label": c, "text": f"option {c}"} for c in "ABCD"]},
             "answerKey": "A"} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(args: list[str]) -> tuple[int, str]:
    from rcn_fast.eval.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(args)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, err.getvalue()


def _maxrss_kb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _first_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if "Template" in ln or "error" in ln.lower()]
    return (lines[0] if lines else text[-300:])[:400]


def run(entry: str, folder: Path) -> None:
    common = ["--pipelines", "vanilla", "--no-progress", "--no-plot", "--device", "cpu"]
    if entry == "gguf":
        sys.path.insert(0, str(Path(__file__).resolve().parent / "llm"))
        from llm_helpers import build_model, build_tokenizer, write_gguf

        from rcn_fast.llm import load_llm
    elif entry == "folder":
        from rcn_fast.testing.tiny_llm import make_tiny_llama

        model = make_tiny_llama(folder / "model")
    questions = _questions(folder / "q.jsonl")
    print(json.dumps({"baseline_maxrss_kb": _maxrss_kb()}), flush=True)
    for name, template in PROBES.items():
        t0 = time.monotonic()
        rc, kind, message = None, None, ""
        if entry == "gguf":
            tok = build_tokenizer(template)
            path = folder / f"{name}.gguf"
            write_gguf(build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id), tok, path)
            try:
                load_llm(str(path), device="cpu").generate([CHAT], max_new_tokens=2)
                kind = "none"
            except Exception as exc:  # noqa: BLE001 -- the probe reports what it met
                kind, message = type(exc).__name__, str(exc)[:400]
        elif entry == "folder":
            (model / "chat_template.jinja").write_text(template)
            rc, err = _cli(["--tasks", str(questions), "--model", str(model), "--output-path",
                            str(folder / f"out-{name}"), *common])
            message = _first_error(err)
        else:
            inc = folder / f"lm-{name}"
            inc.mkdir()
            (inc / "d.jsonl").write_text("".join(json.dumps({"question": f"Q{i}?", "choices": ["a", "b"], "label": 0})
                                                 + "\n" for i in range(2)))
            (inc / "t.yaml").write_text(f"task: probe_{name}\ndataset_path: d.jsonl\noutput_type: multiple_choice\n"
                                        f"test_split: test\ndoc_to_text: {json.dumps(template)}\n"
                                        "doc_to_choice: choices\ndoc_to_target: label\n")
            rc, err = _cli(["--include_path", str(inc), "--tasks", f"probe_{name}", "--model",
                            str(folder / "no-model"), "--output-path", str(folder / f"out-{name}"), *common])
            message = _first_error(err)
        print(json.dumps({"name": name, "rc": rc, "kind": kind, "message": message, "maxrss_kb": _maxrss_kb(),
                          "seconds": round(time.monotonic() - t0, 2)}), flush=True)
    if entry == "lmeval":
        for name, template in QUESTION_TEMPLATES.items():
            t0 = time.monotonic()
            inc = folder / f"rc-{name}"
            inc.mkdir()
            _questions(inc / "q.jsonl")
            (inc / "t.yaml").write_text(f"name: probe_{name}\nlocal: q.jsonl\nquestion_template: {json.dumps(template)}\n"
                                        "fields: {id: id, question: question.stem, choices: question.choices.text, "
                                        "labels: question.choices.label, answer: answerKey}\n")
            rc, err = _cli(["--include_path", str(inc), "--tasks", f"probe_{name}", "--model",
                            str(folder / "no-model"), "--output-path", str(folder / f"out-{name}"), *common])
            print(json.dumps({"name": name, "rc": rc, "kind": None, "message": _first_error(err),
                              "maxrss_kb": _maxrss_kb(), "seconds": round(time.monotonic() - t0, 2)}), flush=True)


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]))
