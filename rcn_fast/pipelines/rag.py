"""Shared machinery of ActiveRAG and its RAG baselines: two modes, one flow.

Every pipeline of this family first runs its own generation stages (each one
batched: one LLM call for all rows of all questions) and ends with a
*final* item per question, either

* ``"passages"``: a list of texts to answer from (vanilla RAG, Self-Refine's
  summary, Self-Rerank's kept passages), or
* ``"reasoning"``: one or more generated reasonings that end in an answer
  (CoT, Chain-of-Note, Guideline, ActiveRAG's cognitive nexus, one per agent).

Then, by the kind of questions given to ``run_batch``:

* multiple choice (:class:`~rcn_fast.data.MCQuestion`): one scoring pass
  (``label_logprobs`` at the ``Answer:`` pre-fill, its end the shared
  ``answer_render``) per final item, so every pipeline is scored the same way; several items (ActiveRAG ``agent="all"``)
  are combined by :func:`combine_choice_logprobs`. Result: :class:`Prediction`.
* open domain (:class:`~rcn_fast.data.OpenQuestion`): the answer is
  generated. ``"passages"`` items get one answer generation
  (``rag_answer_open``); ``"reasoning"`` items already hold their answer.
  The answer text is the whole generation by default (the config's
  ``answer_extraction="full"``: the ActiveRAG paper's StringEM tests the
  gold aliases against the whole output) or its ``Answer:`` line
  (``"final"``), see :func:`extract_answer`; several items are combined by
  :func:`vote_answers` over their ``Answer:`` lines. Result:
  :class:`OpenPrediction`.

The pipelines never see gold answers nor compute a metric: the task scores
a prediction (:mod:`rcn_fast.eval.metrics`: StringEM beside exact match for
open questions, accuracy for choices; ``scored(question, prediction)``
fills those fields in for a library user's own labelled questions).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast.data import MCQuestion
from rcn_fast.data.open_domain import OpenQuestion, normalize_answer
from rcn_fast.pipelines.base import QuestionCost, QuestionState, StagedPipeline, StageRunner, run_in_batches
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever, passage_refs, retrieve_batch
from rcn_fast.pipelines.simple import QUERY_MODES, question_query
from rcn_fast.pipelines.spec import PipelineSpec
from rcn_fast.retrieval.types import Passage


#: What open-domain answers are read from: the whole generation, or its final ``Answer:`` line.
ANSWER_EXTRACTIONS = ("final", "full")


# ------------------------------------------------------------------ settings
@dataclass
class RAGConfig(PipelineConfig):
    """Settings shared by ActiveRAG and its RAG baselines (not a pipeline itself).

    Attributes
    ----------
    top_k : int
        Passages retrieved per question (ActiveRAG paper: 5, also 10).
    query : {"question", "question_choices"}
        Retrieval query of a multiple-choice question: its text, or text
        followed by its options (open-domain questions use their text).
    passage_format : str
        How each passage is written into a prompt's ``{passages}`` list;
        placeholders ``{index}`` (1-based; Self-Rerank's labels refer to it)
        and ``{text}``.
    answer_extraction : {"full", "final"}
        Open-domain mode: what StringEM and exact match are computed on.
        ``"full"`` (default, the paper's metric: its code tests the gold
        aliases against the whole final output) -- the whole generation;
        ``"final"`` -- the text after its last ``Answer:`` marker up to the
        end of that line (the first non-empty line when there is no
        marker). ActiveRAG ``agent="all"`` votes on the ``"final"`` answers
        either way (whole outputs rarely agree word for word) and reports
        the winner's text in this mode.
    """

    name: ClassVar[str] = ""
    top_k: int = 5
    query: str = "question"
    passage_format: str = "Passage {index}: {text}"
    answer_extraction: str = "full"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_k, "top_k")
        check_choice(self.query, "query", QUERY_MODES)
        if not isinstance(self.passage_format, str):
            raise TypeError(f"passage_format: expected a string, got {type(self.passage_format).__name__}")
        try:
            self.passage_format.format(index=1, text="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"passage_format: only {{index}} and {{text}} may be used ({exc!r})") from None
        check_choice(self.answer_extraction, "answer_extraction", ANSWER_EXTRACTIONS)


# ------------------------------------------------------------------ records
@dataclass
class OpenPrediction:
    """The answer of a pipeline to one open-domain question.

    Attributes
    ----------
    question_id : str
    answer_text : str
        The answer (the generation, whole or its ``Answer:`` line by the
        config's ``answer_extraction``; the vote winner's for ActiveRAG
        ``"all"``).
    answers : list of str
        The gold aliases of the question: filled in by the task's scoring
        (:meth:`rcn_fast.eval.metrics.Task.record_prediction`), empty from a
        pipeline.
    string_em : bool or None
        ActiveRAG's StringEM of ``answer_text``: filled in by the task's
        scoring (None from a pipeline, and without gold aliases).
    exact_match : bool or None
        Normalised exact match of ``answer_text``: filled in by the task's
        scoring (None from a pipeline, and without gold aliases).
    knowledge : list of str
        What the answer was produced from (passages or reasonings).
    passages : list of Passage
        The passages retrieved for the question.
    trace : list of dict
        One entry per stage and row (as in :class:`Prediction`).
    cost : QuestionCost
    output : str
        The full generation the answer was read from.
    meta : dict
        Extra results, e.g. ``meta["agents"]`` for ActiveRAG ``"all"``
        (each agent's ``answer_text``; its ``string_em`` / ``exact_match``
        once the task has scored it).
    """

    question_id: str
    answer_text: str
    answers: list[str] = field(default_factory=list)
    string_em: bool | None = None
    exact_match: bool | None = None
    knowledge: list[str] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    cost: QuestionCost = field(default_factory=QuestionCost)
    output: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "question_id": self.question_id,
            "answer_text": self.answer_text,
            "answers": list(self.answers),
            "string_em": self.string_em,
            "exact_match": self.exact_match,
            "knowledge": list(self.knowledge),
            "passages": [p.to_dict() for p in self.passages],
            "trace": copy.deepcopy(self.trace),
            "cost": self.cost.to_dict(),
            "output": self.output,
            "meta": copy.deepcopy(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpenPrediction":
        return cls(
            question_id=d["question_id"], answer_text=d["answer_text"], answers=list(d.get("answers", [])),
            string_em=d.get("string_em"), exact_match=d.get("exact_match"), knowledge=list(d.get("knowledge", [])),
            passages=[Passage.from_dict(p) for p in d.get("passages", [])], trace=list(d.get("trace", [])),
            cost=QuestionCost(**d.get("cost", {})), output=d.get("output", ""), meta=dict(d.get("meta", {})),
        )


# ------------------------------------------------------------------ helpers
_MARKER = re.compile(r"answer\s*[:\uff1a]", re.I)


def extract_answer(text: str, mode: str = "final") -> str:
    """The answer part of a generation.

    Parameters
    ----------
    text : str
        A generation (without its pre-fill).
    mode : {"final", "full"}
        ``"final"``: the text after the last ``Answer:`` marker (case-
        insensitive) up to the end of its line, or the first non-empty line
        after it; when there is no marker (or nothing follows it), the first
        non-empty line of ``text``. ``"full"``: the whole text, stripped.

    Returns
    -------
    str

    Examples
    --------
    >>> extract_answer("Paris is the capital.\\nAnswer: Paris")
    'Paris'
    >>> extract_answer("Nantes, France\\nmore words")
    'Nantes, France'
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    if mode == "full":
        return text.strip()
    if mode != "final":
        raise ValueError(f"mode: expected 'final' or 'full', got {mode!r}")
    marks = list(_MARKER.finditer(text))
    if marks:
        for line in text[marks[-1].end():].splitlines():
            if line.strip():
                return line.strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def combine_choice_logprobs(rows: Sequence[Sequence[float]]) -> list[float]:
    """Oracle-free combination of several answer distributions: the log of
    the mean of the per-row choice probabilities.

    Parameters
    ----------
    rows : sequence of R rows of C log-probabilities (each a log-softmax
        over the same C labels), R >= 1

    Returns
    -------
    list of C float: ``log(mean_r exp(rows[r]))``, again a log-distribution.
    """
    a = np.asarray(rows, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"rows: expected a non-empty [R, C] array of log-probabilities, got shape {a.shape}")
    m = a.max(axis=0)
    out = m + np.log(np.mean(np.exp(a - m), axis=0))
    return [float(x) for x in out]


def vote_answers(answers: Sequence[str]) -> int:
    """Index of the majority answer among several generated answers.

    Answers are compared after :func:`~rcn_fast.data.normalize_answer`;
    answers that normalise to nothing get no vote (unless all do). Ties go
    to the group whose first member comes first (ActiveRAG ``"all"`` lists
    associate first, the paper's main agent).

    Returns
    -------
    int : index into ``answers`` of the first member of the winning group.
    """
    answers = list(answers)
    if not answers:
        raise ValueError("answers: expected at least one answer")
    keys = [normalize_answer(a) for a in answers]
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        if not k:
            continue
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, i)
    if not counts:
        return 0
    best = max(counts, key=lambda k: (counts[k], -first[k]))
    return first[best]


