"""Reading a sampled reasoning path: its sentences (:func:`split_sentences`),
which are conclusions (:func:`is_conclusion`), its answer
(:func:`parse_answer`, from the path's final answer statement) and the
:class:`ReasoningPath` that holds them (:func:`make_path`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from rcn_fast.data import MCQuestion

PYSBD_HINT = 'pip install "rcn_fast[rr]"  (pysbd)'


# ------------------------------------------------------------------ sentences
_BULLET = re.compile(r"^\s*(?:[*\-\u2022+]+(?=\s|$)|\(?\d{1,3}[.)](?=\s|$)|\(\d{1,3}\))\s*")


@functools.lru_cache(maxsize=1)
def _segmenter() -> Any:
    from rcn_fast._arrays import require

    pysbd = require("pysbd", PYSBD_HINT)
    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str) -> list[str]:
    """Sentences of a generated explanation.

    Lines are split first (list markers ``*``, ``-``, ``1.`` are stripped),
    then each line is segmented with pysbd (English rules: abbreviations,
    decimals, initials). Empty pieces are dropped.

    Parameters
    ----------
    text : str

    Returns
    -------
    list of str, stripped, in order
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    seg = _segmenter()
    out: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = _BULLET.sub("", line).strip()
        if not line:
            continue
        for s in seg.segment(line):
            s = s.strip()
            if s:
                out.append(s)
    return out


def is_conclusion(sentence: str, words: Sequence[str]) -> bool:
    """Whether ``sentence`` opens with one of ``words`` (case-insensitive,
    whole words; leading quotes/brackets/asterisks ignored): "Thus, ...",
    "So the answer is B.", "No, he could not." are conclusions; "Solar
    panels ..." is not."""
    s = sentence.lstrip(" \t\"'*([").lower()
    for w in words:
        if s.startswith(w) and (len(s) == len(w) or not (s[len(w)].isalnum() or s[len(w)] == "_")):
            return True
    return False


# --------------------------------------------------------------------- answers
@dataclass
class ParsedAnswer:
    """What :func:`parse_answer` read.

    Attributes
    ----------
    index : int or None
        The predicted choice, None when nothing readable was found.
    rule : str
        ``"statement-label"``, ``"statement-text"`` (an answer statement,
        "the answer is (B)" / "answer: sunlight"), ``"final-label"``,
        ``"final-text"`` (the final sentence alone: "B.", "(B) sunlight",
        the one choice text it names), or ``"none"``.
    sentence : int or None
        Index (into the sentences) of the sentence the answer came from.
    """

    index: int | None
    rule: str
    sentence: int | None = None


_IS = (r"(?:is|(?:would|should|must|will)(?:\s+(?:most\s+likely|probably|likely|clearly|then|therefore))?\s+be"
       r"|=)")
# words that may sit between "answer" and "is": "the best answer here is B"
_FILLER = (r"(?:\s+(?:here|then|therefore|thus|overall|in\s+this\s+case|for\s+this\s+question"
           r"|to\s+(?:the|this)\s+question))?")
# adverbs after "is": "the answer is clearly B", "would most likely be (C)"
_ADVERB = r"(?:\s+(?:clearly|probably|likely|most\s+likely|definitely|therefore|thus|then))?"
_STATEMENT = re.compile(
    r"\banswer" + _FILLER + r"(?:\s+" + _IS + _ADVERB + r")?\s*[:=\-]?\s*"
    r"|\b(?:correct|right|best)\s+(?:option|choice)" + _FILLER + r"\s+" + _IS + _ADVERB + r"\s*:?\s*", re.I)
_LEAD = re.compile(r"^[\s\"'*`_]*(?:(?:option|choice|label)\s+)?", re.I)
_LABEL_PUNCT = re.compile(r"^\(\s*([A-Za-z])\s*\)|^\[([A-Za-z])\]|^([A-Z])(?:[.):](?=\s|$)|\s*$)")
_LABEL_BARE = re.compile(r"^([A-Z])(?=[\s,;!?*\"'])")


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.lower()).split())


def _label_at(rest: str, labels: Sequence[str], bare: bool) -> int | None:
    rest = _LEAD.sub("", rest, count=1)
    m = _LABEL_PUNCT.match(rest)
    if m:
        lab = next(g for g in m.groups() if g)
        for cand in (lab, lab.upper()):
            if cand in labels:
                return list(labels).index(cand)
    if bare:
        m = _LABEL_BARE.match(rest)
        if m and m.group(1) in labels:
            return list(labels).index(m.group(1))
    return None


def _text_at(rest: str, choices: Sequence[str]) -> int | None:
    """The choice whose text ``rest`` starts with (longest wins)."""
    r = _norm(_LEAD.sub("", rest, count=1))
    r = re.sub(r"^(?:the|a|an|to)\s+", "", r)
    best, best_len = None, 0
    for i, c in enumerate(choices):
        n = re.sub(r"^(?:the|a|an|to)\s+", "", _norm(c))
        if n and (r == n or r.startswith(n + " ")) and len(n) > best_len:
            best, best_len = i, len(n)
    return best


def _texts_in(sentence: str, choices: Sequence[str]) -> list[int]:
    """Choices whose text occurs in ``sentence`` (whole words), without
    those contained in another occurring choice's text."""
    s = f" {_norm(sentence)} "
    hits = [i for i, c in enumerate(choices) if _norm(c) and f" {_norm(c)} " in s]
    return [i for i in hits if not any(j != i and f" {_norm(choices[i])} " in f" {_norm(choices[j])} " for j in hits)]


