"""RR (rethinking with retrieval) and self-consistency.

Both sample N chain-of-thought reasoning paths per question (one
generation call for the whole batch, ``num_samples=N``), few-shot: the
prompt shows ``num_examples`` worked examples (user/assistant turns of the
``rr_reasoning`` / ``rr_reasoning_yes_no`` stage; 0 = zero-shot). A path
is its explanation (the sentences before its answer sentence) and its
predicted choice, read by :func:`parse_answer` from the path's final
answer statement.

* Self-consistency: majority vote of the paths' answers.
* RR: every non-conclusion sentence of every path is checked against
  evidence: BM25 top ``bm25_candidates`` paragraphs of the knowledge corpus,
  reranked by the cosine of a sentence-similarity model of their own
  (``similarity_model``, the paper's MPNet by default; not the retriever's
  encoder), top paragraph kept (one BM25 call and one similarity-model
  call per side for all sentences of the batch); an NLI model (one call for
  all sentences) gives entailment E and contradiction C with that paragraph
  as premise and the sentence as hypothesis; M is that cosine. A path's
  faithfulness is the sum of a per-sentence function of (M, E, C)
  (:func:`faithfulness_terms`, RR App. A.2); the answer with the largest
  summed faithfulness over the paths predicting it wins (RR eq. 1).

Ties: equal summed faithfulness (within 1e-9) -> more paths; still equal ->
the lower choice index (self-consistency: more paths, then the lower choice
index). No path with a readable answer -> the config's ``fallback``.

``Prediction.choice_logprobs``: self-consistency ``log(votes_c / answered)``;
RR ``log_softmax`` of the summed faithfulness over the choices some path
predicts. Choices no path predicts get ``-inf``. With the ``"score"``
fallback the values are the scoring pass's log-probabilities. Tied choices
have equal ``choice_logprobs``; ``pred`` then follows the tie rules above
(so on a tie it need not be the first argmax). The RR vote's trace also
holds ``majority_pred``: self-consistency on the same paths.

Sampling is seeded (``config.seed``). With the local Hugging Face backend a
sampled path depends only on (seed, prompt, sample index), not on the
other questions of the batch, so a question gets the same paths -- and the
same prediction -- alone or inside any batch. A backend without that
guarantee (a remote server's sampler) gives batch-dependent paths unless
its generations are cached.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast._validate import is_number
from rcn_fast.data import MCQuestion
from rcn_fast.data.yes_no import is_yes_no
from rcn_fast.pipelines.base import Prediction, QuestionCost, QuestionState, StagedPipeline, StageRunner
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.retrieval.bm25 import METHODS as BM25_METHODS
from rcn_fast.retrieval.types import Passage

PYSBD_HINT = 'pip install "rcn_fast[rr]"  (pysbd)'
TIE_TOLERANCE = 1e-9

PAPER_SIMILARITY_MODEL = "sentence-transformers/all-mpnet-base-v2"
SIMILARITY_KEYS = ("model", "fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "dim")


#: Sentence openings that mark a conclusion (RR skips them: not checked against evidence).
CONCLUSION_WORDS = ["thus", "therefore", "so", "yes", "no", "hence", "consequently", "in conclusion", "the answer",
                    "answer"]
FAITHFULNESS_FUNCTIONS = (1, 2, 3)


@dataclass
class SelfConsistencyConfig(PipelineConfig):
    """Self-consistency: ``num_paths`` sampled chains of thought per
    question, majority vote of their answers (no retrieval).

    Attributes
    ----------
    num_paths : int
        N, reasoning paths sampled per question (RR paper: 10), all in one
        generation call with ``num_samples=N``.
    temperature : float
        Sampling temperature (0.7); must be > 0 when ``num_paths > 1``.
    yes_no_prompt : bool
        Use the ``rr_reasoning_yes_no`` prompt for yes/no questions (choices
        "yes"/"no"); otherwise every question uses ``rr_reasoning``.
    fallback : {"score", "first"}
        When no path of a question yields a readable answer: ``"score"``
        runs one label-scoring pass with the ``answer`` prompt (vanilla)
        for those questions only; ``"first"`` predicts the first choice
        with uniform ``choice_logprobs``.
    conclusion_words : list of str
        Sentence openings (case-insensitive, whole words) that mark
        conclusion sentences; they are not checked against evidence.
    num_examples : int or None
        Few-shot chain-of-thought examples shown before the question (RR
        samples its paths few-shot): the first ``num_examples`` of the
        prompt stage's ``examples`` list (``rr_reasoning`` /
        ``rr_reasoning_yes_no``; the defaults have 4 each, in rcn_fast's
        own words; a prompt file may replace them). 0 = zero-shot; None =
        all of them. More than the stage holds is an error.
    """

    name: ClassVar[str] = "self_consistency"
    temperature: float = 0.7
    num_paths: int = 10
    yes_no_prompt: bool = True
    fallback: str = "score"
    conclusion_words: list = field(default_factory=lambda: list(CONCLUSION_WORDS))
    num_examples: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.num_paths, "num_paths")
        _int(self.num_examples, "num_examples", 0, allow_none=True)
        if self.num_paths > 1 and self.temperature == 0:
            raise ValueError("temperature: sampling several paths needs temperature > 0 (num_paths > 1)")
        _bool(self.yes_no_prompt, "yes_no_prompt")
        check_choice(self.fallback, "fallback", ("score", "first"))
        if isinstance(self.conclusion_words, str) or not all(isinstance(w, str) and w.strip()
                                                            for w in self.conclusion_words):
            raise TypeError(f"conclusion_words: expected a list of non-empty strings, got {self.conclusion_words!r}")
        self.conclusion_words = [w.strip().lower() for w in self.conclusion_words]


@dataclass
class RRConfig(SelfConsistencyConfig):
    """RR (rethinking with retrieval): the self-consistency paths, each
    sentence checked against retrieved evidence with NLI; the answer with
    the largest summed path faithfulness wins.

    Attributes
    ----------
    bm25_candidates : int
        BM25 paragraphs per sentence, reranked by the similarity model's
        cosine; the top one is kept (paper: 10).
    similarity_model : str
        The sentence-similarity model that reranks the BM25 candidates and
        gives M of the faithfulness functions (RR sec. 4.2, App. A.2: MPNet).
        Default ``"sentence-transformers/all-mpnet-base-v2"`` (a hub id:
        downloaded on first use, or from the local cache when
        ``HF_HUB_OFFLINE=1``), or a local directory / installed package,
        loaded with mean pooling, L2 normalisation and no prefixes unless
        the model directory has its own ``rcn_fast_encoder.json``.
        ``"retriever"``: the retriever's own encoder and stored embeddings
        (not the paper: an E5-like retriever puts M above ``tm`` for
        almost every sentence, so function 1 never uses entailment). An
        encoder object passed as ``similarity=`` overrides this setting;
        the model used is recorded in ``describe()["similarity"]``.
    bm25_k1, bm25_b : float
        BM25 parameters. Defaults 1.5 and 0.75 (the ``bm25s`` defaults,
        also those of ``python -m rcn_fast.retrieval.bm25``, so an index
        built ahead with that command is reused). The paper retrieved with
        Pyserini's BM25, whose defaults are k1 = 0.9, b = 0.4 (with Porter
        stemming): set ``bm25_k1=0.9, bm25_b=0.4`` to follow it.
    bm25_method : {"lucene", "robertson", "atire", "bm25l", "bm25+"}
        The ``bm25s`` scoring variant (default ``"lucene"``, Lucene's /
        Pyserini's formula).
    bm25_stemmer : str or None
        None (default): no stemming. A Snowball language name (e.g.
        ``"english"``): stem passages and queries with PyStemmer
        (``pip install PyStemmer``).
        The four BM25 settings are recorded in a saved index's manifest
        (``<store>/bm25/``) and compared on load: changing one rebuilds
        the index.
    faithfulness : {1, 2, 3}
        The faithfulness function of RR's App. A.2, summed over a path's
        non-conclusion sentences s (M: cosine of s and its paragraph by
        ``similarity_model``, E/C:
        NLI entailment/contradiction with the paragraph as premise):
        1: ``M*(M >= tm) + E*(M < tm) - C``; 2: ``M + E``;
        3: ``E*(E >= te) - C*(C >= tc)``.
    tm, te, tc : float
        Thresholds Tm = 0.5, Te = 0.6, Tc = 0.99.
    nli_model : str or None
        NLI model loaded (``NLIModel.from_pretrained``) when the pipeline
        is built without an ``nli=`` object: a directory, an installed
        package, or a Hugging Face id in the local cache (e.g.
        ``"cross-encoder/nli-deberta-v3-base"``).
    nli_label_names : list of str or None
        Output names of an NLI model whose config has generic labels.
    nli_batch_size, nli_max_length : int
        NLI forward-pass batch size and pair token limit (the premise
        paragraph is truncated, the sentence kept whole). These three
        apply whenever the NLI model is loaded from a path or id
        (``nli_model``, or ``nli="<path or id>"``); an NLI object passed
        as ``nli=`` keeps its own.
    """

    name: ClassVar[str] = "rr"
    bm25_candidates: int = 10
    similarity_model: str = "sentence-transformers/all-mpnet-base-v2"
    bm25_k1: float = 1.5
    bm25_b: float = 0.75
    bm25_method: str = "lucene"
    bm25_stemmer: str | None = None
    faithfulness: int = 1
    tm: float = 0.5
    te: float = 0.6
    tc: float = 0.99
    nli_model: str | None = None
    nli_label_names: list | None = None
    nli_batch_size: int = 32
    nli_max_length: int = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.bm25_candidates, "bm25_candidates")
        for f in ("bm25_k1", "bm25_b"):
            v = getattr(self, f)
            if not is_number(v) or v < 0:
                raise ValueError(f"{f}: expected a number >= 0, got {v!r}")
            setattr(self, f, float(v))
        check_choice(self.bm25_method, "bm25_method", BM25_METHODS)
        if self.bm25_stemmer is not None and (not isinstance(self.bm25_stemmer, str) or not self.bm25_stemmer.strip()):
            raise TypeError(f"bm25_stemmer: expected a language name (e.g. 'english') or None, got "
                            f"{self.bm25_stemmer!r}")
        if self.faithfulness not in FAITHFULNESS_FUNCTIONS or isinstance(self.faithfulness, bool):
            raise ValueError(f"faithfulness: expected 1, 2 or 3 (RR App. A.2), got {self.faithfulness!r}")
        for f in ("tm", "te", "tc"):
            v = getattr(self, f)
            if not is_number(v):
                raise ValueError(f"{f}: expected a number, got {v!r}")
            setattr(self, f, float(v))
        if self.nli_model is not None and not isinstance(self.nli_model, (str, os.PathLike)):
            raise TypeError(f"nli_model: expected a path or model id, got {type(self.nli_model).__name__}")
        if isinstance(self.nli_model, os.PathLike):
            self.nli_model = os.fspath(self.nli_model)
        if self.nli_label_names is not None:
            if isinstance(self.nli_label_names, str) or not all(isinstance(x, str) for x in self.nli_label_names):
                raise TypeError(f"nli_label_names: expected a list of str, got {self.nli_label_names!r}")
            self.nli_label_names = list(self.nli_label_names)
        _int(self.nli_batch_size, "nli_batch_size")
        _int(self.nli_max_length, "nli_max_length", 8)
        if isinstance(self.similarity_model, os.PathLike):
            self.similarity_model = os.fspath(self.similarity_model)
        if not isinstance(self.similarity_model, str) or not self.similarity_model.strip():
            raise TypeError("similarity_model: expected a model path or id (paper: "
                            "'sentence-transformers/all-mpnet-base-v2') or 'retriever', got "
                            f"{self.similarity_model!r}")


def load_similarity_model(spec: Any) -> Any:
    """RR's sentence-similarity model: an encoder object (anything with
    ``encode_queries`` / ``encode_passages``) is returned as is; a path,
    installed package or hub id is loaded with
    :meth:`rcn_fast.retrieval.Encoder.from_pretrained` -- mean pooling, L2
    normalisation, no prefixes (sentence-transformers models such as
    MPNet), unless the model directory has its own ``rcn_fast_encoder.json``.

    Raises
    ------
    ValueError naming ``similarity_model`` when the model cannot be found
    (e.g. the default hub id while downloads are off and it is not cached).
    """
    if hasattr(spec, "encode_queries") and hasattr(spec, "encode_passages"):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"similarity: expected an encoder, a model path or id, or 'retriever', got "
                        f"{type(spec).__name__}")
    from rcn_fast.retrieval.encoder import Encoder, _model_settings, resolve_model_dir

    try:
        model_dir = resolve_model_dir(os.fspath(spec))
    except ValueError as exc:
        raise ValueError(
            f"similarity_model: cannot load {os.fspath(spec)!r} ({exc}). RR's similarity model (the paper: "
            f"{PAPER_SIMILARITY_MODEL!r}) must be a local directory, an installed package or a cached hub id; "
            "pass similarity_model=<path> (or similarity=<encoder>), or similarity_model='retriever' to use the "
            "retriever's encoder (not the paper's setting)") from None
    kw = {} if _model_settings(model_dir) else {"pooling": "mean", "normalize": True, "query_prefix": "",
                                                 "passage_prefix": ""}
    return Encoder.from_pretrained(os.fspath(spec), **kw)


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


# ---------------------------------------------------------------- faithfulness
def faithfulness_terms(M: Any, E: Any, C: Any, fn: int = 1, *, tm: float = 0.5, te: float = 0.6,
                       tc: float = 0.99) -> np.ndarray:
    """Per-sentence faithfulness terms (RR App. A.2).

    Parameters
    ----------
    M, E, C : float arrays [n]
        Cosine similarity of sentence and paragraph, NLI entailment and
        contradiction probabilities.
    fn : {1, 2, 3}
        1: ``M*(M >= tm) + E*(M < tm) - C``
        2: ``M + E``
        3: ``E*(E >= te) - C*(C >= tc)``
    tm, te, tc : float
        Thresholds (RR: 0.5, 0.6, 0.99).

    Returns
    -------
    float64 [n]; a path's faithfulness is their sum.
    """
    M, E, C = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (M, E, C))
    if not M.shape == E.shape == C.shape:
        raise ValueError(f"E, C: expected the shape of M {M.shape}, got {E.shape} and {C.shape}")
    if fn == 1:
        return np.where(M >= tm, M, 0.0) + np.where(M < tm, E, 0.0) - C
    if fn == 2:
        return M + E
    if fn == 3:
        return np.where(E >= te, E, 0.0) - np.where(C >= tc, C, 0.0)
    raise ValueError(f"fn: expected 1, 2 or 3, got {fn!r}")


@dataclass
class Vote:
    """Outcome of the inference over a question's paths.

    ``votes`` int [C] (paths per choice), ``totals`` float [C] (summed
    faithfulness; the votes for self-consistency), ``pred`` (None when no
    path answered) and ``rule``: what decided (``"faithfulness"`` /
    ``"majority"``, ``"votes"`` on a tie, ``"lowest_index"`` on a tie of
    both, ``"no_answer"``).
    """

    pred: int | None
    votes: list[int]
    totals: list[float]
    rule: str


def faithful_vote(answers: Sequence[int | None], scores: Sequence[float] | None, num_choices: int) -> Vote:
    """RR eq. 1 (``scores`` given) or a majority vote (``scores=None``).

    Parameters
    ----------
    answers : per path, the predicted choice index or None (not counted)
    scores : per path, its faithfulness; None = count votes
    num_choices : int

    Returns
    -------
    Vote
    """
    votes = np.zeros(num_choices, np.int64)
    totals = np.zeros(num_choices, np.float64)
    for j, a in enumerate(answers):
        if a is None:
            continue
        if not 0 <= a < num_choices:
            raise ValueError(f"answers: path {j} predicts choice {a}, out of range for {num_choices} choices")
        votes[a] += 1
        totals[a] += 1.0 if scores is None else float(scores[j])
    live = np.flatnonzero(votes > 0)
    if not len(live):
        return Vote(None, votes.tolist(), totals.tolist(), "no_answer")
    first = "majority" if scores is None else "faithfulness"
    best = totals[live].max()
    cand = [int(i) for i in live if abs(totals[i] - best) <= TIE_TOLERANCE * max(1.0, abs(best))]
    if len(cand) == 1:
        return Vote(cand[0], votes.tolist(), totals.tolist(), first)
    top = max(votes[i] for i in cand)
    cand2 = [i for i in cand if votes[i] == top]
    if len(cand2) == 1:
        return Vote(cand2[0], votes.tolist(), totals.tolist(), "votes")
    return Vote(min(cand2), votes.tolist(), totals.tolist(), "lowest_index")


def vote_logprobs(vote: Vote, softmax: bool) -> list[float]:
    """``choice_logprobs`` of a vote: log-softmax of the totals
    (``softmax=True``, RR) or ``log(votes / answered)``, over the choices
    with at least one path; ``-inf`` elsewhere."""
    votes = np.asarray(vote.votes)
    live = votes > 0
    out = np.full(len(votes), -np.inf)
    if not live.any():
        return out.tolist()
    if softmax:
        t = np.asarray(vote.totals, dtype=np.float64)[live]
        out[live] = t - (t.max() + np.log(np.exp(t - t.max()).sum()))
    else:
        out[live] = np.log(votes[live] / votes.sum())
    return [float(x) for x in out]


# ------------------------------------------------------------------- pipelines
class SelfConsistency(StagedPipeline):
    """Self-consistency: ``num_paths`` sampled chains of thought per question
    (one generation call for the whole batch), majority vote.

    Examples
    --------
    >>> p = rcn_fast.pipelines.build("self_consistency", llm=llm, num_paths=10)   # doctest: +SKIP
    >>> pred = p.run(question); pred.label, pred.trace[-1]["votes"]                  # doctest: +SKIP
    ('B', [2, 7, 1, 0, 0])
    """

    name = "self_consistency"
    config_class = SelfConsistencyConfig
    retriever_kind = "none"
    uses_retrieval = False

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        n = self.config.num_examples
        stages = ["rr_reasoning"] + (["rr_reasoning_yes_no"] if self.config.yes_no_prompt else [])
        #: stage -> its few-shot examples (checked here: asking for more than a stage holds is an error)
        self.examples: dict[str, list[dict[str, Any]]] = {}
        for stage in stages:
            have = len(self.prompts.examples(stage))
            if n is not None and n > have:
                raise ValueError(f"num_examples: {n} asked, but the prompt set ({self.prompts.source}) has {have} "
                                 f"examples for stage {stage!r}; use num_examples <= {have} (0 = zero-shot) "
                                 "or give more in a prompt file")
            self.examples[stage] = self.prompts.examples(stage, n)

    def stage_of(self, question: MCQuestion) -> str:
        return "rr_reasoning_yes_no" if self.config.yes_no_prompt and is_yes_no(question) else "rr_reasoning"

    def chat_of(self, question: MCQuestion) -> list[dict[str, str]]:
        """The reasoning chat of a question: instruction, the few-shot
        examples as user/assistant turns, the question, the pre-fill."""
        stage = self.stage_of(question)
        return self.prompts.chat(stage, question, examples=self.examples[stage])

    # ------------------------------------------------------------ stages
    def sample_paths(self, states: list[QuestionState], runner: StageRunner | None = None) -> int:
        """One generation call: ``num_paths`` samples of every question's
        few-shot reasoning chat (:meth:`chat_of`), through ``runner`` (a new
        :meth:`runner` when None). Fills ``state.data["paths"]``; returns the
        number of LLM calls made (0 or 1)."""
        c = self.config
        if not states:
            return 0
        runner = runner if runner is not None else self.runner()
        stages = [self.stage_of(st.question) for st in states]
        outs = runner.sample("rr_reasoning", states, [self.chat_of(st.question) for st in states],
                             num_samples=c.num_paths,
                             trace=[{"stage": sg, "num_examples": len(self.examples[sg])} for sg in stages])
        for st, texts in zip(states, outs):
            st.data["paths"] = [make_path(t, st.question, c.conclusion_words) for t in texts]
        return 1

    def check_paths(self, states: list[QuestionState]) -> None:
        """RR's evidence step (nothing for self-consistency)."""

    def decide(self, st: QuestionState) -> Vote:
        paths: list[ReasoningPath] = st.data["paths"]
        return faithful_vote([p.answer.index for p in paths], None, len(st.question.choices))

    # ------------------------------------------------------------ the answer
    def knowledge_stages(self, states: list[QuestionState], runner: StageRunner) -> None:
        """Sample the reasoning paths (:meth:`sample_paths`), then check them
        (:meth:`check_paths`)."""
        self.sample_paths(states, runner)
        self.check_paths(states)

    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """The vote of each question's paths (``state.data["pred"]``); the
        unanswered ones fall back by the config's ``fallback`` (``"score"``:
        one scoring pass each, one LLM call for them all)."""
        votes = [self.decide(st) for st in states]
        lps: list[list[float] | None] = [None] * len(states)
        preds_idx: list[int] = [0] * len(states)
        unanswered = [i for i, v in enumerate(votes) if v.pred is None]
        if unanswered and self.config.fallback == "score":
            sub = [states[i] for i in unanswered]
            chats = [self.prompts.chat("answer", st.question) for st in sub]
            scores = runner.score("answer", sub, chats)
            for i, lp in zip(unanswered, scores):
                lps[i] = lp
                preds_idx[i] = int(np.argmax(np.asarray(lp, dtype=np.float64)))
        for i, (st, v) in enumerate(zip(states, votes)):
            nc = len(st.question.choices)
            if v.pred is not None:
                lps[i] = vote_logprobs(v, softmax=self.uses_retrieval)
                preds_idx[i] = v.pred
            elif lps[i] is None:  # fallback "first"
                lps[i] = [-math.log(nc)] * nc
                preds_idx[i] = 0
            self._trace_paths(st)
            st.trace.append(self._vote_trace(st, v, preds_idx[i]))
            st.data["pred"] = preds_idx[i]
        return [list(lp or []) for lp in lps]

    def prediction(self, st: QuestionState, lp: list[float], cost: QuestionCost) -> Prediction:
        """The voted answer; its knowledge is the distinct explanations of the
        paths that reached it."""
        q = st.question
        pred = st.data["pred"]
        knowledge: list[str] = []
        for p in st.data["paths"]:
            if p.answer.index == pred and p.explanation and p.explanation not in knowledge:
                knowledge.append(p.explanation)
        return Prediction(
            question_id=q.id, pred=pred, label=q.labels[pred], choice_logprobs=lp,
            knowledge=knowledge, passages=list(st.passages), trace=st.trace, cost=cost, answer=q.answer,
        )

    def _trace_paths(self, st: QuestionState) -> None:
        q = st.question
        for j, p in enumerate(st.data["paths"]):
            sents = []
            for k, (s, chk) in enumerate(zip(p.sentences, p.checked)):
                item: dict[str, Any] = {"text": s, "checked": chk, "answer_sentence": k == p.answer.sentence}
                if p.evidence and p.evidence[k] is not None:
                    item.update(p.evidence[k])
                sents.append(item)
            entry: dict[str, Any] = {
                "stage": "paths", "type": "path", "sample": j, "text": p.text, "sentences": sents,
                "dropped_after_answer": p.dropped, "answer": p.answer.index,
                "label": None if p.answer.index is None else q.labels[p.answer.index], "parse_rule": p.answer.rule,
            }
            if self.uses_retrieval:
                entry["faithfulness"] = p.faithfulness
            st.trace.append(entry)

    def _vote_trace(self, st: QuestionState, v: Vote, pred: int) -> dict[str, Any]:
        paths: list[ReasoningPath] = st.data["paths"]
        entry: dict[str, Any] = {
            "stage": "inference", "type": "vote", "method": "faithfulness" if self.uses_retrieval else "majority",
            "answers": [p.answer.index for p in paths], "votes": v.votes, "totals": v.totals, "rule": v.rule,
            "pred": pred, "fallback": None if v.pred is not None else self.config.fallback,
        }
        if self.uses_retrieval:
            entry["faithfulness"] = [p.faithfulness for p in paths]
            sc = faithful_vote([p.answer.index for p in paths], None, len(st.question.choices))
            entry["majority_pred"] = sc.pred  # self-consistency on the same paths
        return entry


