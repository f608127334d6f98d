"""Issue 53's template repros, each through the three entry points of an
untrusted template, as regression tests: a GGUF's
``tokenizer.chat_template`` (``load_llm`` + ``generate``), a model
folder's ``chat_template.jinja`` (the eval CLI) and an lm-eval task's
``doc_to_text`` (the eval CLI; an rcn_fast task's ``question_template``
for N6).

* N1: ``s.encode('punycode')`` of 30,000 distinct characters and
  ``wordwrap`` ran one unbounded step (killed at 90 s on fca19ce);
* N8: ``big.join(<generator>)``, ``|join`` on a generator, ``join`` over
  dict keys, list literals joined with ``~``, ``|string`` of a list,
  ``([namespace(a='x'*999999)] * 4000)|string`` reached 3.85-4.42 GB;
* N6: ``question_template: '{q:>1500000000}'`` ran at 1.63 GB,
  ``'{q.__class__.__mro__[1].__subclasses__}'`` reached Python internals.

Each entry point's probes run in one child process (tests/template_probes.py)
under a 3 GiB address-space limit and a time limit, so a regression fails
here instead of eating the machine; every probe must be refused with a
``TemplateLimitError`` or ``TemplateRenderError`` naming what it did, at
once, and without the child's peak memory growing by 400 MB (the N8 lists
hold 2,000 references to a 524,288-character string: 1 GB once written out).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest

pytest.importorskip("jinja2")
pytest.importorskip("transformers")

from tests.conftest import REPO  # noqa: E402
from tests.template_probes import PROBES, QUESTION_TEMPLATES  # noqa: E402

MEMORY = 3 << 30
#: what each probe's refusal must say (the allowlist's or the size checks')
WHY = {
    "n1_punycode": "the method 'encode'", "n1_wordwrap": "the filter 'wordwrap'|the operator '\\*'",
    "n1_wordwrap_big": "the filter 'wordwrap'", "n8_method_join_generator": "join: the result could be longer",
    "n8_filter_join_generator": "join: the result could be longer", "n8_join_dict_keys": "join: the result could be",
    "n8_list_literals_concat": "'~': the result would hold more", "n8_string_of_list": "string: the result could be",
    "n8_namespace_repeat": "the operator '\\*'", "n8_namespace_list": "string: the result could be longer",
    "n6_format_width": "the method 'format'", "n6_format_mro": "the method 'format'",
    "n6_question_width": "'{q:>1500000000}' is not a plain field",
    "n6_question_mro": "is not a plain field",
}


def _run(entry: str, folder, timeout: float = 300.0) -> dict[str, dict]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        run = subprocess.run([sys.executable, str(REPO / "tests" / "template_probes.py"), entry, str(folder)],
                             capture_output=True, text=True, timeout=timeout, preexec_fn=limit, env=env, cwd=folder)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the {entry} probes did not end within {timeout} s (a probe ran unbounded); they printed:\n"
                    f"{(exc.stdout or b'')[-3000:]!r}")
    found = {}
    for line in run.stdout.splitlines():
        if line.startswith('{"name"'):
            row = json.loads(line)
            found[row["name"]] = row
        elif line.startswith('{"baseline_maxrss_kb"'):
            found["baseline"] = json.loads(line)
    assert run.returncode == 0, f"the {entry} probes' process failed ({run.returncode}):\n{run.stderr[-3000:]}"
    return found


@pytest.mark.parametrize("entry", ["gguf", "folder", "lmeval"])
def test_each_repro_is_refused_at_once_through_each_entry_point(tmp_path, entry):
    import re

    t0 = time.monotonic()
    found = _run(entry, tmp_path)
    baseline = found.pop("baseline")["baseline_maxrss_kb"]
    names = list(PROBES) + (list(QUESTION_TEMPLATES) if entry == "lmeval" else [])
    assert sorted(found) == sorted(names)
    for name in names:
        row = found[name]
        if entry == "gguf":
            assert row["kind"] in ("TemplateLimitError", "TemplateRenderError"), row
            assert f"the chat template of {tmp_path / name}.gguf" in row["message"], row
        else:  # the eval: refused (exit 2 for a task file, 3 when every question failed), no traceback
            assert row["rc"] in (2, 3) and "Traceback" not in row["message"], row
            assert re.search("Template(Limit|Render)Error|template error|task file", row["message"]), row
        assert re.search(WHY[name], row["message"]), (name, row["message"])
        assert row["seconds"] < 60, row  # a guard against a hang, not a timing
        # refused before the value is built, and rendered in the worker: this process's peak barely moves
        assert row["maxrss_kb"] - baseline < 400_000, (name, row["maxrss_kb"], baseline)
    assert time.monotonic() - t0 < 300