def _resolve_statement(rest: str, labels: Sequence[str], choices: Sequence[str]) -> tuple[int | None, str]:
    i = _label_at(rest, labels, bare=False)
    if i is not None:
        return i, "statement-label"
    i = _text_at(rest, choices)
    if i is not None:
        return i, "statement-text"
    i = _label_at(rest, labels, bare=True)
    if i is not None:
        return i, "statement-label"
    return None, "none"


def _statement_in(sentence: str, labels: Sequence[str], choices: Sequence[str]) -> tuple[int | None, str]:
    """The last answer statement of ``sentence`` that names a choice."""
    found: tuple[int | None, str] = (None, "none")
    for m in _STATEMENT.finditer(sentence):
        i, rule = _resolve_statement(sentence[m.end():], labels, choices)
        if i is not None:
            found = (i, rule)
    return found


def parse_answer(sentences: Sequence[str], labels: Sequence[str], choices: Sequence[str]) -> ParsedAnswer:
    """Read the predicted choice of a reasoning path: its final answer
    statement wins.

    The sentences are scanned from the end; the first hit (that is, the
    last answer in the path) is the answer:

    1. An answer statement that names a choice: "answer" -- optionally
       followed by "here", "to the question", "in this case", ... -- then
       optionally "is", "would be", ":", "is clearly" ...; or "the
       correct/right/best option/choice is"; then a label -- ``(B)``,
       ``[B]``, ``B.``, ``B)``, ``B:``, ``B`` at the end, ``(b)`` -- or
       the text of a choice ("the answer is sunlight", "the answer is no"
       for yes/no questions), or a bare capital label followed by a space
       ("the answer is B because"). "So the answer is (B).", "The best
       answer here is B.", "Answer: C" all count. Within a sentence the
       last statement that resolves wins ("the answer is not A; the
       answer is B").
    2. In the final sentence only, also a label form at its start
       (``"B."``, ``"(B) sunlight"``, ``"B) ..."``).
    3. Otherwise (no statement anywhere, no label form at the end) the
       one choice text the final sentence contains (whole words; a choice
       text inside a longer one that also occurs does not count; two or
       more -> ambiguous).
    4. Otherwise no answer (``index=None``, rule ``"none"``).

    So a path that changes its mind ("The answer is A. Wait, plants need
    light. So the answer is B.") predicts B, and a path that goes on after
    its answer is read at its last answer statement.

    A lower-case letter counts as a label only in brackets (``"(b)"``), so
    "the answer is a pen" is not read as label A.

    Parameters
    ----------
    sentences : sequence of str
        The path's sentences (:func:`split_sentences`).
    labels, choices : the question's labels and choice texts

    Returns
    -------
    ParsedAnswer
    """
    labels, choices = list(labels), list(choices)
    if not sentences:
        return ParsedAnswer(None, "none")
    last = len(sentences) - 1
    for si in range(last, -1, -1):
        i, rule = _statement_in(sentences[si], labels, choices)
        if i is not None:
            return ParsedAnswer(i, rule, si)
        if si == last:
            i = _label_at(sentences[si], labels, bare=False)
            if i is not None:
                return ParsedAnswer(i, "final-label", si)
    hits = _texts_in(sentences[last], choices)
    if len(hits) == 1:
        return ParsedAnswer(hits[0], "final-text", last)
    return ParsedAnswer(None, "none")


@dataclass
class ReasoningPath:
    """One sampled path.

    Attributes
    ----------
    text : str
        The generation (without the pre-fill).
    sentences : list of str
        Sentences up to and including the answer sentence (the path's last
        answer statement; any text after it states no answer and is
        dropped).
    checked : list of bool
        Per sentence: checked against evidence (not a conclusion and not
        the answer sentence).
    answer : ParsedAnswer
    dropped : int
        Sentences after the answer sentence.
    """

    text: str
    sentences: list[str]
    checked: list[bool]
    answer: ParsedAnswer
    dropped: int = 0
    evidence: list[dict[str, Any] | None] = field(default_factory=list)
    faithfulness: float | None = None

    @property
    def explanation(self) -> str:
        """The sentences before the answer sentence, joined."""
        end = self.answer.sentence if self.answer.sentence is not None else len(self.sentences)
        return " ".join(self.sentences[:end])


def make_path(text: str, question: MCQuestion, conclusion_words: Sequence[str]) -> ReasoningPath:
    """Split, parse and mark the sentences of one generated path.

    The answer comes from the path's final answer statement
    (:func:`parse_answer`); the sentences after it (which state no answer)
    are dropped, those before it are kept and, unless they are
    conclusions, checked against evidence."""
    sents = split_sentences(text)
    ans = parse_answer(sents, question.labels, question.choices)
    dropped = 0
    if ans.sentence is not None:
        dropped = len(sents) - ans.sentence - 1
        sents = sents[: ans.sentence + 1]
    checked = [not is_conclusion(s, conclusion_words) and i != ans.sentence for i, s in enumerate(sents)]
    return ReasoningPath(text=text, sentences=sents, checked=checked, answer=ans, dropped=dropped)


__all__ = ["split_sentences", "is_conclusion", "parse_answer", "ParsedAnswer", "ReasoningPath", "make_path",
           "PYSBD_HINT"]
