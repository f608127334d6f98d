"""What rendering an untrusted template in the render worker costs (issue
53 item 1), against rendering it in this process, in the same run
(pytest-benchmark):

    python -m pytest bench/bench_templates.py --benchmark-only --benchmark-columns=mean,min,median,rounds

Two groups, one template each, rendered through

* ``rcn_fast`` -- the door (``render_chat_template`` / ``render_task_template``):
  the values made plain JSON, one request and one answer over the worker's
  pipe, the render in the worker (kernel limits, budgets);
* ``in_process`` -- the same bounded environment in this process
  (:func:`rcn_fast._templates.sandbox.render`: allowlist and budgets, no
  worker), what the door cost before the worker.

The difference is the worker's overhead per render (two pipe writes, two
wake-ups, JSON both ways): tens of microseconds on an idle core, more when
the machine is loaded (the worker waits for a core). The worker is started
once, before the timings.
"""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2")

from rcn_fast._templates import render_chat_template, render_task_template, sandbox  # noqa: E402

CHATML = ("{%- for message in messages %}{%- if loop.first and message['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT = [{"role": "system", "content": "Answer with the letter of the best choice."},
        {"role": "user", "content": "Where do you put plates after washing them?\nA. cupboard\nB. oven\nC. garden\n"
                                    "D. car\nE. bed"}]
DOC_TO_TEXT = "Question: {{question.strip()}}\n{% for c in choices %}{{ 'ABCDE'[loop.index0] }}. {{ c }}\n{% endfor %}Answer:"
DOC = {"question": " Where do you put plates after washing them? ", "choices": ["cupboard", "oven", "garden", "car"]}
CHAT_GROUP = "chat template render (ChatML, 2 turns)"
TASK_GROUP = "task template render (doc_to_text, 4 choices)"


@pytest.fixture(scope="module", autouse=True)
def started_worker():
    render_task_template(DOC_TO_TEXT, DOC)  # the worker starts once, outside the timings


def test_chat_in_worker(benchmark, record):
    benchmark.group = CHAT_GROUP
    out = benchmark(render_chat_template, CHATML, CHAT, add_generation_prompt=True)
    assert out.endswith("<|im_start|>assistant\n")
    record(CHAT_GROUP, "rcn_fast", benchmark)


def test_chat_in_process(benchmark, record):
    variables = {"messages": CHAT, "tools": None, "documents": None, "add_generation_prompt": True}
    benchmark.group = CHAT_GROUP
    out = benchmark(sandbox.render, "chat", CHATML, variables)
    assert out == render_chat_template(CHATML, CHAT, add_generation_prompt=True)
    record(CHAT_GROUP, "in_process", benchmark)


def test_task_in_worker(benchmark, record):
    benchmark.group = TASK_GROUP
    out = benchmark(render_task_template, DOC_TO_TEXT, DOC)
    assert out.endswith("Answer:")
    record(TASK_GROUP, "rcn_fast", benchmark)


def test_task_in_process(benchmark, record):
    benchmark.group = TASK_GROUP
    out = benchmark(sandbox.render, "task", DOC_TO_TEXT, DOC)
    assert out == render_task_template(DOC_TO_TEXT, DOC)
    record(TASK_GROUP, "in_process", benchmark)
