"""Prompt templates of the pipelines and the parsing of model outputs.

The default templates live in ``default.yaml`` next to this module (package
data, installed with the wheel) and are worded by rcn_fast. A user file may
override any subset of them: :func:`load_prompts` reads the defaults, then
merges the user's YAML (or JSON) file over them, key by key.

* :func:`load_prompts` -- a :class:`PromptSet` (defaults, or a user file over them).
* :class:`PromptSet` -- renders the chat of a stage (``chat(stage, question, ...)``).
* :func:`parse_bullets` -- explanation lists out of a generation.
* :func:`parse_labelled` -- one explanation per option label (silver KB).

Few-shot examples: a stage with ``example_user`` / ``example_assistant``
templates renders each example as a user turn and an assistant turn before
the question. ZEBRA's examples come from its knowledge base at run time;
the RR stages (``rr_reasoning``, ``rr_reasoning_yes_no``) also store their
default examples in the file, under the stage's ``examples`` key (a list of
``{question, choices, labels, reasoning}`` mappings; :meth:`PromptSet.examples`).
A user file that gives ``examples`` replaces the whole list (``[]`` = none).
"""

from __future__ import annotations

import copy
import json
import os
import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from rcn_fast._validate import is_int

FORMAT_VERSION = 1
DEFAULT_FILE = "default.yaml"

# stage -> the placeholders its templates may use (besides the common ones)
_COMMON = {"question", "choices", "num_choices", "label_list"}
STAGE_FIELDS: dict[str, set[str]] = {
    "query_expansion": set(),
    "knowledge_extraction": {"documents"},
    "knowledge_aggregation": {"explanations"},
    "answer": set(),
    "answer_with_knowledge": {"knowledge"},
    "reconnect_answer": {"knowledge"},  # ReConnect's answering prompt (paper Table 18)
    # ReConnect on open questions (no options; the answer is generated)
    "open_query_expansion": set(),
    "open_knowledge_extraction": {"documents"},
    "open_knowledge_aggregation": {"explanations"},
    "open_answer_with_knowledge": {"knowledge"},
    "example_generation": set(),  # its example_* templates may use {knowledge}
    "silver_explanations": {"answer_label", "answer_format"},
    "rr_reasoning": set(),  # RR / self-consistency: sampled chain of thought
    "rr_reasoning_yes_no": set(),  # the same for yes/no questions
    # ActiveRAG and its RAG baselines (multiple choice and open domain)
    "rag_cot": set(),
    "rag_cot_passages": {"passages"},
    "activerag_associate": {"passages"},
    "activerag_anchoring": {"passages"},
    "activerag_logician": {"passages"},
    "activerag_cognition": {"passages"},
    "activerag_nexus_associate": {"reasoning", "knowledge"},
    "activerag_nexus_anchoring": {"reasoning", "knowledge"},
    "activerag_nexus_logician": {"reasoning", "knowledge"},
    "activerag_nexus_cognition": {"reasoning", "knowledge"},
    "activerag_note": {"passages"},
    "activerag_nexus_note": {"reasoning", "knowledge"},
    "activerag_nexus_passage": {"reasoning", "knowledge"},
    "rag_chain_of_note": {"passages"},
    "rag_summarize": {"passages"},
    "rag_rerank": {"passages"},
    "rag_guideline": set(),
    "rag_guideline_merge": {"analysis", "reasoning"},
    "rag_answer": {"passages"},
    "rag_answer_reasoning": {"reasoning"},
    "rag_answer_open": {"passages"},
}
_STAGE_KEYS = {"system", "user", "prefill", "acknowledge", "example_user", "example_assistant", "examples"}
# placeholders of example_user / example_assistant (an example's own fields)
_EXAMPLE_FIELDS = _COMMON | {"knowledge", "reasoning"}
_EXAMPLE_KEYS = {"question", "choices", "labels", "reasoning", "knowledge"}
_TOP_KEYS = {"format_version", "choice_line", "list_item", "acknowledge", *STAGE_FIELDS}


class PromptError(ValueError):
    """A prompt file or template is malformed (the message names the key)."""


def _fields_of(template: str, where: str) -> set[str]:
    try:
        return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise PromptError(f"{where}: not a valid template ({exc}); write literal braces as {{{{ and }}}}") from None


def label_list(labels: Sequence[str]) -> str:
    """``["A", "B", "C"]`` -> ``"A, B and C"``."""
    labels = list(labels)
    if len(labels) <= 1:
        return "".join(labels)
    return ", ".join(labels[:-1]) + " and " + labels[-1]


