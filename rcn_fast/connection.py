"""Knowledge connection for any RAG system: "connect these passages for
this question".

:func:`connect` runs ReConnect's knowledge-connection stages for a batch of
questions and returns, per question, the connected explanation with the
subsets it was built from, the N extractions, the trace of every prompt and
output, and the LLM cost. It is the library entry point the framework
adapters (:mod:`rcn_fast.integrations`) wrap.

Passages come from one of two sources:

* ``retriever=`` -- ReConnect in full: query expansion (explanations of how
  to answer), one batched retrieval for every explanation and the question,
  the pooled passages, relevance sampling, N extractions, aggregation.
  Anything :func:`rcn_fast.pipelines.knowledge.as_embedding_retriever`
  accepts: an rcn_fast :class:`~rcn_fast.retrieval.Retriever`, an
  :class:`~rcn_fast.pipelines.InMemoryRetriever`, a framework retriever
  wrapped by :mod:`rcn_fast.integrations`.
* ``passages=`` -- passages already retrieved, one list per question: they
  are the pool. Query expansion only makes retrieval queries, so it is
  skipped; sampling, extraction and aggregation run as in ReConnect. The
  relevance sampler needs the question's and the passages' embeddings:
  give ``encoder=`` (an rcn_fast encoder, or a framework embedding model
  wrapped by :mod:`rcn_fast.integrations`), optionally with
  ``passage_embeddings=``; ``sampling="random"`` needs none.

The ablation settings of :class:`~rcn_fast.pipelines.ReConnectConfig` apply
(``knowledge_extraction=False`` aggregates straight from the pool, ...).
Every stage is one batched call for the whole batch of questions: one LLM
call per stage, one encoder call for the questions, one for the passages.

Questions are :class:`~rcn_fast.data.MCQuestion` (or a dict with
``question`` and ``choices``) or open questions without choices (a str, an
:class:`~rcn_fast.data.OpenQuestion`, a dict without ``choices``), which
get ReConnect's open-question prompts (explanations of how to answer; see
:mod:`rcn_fast.pipelines.reconnect`) and, with ``answer=True``, a
generated answer (:class:`~rcn_fast.pipelines.OpenPrediction`). A batch
mixing both kinds is split by kind, each kind run as its own batch, and the
results rejoined in the input order. Dataset records with their own answer
keys (``"answerKey": "A"``, ``"answer": "A"``) are accepted as they are.

Examples
--------
>>> import rcn_fast                                                # doctest: +SKIP
>>> connect = rcn_fast.connect     # this module's connect(), imported on first use
>>> out = connect([{"question": "Where do fish live?", "choices": ["water", "trees"]}],
...               llm=llm, passages=[["Fish live in water.", "Trees grow on land."]],
...               encoder=encoder)
>>> out[0].explanation, out[0].cost.llm_calls
(['Fish live in water, so ...'], 5)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np

from rcn_fast._validate import is_int
from rcn_fast.data import MCQuestion, OpenQuestion
from rcn_fast.pipelines.base import Prediction, QuestionCost, StageRunner
from rcn_fast.pipelines.knowledge import has_embeddings, passage_refs
from rcn_fast.pipelines.rag import OpenPrediction
from rcn_fast.pipelines.reconnect import ReConnect, ReConnectConfig
from rcn_fast.pipelines.reconnect_stages import ReConnectState, pool_passages
from rcn_fast.pipelines.spec import Stage, insert_stage, remove_stages, replace_stage
from rcn_fast.retrieval.adapters import as_float32
from rcn_fast.retrieval.types import Passage

QuestionInput = MCQuestion | OpenQuestion | str | Mapping[str, Any]
PassageInput = Passage | str | Mapping[str, Any]


# ---------------------------------------------------------------- results
@dataclass
class Connection:
    """The knowledge connected for one question.

    Attributes
    ----------
    question_id : str
    explanation : list of str
        The connected explanation: the aggregation's items (with
        ``knowledge_aggregation=False``, one item per extraction; with
        ``knowledge_connection=False``, the pooled passage texts) -- what
        ReConnect gives its answering step.
    passages : list of Passage
        The pool: the passages given, or those retrieved for the
        explanations and the question (exact duplicate texts removed).
    subsets : list of list of Passage
        The N sampled subsets (empty when extraction is off).
    extractions : list of list of str
        Per subset, the extraction's parsed items.
    queries : list of str
        The query-expansion explanations used as retrieval queries (empty
        with given passages).
    trace : list of dict
        Every stage's prompt and output (see
        :class:`~rcn_fast.pipelines.Prediction`).
    cost : QuestionCost
        LLM calls and tokens of this question.
    prediction : Prediction, OpenPrediction or None
        The answer when ``connect(..., answer=True)``: choice
        log-probabilities (:class:`Prediction`) for a multiple-choice
        question, the generated answer with StringEM and exact match
        (:class:`OpenPrediction`) for an open one.
    """

    question_id: str
    explanation: list[str]
    passages: list[Passage] = field(default_factory=list)
    subsets: list[list[Passage]] = field(default_factory=list)
    extractions: list[list[str]] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    cost: QuestionCost = field(default_factory=QuestionCost)
    prediction: Prediction | OpenPrediction | None = None

    @property
    def text(self) -> str:
        """The explanation as one string, one item per line."""
        return "\n".join(self.explanation)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        return {
            "question_id": self.question_id, "explanation": list(self.explanation),
            "passages": [p.to_dict() for p in self.passages],
            "subsets": [[p.to_dict() for p in s] for s in self.subsets],
            "extractions": [list(e) for e in self.extractions], "queries": list(self.queries),
            "trace": list(self.trace), "cost": self.cost.to_dict(),
            "prediction": None if self.prediction is None else self.prediction.to_dict(),
        }


# ------------------------------------------------------------ input checks
_QUESTION_KEYS = ("id", "question", "question_stem", "choices", "labels", "answer", "answerKey", "answers", "meta")


def _choices_of(raw: Any, labels: Any, where: str) -> tuple[list[str], list[str] | None]:
    """Choice texts and labels from the layouts of the datasets: a list of
    str, a list of ``{"label", "text"}`` (CommonsenseQA), or
    ``{"text": [...], "label": [...]}`` (the Hugging Face ARC/CSQA rows)."""
    if isinstance(raw, Mapping):
        if not isinstance(raw.get("text"), (list, tuple)):
            raise ValueError(f"{where}: choices as a mapping needs a 'text' list, got keys {sorted(raw)}")
        texts = [str(t) for t in raw["text"]]
        got = raw.get("label")
        return texts, ([str(x) for x in got] if got else None) if labels is None else list(labels)
    if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
        raise TypeError(f"{where}: choices: expected a list of str or of {{'label', 'text'}}, got "
                        f"{type(raw).__name__}")
    if all(isinstance(c, Mapping) for c in raw):
        if not all("text" in c for c in raw):
            raise ValueError(f"{where}: choices: every {{'label', 'text'}} needs a 'text'")
        found = [str(c.get("label", chr(ord("A") + j))) for j, c in enumerate(raw)]
        return [str(c["text"]) for c in raw], found if labels is None else list(labels)
    return [str(c) for c in raw], None if labels is None else list(labels)


def _answer_index(q: Mapping[str, Any], labels: list[str], where: str) -> int | None:
    """The answer of a multiple-choice mapping as a choice index: ``answerKey``
    (a label, the datasets' own key) or ``answer`` (a label such as ``"A"``,
    or a 0-based index); both given must agree."""
    found: list[tuple[str, int]] = []
    for key in ("answerKey", "answer"):
        a = q.get(key)
        if a is None or a == "":
            continue
        if is_int(a) and key == "answer":
            if not 0 <= a < len(labels):
                raise ValueError(f"{where}: answer index {a} is out of range for {len(labels)} choices")
            found.append((key, int(a)))
        elif isinstance(a, str) and a in labels:
            found.append((key, labels.index(a)))
        else:
            raise ValueError(f"{where}: {key} {a!r} is not one of the labels {labels}"
                             + (" or a choice index" if key == "answer" else ""))
    if len({i for _, i in found}) > 1:
        raise ValueError(f"{where}: answerKey {q['answerKey']!r} and answer {q['answer']!r} disagree")
    return found[0][1] if found else None


def _open_answers(q: Mapping[str, Any], where: str) -> list[str]:
    """Gold answers of an open-question mapping: ``answers`` (a list), or
    ``answer`` (a str or a list of str)."""
    if q.get("answerKey") not in (None, ""):
        raise ValueError(f"{where}: answerKey names a choice label, but the question has no choices")
    a = q.get("answers")
    if a is None:
        a = q.get("answer")
    if a is None:
        return []
    return [a] if isinstance(a, str) else list(a)


def as_question(q: QuestionInput, index: int) -> MCQuestion | OpenQuestion:
    """One question input -> an :class:`MCQuestion` (with choices) or an
    :class:`OpenQuestion` (without). A str or a mapping without ids gets the
    id ``"q<index>"``.

    A mapping may be a dataset's own record: the question in ``question``
    (a str, or CommonsenseQA's ``{"stem", "choices"}``) or
    ``question_stem`` (OpenBookQA); choices as a list of str, of
    ``{"label", "text"}``, or ``{"text": [...], "label": [...]}``; the
    answer as ``answerKey`` or ``answer`` (a label such as ``"A"``, or a
    0-based index). An open question's gold answers are ``answers`` or
    ``answer``. Keys not read here are kept in ``meta``.
    """
    if isinstance(q, (MCQuestion, OpenQuestion)):
        return q
    where = f"questions[{index}]"
    if isinstance(q, str):
        if not q.strip():
            raise ValueError(f"{where}: expected non-empty question text")
        return OpenQuestion(id=f"q{index}", question=q)
    if not isinstance(q, Mapping):
        raise TypeError(f"{where}: expected an MCQuestion, OpenQuestion, str or mapping, got {type(q).__name__}")
    text, raw_choices = q.get("question", q.get("question_stem")), q.get("choices")
    extra = {k: v for k, v in q.items() if k not in _QUESTION_KEYS}
    if isinstance(text, Mapping):  # CommonsenseQA: {"question": {"stem", "choices", "question_concept"}}
        extra.update({k: v for k, v in text.items() if k not in ("stem", "choices")})
        text, raw_choices = text.get("stem"), text.get("choices", raw_choices)
    if not isinstance(text, str):
        raise ValueError(f"{where}: a mapping needs a 'question' str (or {{'stem', 'choices'}}), got keys {sorted(q)}")
    qid = str(q["id"]) if q.get("id") is not None else f"q{index}"
    meta = {**extra, **dict(q.get("meta") or {})}
    try:
        if raw_choices:
            texts, labels = _choices_of(raw_choices, q.get("labels"), where)
            lab = labels or [chr(ord("A") + j) for j in range(len(texts))]
            return MCQuestion(id=qid, question=text, choices=texts, labels=labels,
                              answer=_answer_index(q, lab, where), meta=meta)
        return OpenQuestion(id=qid, question=text, answers=_open_answers(q, where), meta=meta)
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        raise type(exc)(msg if msg.startswith(where) else f"{where}: {msg}") from None


def as_passage(p: PassageInput, where: str, rank: int) -> Passage:
    """One given passage -> :class:`Passage` (a str gets id ``"<rank>"``
    and score 0 until :func:`connect` gives it the encoder's relevance; a
    mapping needs ``text``)."""
    if isinstance(p, Passage):
        return p
    if isinstance(p, str):
        return Passage(id=str(rank), text=p, score=0.0, meta={})
    if isinstance(p, Mapping):
        if not isinstance(p.get("text"), str):
            raise ValueError(f"{where}: a mapping needs a 'text' str, got keys {sorted(p)}")
        return Passage(id=str(p.get("id", rank)), text=p["text"], score=float(p.get("score") or 0.0),
                       meta=dict(p.get("meta") or {}))
    raise TypeError(f"{where}: expected a Passage, str or mapping with 'text', got {type(p).__name__}")


# --------------------------------------------------------------- sources
class GivenPassages:
    """Embeddings for passages given per question (the pool of
    :func:`connect` with ``passages=``).

    Parameters
    ----------
    encoder : EncoderLike or None
        ``encode_queries(texts)`` / ``encode_passages(texts)`` -> float
        [n, d]. None: no embeddings (``sampling="random"`` only).
    embeddings : dict, optional
        ``id(passage) -> float32 [d]`` for passages whose embeddings were
        given (used instead of encoding them).
    """

    def __init__(self, encoder: Any = None, embeddings: dict[int, np.ndarray] | None = None) -> None:
        self.encoder = encoder
        self.given = embeddings or {}
        self.encoder_calls = 0

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        self.encoder_calls += 1
        return as_float32(self.encoder.encode_queries(list(queries)))

    def passage_embeddings(self, passages: Sequence[Passage]) -> np.ndarray:
        """float32 [n, d]: the given rows, the others encoded in one call."""
        passages = list(passages)
        missing = [i for i, p in enumerate(passages) if id(p) not in self.given]
        rows: list[np.ndarray | None] = [self.given.get(id(p)) for p in passages]
        if missing:
            self.encoder_calls += 1
            enc = as_float32(self.encoder.encode_passages([passages[i].text for i in missing]))
            for i, row in zip(missing, enc):
                rows[i] = row
        if not passages:
            return np.zeros((0, int(getattr(self.encoder, "dim", 0) or 0)), np.float32)
        return np.stack([np.asarray(r, np.float32) for r in rows])

    def remember(self, passages: Sequence[Passage], rows: np.ndarray) -> None:
        """Keep ``rows`` as the embeddings of ``passages`` (not encoded again)."""
        for p, row in zip(passages, rows):
            self.given[id(p)] = np.asarray(row, np.float32)

    def retrieve_embeddings(self, query_emb: Any, k: int) -> list[list[Passage]]:  # pragma: no cover - unused
        raise RuntimeError("given passages are not searched; the pool is the passages given")


class _NoEmbeddings:
    """Source of a ``passages=`` run without an encoder (random sampling)."""

    def retrieve(self, queries: Sequence[str], k: int = 5) -> list[list[Passage]]:  # pragma: no cover - unused
        raise RuntimeError("given passages are not searched; the pool is the passages given")


class GivenPool(Stage):
    """Connection's retrieval stage with ``passages=``: each question's pool
    is the passages given for it (exact duplicate texts removed). With an
    encoder, the question query and the pool are embedded here (one call
    each for the batch; the sampler reuses the passages' rows) and each
    pool passage's relevance ``dot(e_q, e_j)`` is recorded in the trace
    (a ``retrieve`` entry, ``source: "given"``); a passage given without a
    score of its own (a str, a mapping without ``score``) takes it as its
    ``score``."""

    name = "retrieval"
    reads = ("question",)
    writes = ("passages", "query_embedding", "trace")

    def __init__(self, given: dict[str, list[Passage]], unscored: frozenset[int] = frozenset()) -> None:
        self.given = given
        self.unscored = unscored  # id() of the given passages that came without a score

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        pipe = runner.pipeline
        src = pipe.source
        pools = [pool_passages([self.given[st.id]]) for st in states]
        rel: list[np.ndarray | None] = [None] * len(states)
        if has_embeddings(src) and states:
            qemb = src.embed_queries([pipe.question_query(st.question) for st in states])
            flat = [p for pool in pools for p in pool]
            rows = src.passage_embeddings(flat)
            off = 0
            for b, (st, pool) in enumerate(zip(states, pools)):
                st.query_embedding = qemb[b]
                mine = rows[off : off + len(pool)]
                off += len(pool)
                rel[b] = mine @ np.asarray(qemb[b], np.float32)
                scored = [replace(p, score=float(r)) if id(p) in self.unscored else p for p, r in zip(pool, rel[b])]
                src.remember(scored, mine)
                pools[b] = scored
        for st, pool, r in zip(states, pools, rel):
            st.passages = pool
            st.trace.append({"stage": "retrieval", "type": "retrieve", "source": "given",
                             "query": pipe.question_query(st.question), "given": len(self.given[st.id]),
                             "pool": [p.id for p in pool],
                             "passages": passage_refs(pool, [None] * len(pool) if r is None else
                                                      [float(x) for x in r])})


class KeepConnection(Stage):
    """Keeps each question's subsets, extractions and queries (what a
    :class:`Connection` reports besides the prediction)."""

    name = "keep_connection"
    reads = ("subsets", "extractions", "explanations")

    def __init__(self, kept: dict[str, dict[str, Any]]) -> None:
        self.kept = kept

    def run(self, states: list[ReConnectState], runner: StageRunner) -> None:  # type: ignore[override]
        for st in states:
            self.kept[st.id] = {"subsets": [list(s) for s in st.subsets],
                                "extractions": [list(e) for e in st.extractions],
                                "queries": list(st.explanations)}


def connection_stages(stages: Sequence[Stage], *, given: dict[str, list[Passage]] | None,
                      kept: dict[str, dict[str, Any]], answer: bool,
                      unscored: frozenset[int] = frozenset()) -> tuple[Stage, ...]:
    """ReConnect's stage list (under its ablations) as :func:`connect` runs
    it: with given passages :class:`GivenPool` in place of query expansion
    and retrieval; :class:`KeepConnection` before the answer; no answer
    stage unless ``answer``."""
    out = tuple(stages)
    if given is not None:
        out = replace_stage(tuple(s for s in out if s.name != "query_expansion"), "retrieval",
                            GivenPool(given, unscored))
    out = insert_stage(out, KeepConnection(kept), before="answer")
    return out if answer else remove_stages(out, "answer")


class _Connector(ReConnect):
    """ReConnect whose stage list is :func:`connection_stages`'s."""

    def __init__(self, llm: Any, config: ReConnectConfig, *, retriever: Any, prompts: Any, answer: bool,
                 given: dict[str, list[Passage]] | None, unscored: frozenset[int] = frozenset()) -> None:
        self.given, self.answer, self.unscored = given, answer, unscored
        self.kept: dict[str, dict[str, Any]] = {}
        super().__init__(llm, config, retriever=retriever, prompts=prompts)

    def declared_stages(self) -> tuple[Stage, ...]:
        return connection_stages(super().declared_stages(), given=self.given, kept=self.kept, answer=self.answer,
                                 unscored=self.unscored)


# -------------------------------------------------------------- entry point
def connect(
    questions: Sequence[QuestionInput],
    *,
    llm: Any,
    retriever: Any = None,
    passages: Sequence[Sequence[PassageInput]] | None = None,
    encoder: Any = None,
    passage_embeddings: Sequence[Any] | None = None,
    config: ReConnectConfig | None = None,
    prompts: Any = None,
    answer: bool = False,
    **settings: Any,
) -> list[Connection]:
    """Connect knowledge for a batch of questions.

    Parameters
    ----------
    questions : sequence, length B
        :class:`~rcn_fast.data.MCQuestion`, or a mapping ``{"question",
        "choices"[, "id", "labels", "answer", "meta"]}``; or open questions
        without choices: a str, an :class:`~rcn_fast.data.OpenQuestion`, a
        mapping ``{"question"[, "id", "answers", "meta"]}``; or a dataset's
        own record (see :func:`as_question`: ``answerKey``, ``"answer":
        "A"``, CommonsenseQA/ARC choice layouts). A batch may mix both
        kinds: each kind runs as its own batch (one LLM call per stage per
        kind) and the results come back in the input order. Ids must be
        distinct (a str or a mapping
        without ``id`` gets ``"q<index>"``).
    llm : rcn_fast LLM
        See :func:`rcn_fast.llm.load_llm`.
    retriever : retriever, optional
        Passage source for full ReConnect (query expansion + retrieval).
        Exactly one of ``retriever`` and ``passages``.
    passages : sequence of B sequences, optional
        Already-retrieved passages per question: :class:`Passage`, str or
        ``{"text"[, "id", "score", "meta"]}``. With ``encoder``, the trace
        records each one's relevance to the question (``dot(e_q, e_j)``),
        which is also the ``score`` of those given without one.
    encoder : EncoderLike, optional
        With ``passages``: embeds the questions and passages for the
        relevance sampler (``encode_queries`` / ``encode_passages``).
        Needed unless ``sampling="random"`` or extraction is off.
    passage_embeddings : sequence of B arrays [n_b, d], optional
        With ``passages``: their embeddings (not encoded again); the
        questions are still embedded by ``encoder``.
    config : ReConnectConfig, optional
    prompts : path, mapping or PromptSet, optional
    answer : bool
        Also run ReConnect's answering step: each :class:`Connection` then
        holds the :class:`~rcn_fast.pipelines.Prediction` (an
        :class:`~rcn_fast.pipelines.OpenPrediction`, the answer generated
        with the explanation, for open questions).
    **settings
        ReConnectConfig fields overriding ``config`` (``num_subsets=``,
        ``sampling=``, ``knowledge_aggregation=``, ...).

    Returns
    -------
    list of Connection, length B, in the order of ``questions``.

    Raises
    ------
    ValueError / TypeError
        Naming the argument: both or neither of ``retriever`` and
        ``passages``, a length mismatch, an unknown setting, duplicate
        question ids, a dataset answer key that names no choice.
    """
    if isinstance(questions, (str, Mapping, MCQuestion, OpenQuestion)):
        raise TypeError("questions: expected a sequence of questions (batch first), got a single question; "
                        "wrap it in a list")
    qs = [as_question(q, i) for i, q in enumerate(questions)]
    seen: dict[str, int] = {}
    for i, q in enumerate(qs):
        if q.id in seen:
            raise ValueError(f"questions[{i}]: duplicate question id {q.id!r} (also questions[{seen[q.id]}]); ids key "
                             "the results, costs and random streams")
        seen[q.id] = i
    if (retriever is None) == (passages is None):
        raise ValueError("retriever, passages: give exactly one (a retriever for full ReConnect, or the passages "
                         "already retrieved for each question)")
    if config is None:
        config = ReConnectConfig()
    if not isinstance(config, ReConnectConfig):
        raise TypeError(f"config: expected a ReConnectConfig, got {type(config).__name__}")
    if settings:
        known = {f.name for f in fields(config)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"settings: unknown ReConnectConfig field(s) {unknown}")
        config = type(config)(**{**{f.name: getattr(config, f.name) for f in fields(config)}, **settings})
    if not isinstance(answer, bool):
        raise TypeError(f"answer: expected a bool, got {answer!r}")
    given: list[list[Passage]] | None = None
    unscored: set[int] = set()  # id() of the given passages without a score of their own
    if passages is not None:
        if isinstance(passages, (str, Mapping)) or len(passages) != len(qs):
            raise ValueError(f"passages: expected one list of passages per question ({len(qs)}), got "
                             f"{type(passages).__name__ if isinstance(passages, (str, Mapping)) else len(passages)}")
        given = []
        for b, plist in enumerate(passages):
            if isinstance(plist, (str, Mapping)):
                raise TypeError(f"passages[{b}]: expected a list of passages, got a single {type(plist).__name__}")
            given.append([as_passage(p, f"passages[{b}][{r}]", r) for r, p in enumerate(plist)])
            unscored.update(id(g) for p, g in zip(plist, given[-1])
                            if isinstance(p, str) or (isinstance(p, Mapping) and p.get("score") is None))
        emb_of: dict[int, np.ndarray] = {}
        if passage_embeddings is not None:
            if len(passage_embeddings) != len(qs):
                raise ValueError(f"passage_embeddings: expected one array per question ({len(qs)}), got "
                                 f"{len(passage_embeddings)}")
            for b, (plist, e) in enumerate(zip(given, passage_embeddings)):
                arr = as_float32(e)
                if arr.ndim != 2 or arr.shape[0] != len(plist):
                    raise ValueError(f"passage_embeddings[{b}]: expected shape [{len(plist)}, d], got {arr.shape}")
                emb_of.update({id(p): row for p, row in zip(plist, arr)})
        needs_emb = config.knowledge_connection and config.knowledge_extraction and config.sampling != "random"
        if encoder is None and needs_emb:
            raise ValueError(f"encoder: sampling={config.sampling!r} needs the question and passage embeddings; "
                             "give encoder= (an rcn_fast encoder or a wrapped framework embedding model) or use "
                             "sampling='random'")
        if encoder is not None and not (hasattr(encoder, "encode_queries") and hasattr(encoder, "encode_passages")):
            raise TypeError(f"encoder: expected encode_queries(texts) and encode_passages(texts), got "
                            f"{type(encoder).__name__}")
        source: Any = GivenPassages(encoder, emb_of) if encoder is not None else _NoEmbeddings()
    else:
        if passage_embeddings is not None:
            raise ValueError("passage_embeddings: only with passages= (a retriever supplies its own)")
        source = retriever
    pipe = _Connector(llm, config, retriever=source, prompts=prompts, answer=answer,
                      given=None if given is None else {q.id: g for q, g in zip(qs, given)},
                      unscored=frozenset(unscored))
    preds: list[Any] = [None] * len(qs)
    for kind in (MCQuestion, OpenQuestion):  # a mixed batch: each kind is its own batch, rejoined in order
        where = [i for i, q in enumerate(qs) if isinstance(q, kind)]
        if where:
            for i, pred in zip(where, pipe.run_batch([qs[i] for i in where])):
                preds[i] = pred
    if answer:  # the task's scoring writes the gold and, open domain, StringEM / exact match beside the answer
        from rcn_fast.eval.metrics import scored

        preds = [scored(q, pred) for q, pred in zip(qs, preds)]
    out = []
    for q, pred in zip(qs, preds):
        kept = pipe.kept.get(q.id, {})
        out.append(Connection(
            question_id=q.id, explanation=list(pred.knowledge), passages=list(pred.passages),
            subsets=kept.get("subsets", []), extractions=kept.get("extractions", []),
            queries=kept.get("queries", []), trace=pred.trace, cost=pred.cost,
            prediction=pred if answer else None,
        ))
    return out


__all__ = ["connect", "Connection", "GivenPassages", "as_question", "as_passage"]