class RR(SelfConsistency):
    """Rethinking with retrieval: self-consistency paths re-weighted by
    their faithfulness to retrieved evidence (see the module docstring).

    Parameters
    ----------
    llm : LLM
    config : RRConfig, optional
    retriever : BM25Reranker, rcn_fast Retriever or InMemoryRetriever
        The knowledge corpus. A ``Retriever`` over a corpus store uses the
        store's BM25 index (built once with the config's ``bm25_*``
        settings, saved in ``<store>/bm25/``, rebuilt when a setting
        changes) and its stored embeddings; an ``InMemoryRetriever`` a
        BM25 index of its texts. A ``BM25Reranker`` keeps its index (and
        the index's own settings). The similarity model reranks (the
        retriever's encoder only with ``similarity_model="retriever"``).
    prompts : optional
    similarity : EncoderLike, path or model id, optional
        The sentence-similarity model (reranking and M). Default:
        ``config.similarity_model`` (the paper's MPNet); ``"retriever"``
        uses the retriever's encoder.
    nli : NLILike, path or model id, optional
        The NLI model (default: ``config.nli_model``). E.g.
        ``rcn_fast.nli.NLIModel.from_pretrained("cross-encoder/nli-deberta-v3-base")``.
        A path or id is loaded with ``nli_label_names``,
        ``nli_batch_size`` and ``nli_max_length``.

    Examples
    --------
    >>> from rcn_fast.nli import NLIModel                                              # doctest: +SKIP
    >>> p = rcn_fast.pipelines.build("rr", llm=llm, retriever=Retriever.load("corpus/"),
    ...                              nli=NLIModel.from_pretrained("cross-encoder/nli-deberta-v3-base"))
    >>> p.run(question).trace[-1]["faithfulness"]                                        # doctest: +SKIP
    [0.93, -0.41, 1.2, ...]
    """

    name = "rr"
    config_class = RRConfig
    retriever_kind = "corpus"
    uses_retrieval = True
    component_args = ("nli", "similarity")

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None,
                 nli: Any = None, similarity: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        from rcn_fast.nli import load_nli
        from rcn_fast.retrieval.bm25 import BM25Reranker

        c = self.config
        evidence = BM25Reranker.from_retriever(retriever, candidates=c.bm25_candidates, **self.bm25_settings())
        spec = c.similarity_model if similarity is None else similarity
        if isinstance(spec, str) and spec == "retriever":
            self.similarity = evidence.encoder  # the retriever's encoder and its stored embeddings
        else:
            self.similarity = load_similarity_model(spec)
            # same BM25 index, candidates embedded by the similarity model
            evidence = BM25Reranker(evidence.bm25, self.similarity, candidates=c.bm25_candidates)
        self.evidence = evidence
        if nli is None:
            if c.nli_model is None:
                raise TypeError("nli: the 'rr' pipeline needs an NLI model: pass nli=NLIModel.from_pretrained(...) "
                                "(e.g. 'cross-encoder/nli-deberta-v3-base') or set nli_model=<path or id>")
            nli = c.nli_model
        # a path or id is loaded with the config's NLI settings; an NLI object keeps its own
        self.nli = load_nli(nli, label_names=c.nli_label_names, batch_size=c.nli_batch_size,
                            max_length=c.nli_max_length)

    def bm25_settings(self) -> dict[str, Any]:
        """The config's BM25 settings as :class:`~rcn_fast.retrieval.bm25.BM25Index` arguments
        (a ``BM25Reranker`` passed as the retriever keeps its own index)."""
        c = self.config
        return {"k1": c.bm25_k1, "b": c.bm25_b, "method": c.bm25_method, "stemmer": c.bm25_stemmer}

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["nli"] = getattr(self.nli, "identity", type(self.nli).__name__)
        sim = self.similarity
        d["similarity"] = {k: v for k, v in sim.describe().items() if k in SIMILARITY_KEYS} \
            if hasattr(sim, "describe") else type(sim).__name__
        d["bm25"] = repr(self.evidence.bm25)
        return d

    def check_paths(self, states: list[QuestionState]) -> None:
        """All checked sentences of the batch (deduplicated): one BM25 +
        rerank call, one NLI call; then each path's faithfulness."""
        c = self.config
        uniq: dict[str, int] = {}
        for st in states:
            for p in st.data["paths"]:
                for s, chk in zip(p.sentences, p.checked):
                    if chk and s not in uniq:
                        uniq[s] = len(uniq)
        sentences = list(uniq)
        found, cands = self.evidence.retrieve_with_candidates(sentences, k=1) if sentences else ([], [])
        pairs = [(i, res[0]) for i, res in enumerate(found) if res]
        nli = self.nli.predict([ps.text for _, ps in pairs], [sentences[i] for i, _ in pairs]) if pairs else None
        ev: list[dict[str, Any]] = []
        for i, s in enumerate(sentences):
            ev.append({"passage": None, "candidates": cands[i] if cands else [], "similarity": 0.0,
                       "entailment": 0.0, "contradiction": 0.0, "nli_probs": None})
        for row, (i, ps) in enumerate(pairs):
            ev[i].update({
                "passage": {"id": ps.id, "text": ps.text, "bm25": ps.meta.get("bm25"),
                            "bm25_rank": ps.meta.get("bm25_rank"), "cosine": ps.score},
                "similarity": float(ps.score), "entailment": float(nli.entailment[row]),
                "contradiction": float(nli.contradiction[row]),
                "nli_probs": dict(zip(nli.labels, (float(x) for x in nli.probs[row]))),
            })
        M = np.array([e["similarity"] for e in ev])
        E = np.array([e["entailment"] for e in ev])
        C = np.array([e["contradiction"] for e in ev])
        terms = faithfulness_terms(M, E, C, c.faithfulness, tm=c.tm, te=c.te, tc=c.tc) if ev else np.zeros(0)
        # a sentence without any BM25 match has no evidence: its term is 0
        has = np.array([e["passage"] is not None for e in ev], dtype=bool)
        terms = np.where(has, terms, 0.0) if ev else terms
        for st in states:
            seen: set[str] = set()
            for p in st.data["paths"]:
                p.evidence = []
                total = 0.0
                for s, chk in zip(p.sentences, p.checked):
                    if not chk:
                        p.evidence.append(None)
                        continue
                    i = uniq[s]
                    e = dict(ev[i], term=float(terms[i]))
                    p.evidence.append(e)
                    total += float(terms[i])
                    if e["passage"] is not None and e["passage"]["id"] not in seen:
                        seen.add(e["passage"]["id"])
                        pe = e["passage"]
                        st.passages.append(Passage(id=pe["id"], text=pe["text"], score=float(pe["cosine"]),
                                                   meta={"bm25": pe["bm25"], "cosine": pe["cosine"]}))
                p.faithfulness = total
            st.trace.append({"stage": "evidence", "type": "retrieve",
                             "sentences": sum(sum(p.checked) for p in st.data["paths"]),
                             "passages": [x.id for x in st.passages]})

    def decide(self, st: QuestionState) -> Vote:
        paths: list[ReasoningPath] = st.data["paths"]
        return faithful_vote([p.answer.index for p in paths], [p.faithfulness or 0.0 for p in paths],
                             len(st.question.choices))


__all__ = [
    "RR", "SelfConsistency", "split_sentences", "is_conclusion", "parse_answer", "ParsedAnswer", "ReasoningPath",
    "make_path", "faithfulness_terms", "faithful_vote", "vote_logprobs", "Vote", "load_similarity_model",
    "PAPER_SIMILARITY_MODEL", "RRConfig", "SelfConsistencyConfig", "CONCLUSION_WORDS", "FAITHFULNESS_FUNCTIONS",
    "BM25_METHODS",
]