@dataclass
class PromptSet:
    """A validated set of templates.

    Attributes
    ----------
    data : dict
        The merged YAML content (``format_version``, ``choice_line``,
        ``list_item``, ``acknowledge`` and one mapping per stage).
    source : str
        Where the templates came from (``"default"`` or a file path).
    """

    data: dict[str, Any]
    source: str = "default"

    def __post_init__(self) -> None:
        validate(self.data, self.source)

    # ------------------------------------------------------------ formatting
    def format_choices(self, choices: Sequence[str], labels: Sequence[str]) -> str:
        line = self.data["choice_line"]
        return "\n".join(line.format(label=lab, text=txt) for lab, txt in zip(labels, choices))

    def format_list(self, items: Sequence[str]) -> str:
        """Items as a list (``list_item`` per line); ``"(none)"`` when empty."""
        items = [" ".join(str(t).split()) for t in items]
        if not items:
            return "(none)"
        return "\n".join(self.data["list_item"].format(text=t) for t in items)

    def fields(self, question: Any, **extra: Any) -> dict[str, Any]:
        """The placeholder values of ``question`` (an MCQuestion-like object)."""
        labels = list(question.labels)
        out = {
            "question": question.question,
            "choices": self.format_choices(question.choices, labels),
            "num_choices": len(labels),
            "label_list": label_list(labels),
        }
        out.update(extra)
        return out

    def stage(self, name: str) -> dict[str, Any]:
        if name not in STAGE_FIELDS:
            raise KeyError(f"stage: expected one of {sorted(STAGE_FIELDS)}, got {name!r}")
        return self.data[name]

    def examples(self, stage: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The few-shot examples stored with a stage (its ``examples`` key).

        Parameters
        ----------
        stage : str
        limit : int, optional
            Keep the first ``limit`` (0 = none); None = all.

        Returns
        -------
        list of dict, each with ``question``, ``choices``, ``labels``
        (default ``A``, ``B``, ... one per choice) and ``reasoning`` /
        ``knowledge`` as given; ready for :meth:`chat`'s ``examples=``.

        Raises
        ------
        ValueError
            ``limit`` is larger than the number of stored examples.
        """
        stored = self.stage(stage).get("examples") or []
        if limit is not None:
            if not is_int(limit) or limit < 0:
                raise ValueError(f"limit: expected an int >= 0 or None, got {limit!r}")
            if limit > len(stored):
                raise ValueError(f"limit: {limit} examples asked for stage {stage!r}, but the prompt set "
                                 f"({self.source}) has {len(stored)}")
            stored = stored[:limit]
        out = []
        for ex in stored:
            ex = copy.deepcopy(dict(ex))
            ex.setdefault("choices", [])
            ex.setdefault("labels", [chr(ord("A") + i) for i in range(len(ex["choices"]))])
            out.append(ex)
        return out

    def chat(self, stage: str, question: Any, *, examples: Sequence[Mapping[str, Any]] = (),
             **extra: Any) -> list[dict[str, str]]:
        """The chat of one stage for one question.

        Parameters
        ----------
        stage : str
            A key of :data:`STAGE_FIELDS`.
        question : MCQuestion-like
            Needs ``question``, ``choices`` and ``labels``.
        examples : sequence of dict, optional
            Few-shot turns, for stages with ``example_user`` /
            ``example_assistant`` templates: each a dict with ``question``,
            ``choices``, ``labels`` and ``knowledge`` (list of str, ZEBRA)
            or ``reasoning`` (str, RR; see :meth:`examples`).
        **extra
            Stage placeholders, already formatted (``documents``,
            ``explanations``, ``knowledge``, ``answer_label``, ``answer_format``).

        Returns
        -------
        list of {"role", "content"} turns; the last one is the pre-filled
        assistant turn unless the stage's pre-fill is empty.
        """
        t = self.stage(stage)
        missing = STAGE_FIELDS[stage] - set(extra)
        if missing:
            raise ValueError(f"extra: stage {stage!r} needs the placeholder(s) {sorted(missing)}")
        vals = self.fields(question, **extra)
        turns = [{"role": "system", "content": t["system"].format(**vals)}]
        if t.get("acknowledge", True):
            turns.append({"role": "assistant", "content": self.data["acknowledge"]})
        for ex in examples:
            if "example_user" not in t:
                raise ValueError(f"examples: stage {stage!r} has no example_user/example_assistant templates")
            labels = ex.get("labels", [chr(ord("A") + i) for i in range(len(ex.get("choices", [])))])
            ev = {
                "question": ex["question"],
                "choices": self.format_choices(ex.get("choices", []), labels),
                "num_choices": len(labels),
                "label_list": label_list(labels),
                "knowledge": self.format_list(ex.get("knowledge", [])),
                "reasoning": str(ex.get("reasoning", "")).strip(),
            }
            turns.append({"role": "user", "content": t["example_user"].format(**ev)})
            turns.append({"role": "assistant", "content": t["example_assistant"].format(**ev)})
        turns.append({"role": "user", "content": t["user"].format(**vals)})
        prefill = t.get("prefill", "")
        if prefill:
            turns.append({"role": "assistant", "content": prefill})
        return turns

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)


def validate(data: Mapping[str, Any], source: str = "prompts") -> None:
    """Raise :class:`PromptError` naming the first bad key of ``data``."""
    if not isinstance(data, Mapping):
        raise PromptError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise PromptError(f"{source}: unknown key(s) {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    if data.get("format_version") != FORMAT_VERSION:
        raise PromptError(f"{source}: format_version: expected {FORMAT_VERSION}, got {data.get('format_version')!r}")
    for key, allowed in (("choice_line", {"label", "text"}), ("list_item", {"text"}), ("acknowledge", set())):
        v = data.get(key)
        if not isinstance(v, str):
            raise PromptError(f"{source}: {key}: expected a string, got {type(v).__name__}")
        bad = _fields_of(v, f"{source}: {key}") - allowed
        if bad:
            raise PromptError(f"{source}: {key}: unknown placeholder(s) {sorted(bad)}; allowed: {sorted(allowed)}")
    for stage, extra in STAGE_FIELDS.items():
        t = data.get(stage)
        if not isinstance(t, Mapping):
            raise PromptError(f"{source}: {stage}: expected a mapping of templates, got {type(t).__name__}")
        unknown = set(t) - _STAGE_KEYS
        if unknown:
            raise PromptError(f"{source}: {stage}: unknown key(s) {sorted(unknown)}; known: {sorted(_STAGE_KEYS)}")
        for key in ("system", "user"):
            if not isinstance(t.get(key), str):
                raise PromptError(f"{source}: {stage}.{key}: expected a string")
        if not isinstance(t.get("prefill", ""), str):
            raise PromptError(f"{source}: {stage}.prefill: expected a string")
        if not isinstance(t.get("acknowledge", True), bool):
            raise PromptError(f"{source}: {stage}.acknowledge: expected true or false")
        allowed = _COMMON | extra
        for key in ("system", "user", "prefill"):
            bad = _fields_of(t.get(key, ""), f"{source}: {stage}.{key}") - allowed
            if bad:
                raise PromptError(
                    f"{source}: {stage}.{key}: unknown placeholder(s) {sorted(bad)}; allowed: {sorted(allowed)}"
                )
        if ("example_user" in t) != ("example_assistant" in t):
            raise PromptError(f"{source}: {stage}: example_user and example_assistant go together")
        for key in ("example_user", "example_assistant"):
            if key in t:
                if not isinstance(t[key], str):
                    raise PromptError(f"{source}: {stage}.{key}: expected a string")
                bad = _fields_of(t[key], f"{source}: {stage}.{key}") - _EXAMPLE_FIELDS
                if bad:
                    raise PromptError(f"{source}: {stage}.{key}: unknown placeholder(s) {sorted(bad)}; "
                                      f"allowed: {sorted(_EXAMPLE_FIELDS)}")
        if "examples" in t:
            _validate_examples(t["examples"], f"{source}: {stage}.examples")
            if t["examples"] and "example_user" not in t:
                raise PromptError(f"{source}: {stage}.examples: needs example_user and example_assistant templates")
    if not isinstance(data["example_generation"].get("example_user"), str):
        raise PromptError(f"{source}: example_generation: needs example_user and example_assistant")


def _validate_examples(examples: Any, where: str) -> None:
    if examples is None:
        return
    if not isinstance(examples, list):
        raise PromptError(f"{where}: expected a list of examples, got {type(examples).__name__}")
    for i, ex in enumerate(examples):
        w = f"{where}[{i}]"
        if not isinstance(ex, Mapping):
            raise PromptError(f"{w}: expected a mapping, got {type(ex).__name__}")
        unknown = set(ex) - _EXAMPLE_KEYS
        if unknown:
            raise PromptError(f"{w}: unknown key(s) {sorted(unknown)}; known: {sorted(_EXAMPLE_KEYS)}")
        if not isinstance(ex.get("question"), str) or not ex["question"].strip():
            raise PromptError(f"{w}.question: expected a non-empty string")
        if "reasoning" in ex and not isinstance(ex["reasoning"], str):
            raise PromptError(f"{w}.reasoning: expected a string")
        for key in ("choices", "labels", "knowledge"):
            if key in ex and (isinstance(ex[key], str) or not isinstance(ex[key], list)
                              or not all(isinstance(x, str) for x in ex[key])):
                raise PromptError(f"{w}.{key}: expected a list of strings")
        if "labels" in ex and len(ex["labels"]) != len(ex.get("choices", [])):
            raise PromptError(f"{w}.labels: expected one label per choice ({len(ex.get('choices', []))}), "
                              f"got {len(ex['labels'])}")


def default_data() -> dict[str, Any]:
    """The packaged default templates (read with importlib.resources)."""
    text = resources.files(__name__).joinpath(DEFAULT_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_prompts(source: str | os.PathLike[str] | Mapping[str, Any] | PromptSet | None = None) -> PromptSet:
    """Load a prompt set.

    Parameters
    ----------
    source : None, path, mapping or PromptSet
        None: the packaged defaults. A ``.yaml``/``.yml``/``.json`` file or
        a mapping: merged over the defaults (a stage given in part keeps
        the default of the keys it leaves out); ``format_version`` may be
        omitted. A PromptSet is returned as is.

    Returns
    -------
    PromptSet

    Raises
    ------
    FileNotFoundError
        The file does not exist.
    PromptError
        Unknown keys or placeholders, wrong types (the message names the key).
    """
    if isinstance(source, PromptSet):
        return source
    base = default_data()
    if source is None:
        return PromptSet(base, "default")
    if isinstance(source, Mapping):
        over, where = dict(source), "prompts"
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"source: prompt file {path} does not exist")
        text = path.read_text(encoding="utf-8")
        try:
            over = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            raise PromptError(f"{path}: not valid YAML/JSON ({exc})") from None
        over, where = over or {}, str(path)
        if not isinstance(over, Mapping):
            raise PromptError(f"{path}: expected a mapping at the top level, got {type(over).__name__}")
    else:
        raise TypeError(f"source: expected None, a path, a mapping or a PromptSet, got {type(source).__name__}")
    over.setdefault("format_version", FORMAT_VERSION)
    return PromptSet(_merge(base, over), where)


# ----------------------------------------------------------------- parsing
_BULLET = re.compile(r"^\s*(?:[*\-\u2022+]+(?=\s|$)|\(?\d{1,3}[.):](?=\s|$)|\(\d{1,3}\))\s*")
_PARA = re.compile(r"\n[ \t]*\n")


def parse_bullets(text: str, max_items: int | None = None) -> list[str]:
    """Explanations out of a generation.

    Keeps the first paragraph (up to the first blank line, after leading
    blank lines), splits it into lines, strips list markers (``*``, ``-``,
    ``•``, ``+``, ``1.``, ``2)``, ``(3)``) and surrounding spaces, and drops
    empty lines.

    Parameters
    ----------
    text : str
        The generated continuation (without the pre-fill).
    max_items : int, optional
        Keep at most this many lines.

    Returns
    -------
    list of str
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    body = text.replace("\r\n", "\n").lstrip("\n \t")
    para = _PARA.split(body, maxsplit=1)[0]
    out = []
    for line in para.split("\n"):
        line = _BULLET.sub("", _BULLET.sub("", line, count=1), count=1).strip()
        if line:
            out.append(line)
    if max_items is not None:
        if max_items < 0:
            raise ValueError(f"max_items: expected >= 0, got {max_items}")
        out = out[:max_items]
    return out