def format_passages(texts: Sequence[str], fmt: str) -> str:
    """Passages as prompt lines (``fmt`` with ``{index}`` 1-based and
    ``{text}``); ``"(none)"`` when there are none."""
    texts = [" ".join(str(t).split()) for t in texts]
    if not texts:
        return "(none)"
    return "\n".join(fmt.format(index=i + 1, text=t) for i, t in enumerate(texts))


class OpenView:
    """An open question seen by the prompt renderer: no options."""

    def __init__(self, q: OpenQuestion) -> None:
        self.id = q.id
        self.question = q.question
        self.choices: list[str] = []
        self.labels: list[str] = []


class OpenAnswering(StagedPipeline):
    """Base of the pipelines that answer open questions too (ActiveRAG and
    its baselines, ReConnect): ``run_batch`` takes all-MCQuestion batches
    (-> :class:`Prediction`) or all-OpenQuestion ones: the same
    :meth:`knowledge_stages`, then :meth:`open_answer_stage`, which gives
    per question ``(answer_text, output, meta)`` (-> :class:`OpenPrediction`).
    """

    #: what question ids key besides costs (for the duplicate-id message)
    open_ids_key = "random streams"
    spec = PipelineSpec(answers_open=True)

    def open_answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[tuple[str, str, dict]]:
        raise NotImplementedError

    @property
    def generations_per_question(self) -> int:
        """Generations one multiple-choice question costs under these settings."""
        raise NotImplementedError

    @property
    def open_generations_per_question(self) -> int:
        """Generations (the only LLM calls) one open question costs."""
        raise NotImplementedError

    @property
    def scoring_passes_per_question(self) -> int:
        """Answer-scoring passes one multiple-choice question costs."""
        raise NotImplementedError

    def calls_per_question(self) -> dict[str, dict[str, int]]:
        """The LLM calls one question costs under these settings, by kind of question."""
        return {"multiple_choice": {"generations": self.generations_per_question,
                                    "scoring_passes": self.scoring_passes_per_question},
                "open_domain": {"generations": self.open_generations_per_question, "scoring_passes": 0}}

    def describe(self) -> dict[str, Any]:
        """What produced the predictions, with the LLM calls one question
        costs under these settings (``calls_per_question``)."""
        d = super().describe()
        d["calls_per_question"] = self.calls_per_question()
        return d

    # ------------------------------------------------------------ public API
    def run(self, question: Any) -> Any:
        """The prediction for one question (:class:`Prediction` for an
        MCQuestion, :class:`OpenPrediction` for an OpenQuestion)."""
        if isinstance(question, OpenQuestion):
            return self.run_batch([question])[0]
        return super().run(question)

    def run_batch(self, questions: Sequence[Any]) -> list[Any]:
        """Predictions for a list of questions, all multiple choice
        (-> :class:`Prediction`) or all open domain (-> :class:`OpenPrediction`).

        Parameters
        ----------
        questions : sequence of MCQuestion, or sequence of OpenQuestion
            Ids must be distinct.

        Returns
        -------
        list, in the order of ``questions``
        """
        if isinstance(questions, (MCQuestion, OpenQuestion)):
            raise TypeError("questions: expected a list of questions (batch first); use run() for one question")
        questions = list(questions)
        n_open = sum(isinstance(q, OpenQuestion) for q in questions)
        if n_open == 0:
            return super().run_batch(questions)
        if n_open != len(questions):
            raise TypeError("questions: expected all MCQuestion or all OpenQuestion, got a mix")
        return run_in_batches(questions, self.config.batch_size, self._run_open_chunk, ids_key=self.open_ids_key)

    def _run_open_chunk(self, questions: list[OpenQuestion]) -> list[OpenPrediction]:
        preds = []
        for st, res, cost in self.run_stages(questions, self.open_answer_stage):
            ans, output, meta = res if res is not None else ("", "", {})
            preds.append(OpenPrediction(
                question_id=st.question.id, answer_text=ans, knowledge=list(st.knowledge), passages=list(st.passages), trace=st.trace, cost=cost,
                output=output, meta=meta,
            ))
        return preds