def parse_labelled(text: str, labels: Sequence[str]) -> list[str | None]:
    """One explanation per option label out of ``"A. ...\\nB. ..."`` text.

    A line starting with a label followed by ``.``, ``)`` or ``:`` opens
    that label's explanation; following lines without a label continue it.
    A label seen a second time ends collection for it (the model started
    over). Labels never mentioned get None.
    """
    labels = list(labels)
    got: dict[str, list[str]] = {}
    current: str | None = None
    pat = re.compile(r"^\s*(?:[*\-\u2022]\s*)?\(?(" + "|".join(re.escape(x) for x in labels) + r")\s*[.):]\s*(.*)$")
    for line in text.replace("\r\n", "\n").split("\n"):
        m = pat.match(line)
        if m and m.group(1) not in got:
            current = m.group(1)
            got[current] = [m.group(2).strip()]
        elif m:  # a label seen before: the model started over; stop collecting
            current = None
        elif current is not None and line.strip():
            got[current].append(line.strip())
    return [" ".join(x for x in got[lab] if x) or None if lab in got else None for lab in labels]


__all__ = [
    "PromptSet", "PromptError", "load_prompts", "default_data", "validate", "parse_bullets",
    "parse_labelled", "label_list", "STAGE_FIELDS", "FORMAT_VERSION",
]