# ------------------------------------------------------------------ base class
@dataclass
class RAGState(QuestionState):
    """One question in ActiveRAG or a RAG baseline: ``final``, what the
    answer reads: ``("passages", [texts])`` or ``("reasoning", [(name, text), ...])``."""

    final: tuple[str, list[Any]] | None = None


class RAGPipeline(OpenAnswering):
    """Base of ActiveRAG and its RAG baselines (see the module docstring).

    Subclasses declare their stages (``spec``), the last before the answer
    setting ``state.final`` (:class:`RAGState`) to ``("passages", [texts])``
    or ``("reasoning", [(name, text), ...])``.
    """

    spec = PipelineSpec(retrieves="optional_corpus", answers_open=True)  # the corpus is used when does_retrieve
    state_class = RAGState
    open_ids_key = "the call cache"
    #: The LLM calls of one question, declared by each pipeline class:
    #: generations (multiple choice), generations (open domain; None = the
    #: same), scoring passes (multiple choice).
    generations: ClassVar[int] = 0
    open_generations: ClassVar[int | None] = None
    scoring_passes: ClassVar[int] = 1

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        super().__init__(llm, config, retriever=retriever, prompts=prompts)
        self.source = None
        if self.does_retrieve:
            if retriever is None:
                raise TypeError(f"retriever: the {self.name!r} pipeline needs a retriever, got None")
            self.source = as_embedding_retriever(retriever)

    @property
    def does_retrieve(self) -> bool:
        """Whether this pipeline retrieves under its settings (default: yes)."""
        return True

    @property
    def generations_per_question(self) -> int:
        return self.generations

    @property
    def open_generations_per_question(self) -> int:
        return self.generations_per_question if self.open_generations is None else self.open_generations

    @property
    def scoring_passes_per_question(self) -> int:
        return self.scoring_passes

    # ------------------------------------------------------------ helpers
    @staticmethod
    def is_open(st: QuestionState) -> bool:
        return isinstance(st.question, OpenQuestion)

    def chat(self, stage: str, st: QuestionState, **extra: Any) -> list[dict[str, str]]:
        """Render ``stage`` for one question (open questions have no options;
        trailing white space of their system/user turns is removed)."""
        if self.is_open(st):
            turns = self.prompts.chat(stage, OpenView(st.question), **extra)
            for i, t in enumerate(turns):
                if t["role"] != "assistant" or i < len(turns) - 1:
                    t["content"] = t["content"].rstrip()
            return turns
        return self.prompts.chat(stage, st.question, **extra)

    def passages_text(self, texts: Sequence[str]) -> str:
        return format_passages(texts, self.config.passage_format)

    def retrieve(self, states: list[QuestionState]) -> None:
        """One batched retrieval: top ``top_k`` passages per question."""
        queries = [st.question.question if self.is_open(st) else question_query(st.question, self.config.query)
                   for st in states]
        results, _ = retrieve_batch(self.source, queries, self.config.top_k)
        for st, q, res in zip(states, queries, results):
            st.passages = list(res)
            st.trace.append({"stage": "retrieval", "type": "retrieve", "queries": [q],
                             "results": [[p.id for p in res]], "scores": [[float(p.score) for p in res]],
                             "passages": passage_refs(res)})

    @staticmethod
    def _name_rows(states: list[QuestionState], rows: Sequence[Sequence[tuple[str | None, Any]]]) -> None:
        """Give the last trace entries of each question their row's name as ``agent``."""
        for st, r in zip(states, rows):
            entries = st.trace[len(st.trace) - len(r):] if r else []
            for (name, _), e in zip(r, entries):
                if name is not None:
                    e["agent"] = name

    def generate_rows(self, stage: str, states: list[QuestionState], runner: StageRunner,
                      rows: Sequence[Sequence[tuple[str | None, list[dict[str, str]]]]]) -> list[list[str]]:
        """One LLM call for every (name, chat) row of every question; the
        trace entries get ``name`` as their ``agent`` when it is not None."""
        outs = runner.generate(stage, states, [[c for _, c in r] for r in rows])
        self._name_rows(states, rows)
        return outs

    def generate_with_passages(self, stage: str, states: list[QuestionState], runner: StageRunner, *,
                               prompt: str | None = None) -> list[str]:
        """Retrieve (:meth:`retrieve`), then one generation per question with
        its passages in the ``prompt`` stage's template (default ``stage``),
        traced as ``stage``: one LLM call for the batch -> per question, the
        generation."""
        self.retrieve(states)
        rows = [[(None, self.chat(prompt or stage, st, passages=self.passages_text([p.text for p in st.passages])))]
                for st in states]
        return [o[0] for o in self.generate_rows(stage, states, runner, rows)]

    def score_rows(self, stage: str, states: list[QuestionState], runner: StageRunner,
                   rows: Sequence[Sequence[tuple[str | None, list[dict[str, str]]]]]) -> list[list[list[float]]]:
        """One ``label_logprobs`` call for every (name, chat) row of every
        (multiple-choice) question -> per question, per row, log-probs."""
        out = runner.score_rows(stage, states, [[c for _, c in r] for r in rows])
        self._name_rows(states, rows)
        return out

    # ------------------------------------------------------------ the answer
    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """Multiple choice: one scoring pass per final item (one LLM call for
        the batch); several items are combined (:func:`combine_choice_logprobs`)."""
        rows = []
        for st in states:
            kind, items = st.final
            if kind == "passages":
                st.knowledge = list(items)
                rows.append([(None, self.chat("rag_answer", st, passages=self.passages_text(items)))])
            else:
                st.knowledge = [t for _, t in items]
                rows.append([(name, self.chat("rag_answer_reasoning", st, reasoning=text.strip()))
                             for name, text in items])
        scores = self.score_rows("answer", states, runner, rows)
        out = []
        for st, r, sc in zip(states, rows, scores):
            if len(sc) == 1:
                out.append(sc[0])
                continue
            comb = combine_choice_logprobs(sc)
            labels = list(st.question.labels)
            st.trace.append({
                "stage": "combination", "type": "combine", "method": "mean_probability",
                "agents": [{"agent": name, "pred": int(np.argmax(s)), "pred_label": labels[int(np.argmax(s))],
                            "choice_logprobs": s} for (name, _), s in zip(r, sc)],
                "choice_logprobs": comb,
            })
            out.append(comb)
        return out

    def open_answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[tuple[str, str, dict]]:
        """Open domain: per question (answer_text, output, meta)."""
        mode = self.config.answer_extraction
        need = [i for i, st in enumerate(states) if st.final[0] == "passages"]
        gen: dict[int, str] = {}
        if need:
            sub = [states[i] for i in need]
            chats = [[self.chat("rag_answer_open", st, passages=self.passages_text(st.final[1]))]
                     for st in sub]
            outs = runner.generate("answer", sub, chats)
            gen = {i: o[0] for i, o in zip(need, outs)}
        res = []
        for i, st in enumerate(states):
            kind, items = st.final
            if kind == "passages":
                st.knowledge = list(items)
                text = gen[i]
                ans = extract_answer(text, mode)
                st.trace[-1]["answer"] = ans
                res.append((ans, text, {}))
                continue
            st.knowledge = [t for _, t in items]
            answers = [extract_answer(t, mode) for _, t in items]
            if len(items) == 1:
                res.append((answers[0], items[0][1], {}))
                continue
            # the vote compares the short "Answer:" lines (whole outputs rarely agree word for word)
            short = [extract_answer(t, "final") for _, t in items]
            win = vote_answers(short)
            agents = {name: {"answer_text": a} for (name, _), a in zip(items, answers)}  # the task scores them
            st.trace.append({"stage": "combination", "type": "combine", "method": "vote",
                             "answers": {name: a for (name, _), a in zip(items, short)},
                             "winner": items[win][0], "answer": answers[win]})
            res.append((answers[win], items[win][1], {"agents": agents, "winner": items[win][0]}))
        return res


def agent_results(prediction: Any) -> dict[str, Any]:
    """Per-agent results of an ActiveRAG ``agent="all"`` prediction.

    Returns
    -------
    dict : agent -> ``{"pred", "pred_label", "choice_logprobs"}`` (multiple
    choice, read from the trace's ``combination`` entry) or
    ``{"answer_text"}`` (open domain; with ``"string_em"`` and
    ``"exact_match"`` once scored by the task,
    :func:`rcn_fast.eval.metrics.scored`); empty for a single-agent
    prediction.
    """
    if isinstance(prediction, OpenPrediction):
        return dict(prediction.meta.get("agents", {}))
    for e in prediction.trace:
        if e.get("type") == "combine":
            return {a["agent"]: {k: v for k, v in a.items() if k != "agent"} for a in e["agents"]}
    return {}


__all__ = [
    "OpenPrediction", "OpenAnswering", "RAGPipeline", "RAGState", "extract_answer", "combine_choice_logprobs",
    "vote_answers",
    "format_passages", "agent_results", "RAGConfig", "ANSWER_EXTRACTIONS", "OpenView",
]
