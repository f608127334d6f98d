"""The pipeline protocol, the stage runner and the staged pipeline base
(the prediction record, :class:`Prediction`, lives in
:mod:`rcn_fast.pipelines.records` and is re-exported here).

A pipeline is a sequence of stages (declared in its class's ``spec``,
:mod:`rcn_fast.pipelines.spec`). Each stage runs for the whole batch of
questions at once: one batched LLM call per stage (all rows of all
questions), one batched retrieval, one batched sampler call. Per question,
the runner records a trace of every prompt and output and the LLM cost.
"""

from __future__ import annotations

import copy
import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast._validate import check_choice
from rcn_fast.data import MCQuestion
from rcn_fast.pipelines.config import ANSWER_RENDERS
from rcn_fast.pipelines.records import RENAMED_FIELDS, Prediction, QuestionCost, upgrade_prediction
from rcn_fast.pipelines.spec import PipelineSpec, Stage
from rcn_fast.prompts import PromptSet, load_prompts
from rcn_fast.retrieval.types import Passage


@runtime_checkable
class Pipeline(Protocol):
    """What evaluation code calls."""

    name: str
    config: Any
    #: its declaration (a class attribute): needs, open answering, stages
    spec: PipelineSpec
    #: the stages it runs under its settings (Stage objects or names), for the progress bars
    stages: Sequence[Any]
    #: StageObserver objects told of each stage and the questions it finished
    observers: list[Any]

    def run_batch(self, questions: Sequence[MCQuestion]) -> list[Prediction]:
        """Predictions for ``questions``, in order."""
        ...

    def run(self, question: MCQuestion) -> Prediction:
        """The prediction for one question (a batch of one)."""
        ...


def question_key(question_id: str) -> int:
    """A stable 63-bit random-stream key of a question id (the sampler's
    ``keys``), so a question's subsets never depend on its batch."""
    return int.from_bytes(hashlib.blake2b(question_id.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def mc_questions(questions: Any) -> list[MCQuestion]:
    """``questions`` as a list, checked to hold MCQuestion objects (a single
    question is refused: batch first)."""
    if isinstance(questions, MCQuestion):
        raise TypeError("questions: expected a list of MCQuestion (batch first); use run() for one question")
    questions = list(questions)
    for i, q in enumerate(questions):
        if not isinstance(q, MCQuestion):
            raise TypeError(f"questions[{i}]: expected an MCQuestion, got {type(q).__name__}")
    return questions


def run_in_batches(questions: list[Any], batch_size: int | None, run_chunk: Callable[[list[Any]], list[Any]], *,
                   ids_key: str | None = "random streams") -> list[Any]:
    """``run_chunk`` over consecutive batches of ``batch_size`` questions
    (None: one batch), results concatenated. With ``ids_key`` (what the ids
    key, for the message) question ids must be distinct."""
    if ids_key is not None:
        seen: set[str] = set()
        for q in questions:
            if q.id in seen:
                raise ValueError(f"questions: duplicate question id {q.id!r} (ids key costs and {ids_key})")
            seen.add(q.id)
    bs = batch_size or max(len(questions), 1)
    out: list[Any] = []
    for s in range(0, len(questions), bs):
        out.extend(run_chunk(questions[s : s + bs]))
    return out


def answer_turn(chat: list[dict[str, str]], render: str = "prefill") -> list[dict[str, str]]:
    """The chat of a label-scoring pass with its answer turn ended by
    ``render`` (``answer_render``, see
    :class:`~rcn_fast.pipelines.config.PipelineConfig`): the final
    assistant turn (the answer prompt's pre-fill) without trailing white
    space (``Answer:``), then as it is (``"prefill"``), with one space
    (``"trailing_space"``: ``Answer: ``), or with one space rendered as a
    complete message and cut at the template's end-of-turn token
    (``"closed_turn"``, :data:`rcn_fast.llm.chat.CUT_END_OF_TURN`: the
    ReConnect authors' rule).

    Raises
    ------
    ValueError
        The chat does not end in an assistant turn (a scoring prompt needs
        a pre-filled answer turn), or an unknown ``render``.
    """
    from rcn_fast.llm.chat import CUT_END_OF_TURN

    check_choice(render, "answer_render", ANSWER_RENDERS)
    if not chat or chat[-1].get("role") != "assistant":
        raise ValueError("answer_render: the answer prompt needs a pre-filled assistant turn (its last turn)")
    text = chat[-1]["content"].rstrip()
    if render == "prefill":
        last = {"role": "assistant", "content": text}
    elif render == "trailing_space":
        last = {"role": "assistant", "content": text + " "}
    else:
        last = {"role": "assistant", "content": text + " ", "cut": CUT_END_OF_TURN}
    return [*chat[:-1], last]


@dataclass
class QuestionState:
    """Per-question working state while a batch moves through the stages
    (a pipeline's ``state_class`` adds its own typed fields)."""

    question: MCQuestion
    trace: list[dict[str, Any]] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    knowledge: list[str] = field(default_factory=list)
    generations: int = 0
    scoring_passes: int = 0
    #: what the answer stage gives (label log-probabilities, or an open
    #: question's ``(answer_text, output, meta)``); None when none ran
    result: Any = None

    @property
    def id(self) -> str:
        return self.question.id


def _tag_costs(llm: Any, ids: Sequence[str]) -> dict[str, tuple[int, int, int, int]]:
    tracker = getattr(llm, "cost", None)
    by_tag = getattr(tracker, "by_tag", None) or {}
    out = {}
    for i in ids:
        c = by_tag.get(i)
        out[i] = (0, 0, 0, 0) if c is None else (c.calls, c.prompt_tokens, c.generated_tokens, c.cached_calls)
    return out


@runtime_checkable
class StageObserver(Protocol):
    """Watches the stages of a :class:`StageRunner` (e.g. progress bars).

    A pipeline passes its ``observers`` list to every runner it creates;
    each LLM call of a stage (and each block run under
    :meth:`StageRunner.stage`) calls ``stage_start(stage)`` before and
    ``stage_done(stage, question_ids)`` after.
    """

    def stage_start(self, stage: str) -> None:
        ...

    def stage_done(self, stage: str, question_ids: Sequence[str]) -> None:
        ...


class StageRunner:
    """Runs one stage for a whole batch: a single LLM call per stage, and the
    one place that counts a batch's LLM cost.

    Parameters
    ----------
    llm : LLM
    prompts : PromptSet
    max_new_tokens, temperature, top_p, seed : decoding of generations.
    observers : sequence of StageObserver, optional
        Told when each stage starts and which questions it finished.
    pipeline : optional
        The pipeline the runner works for (``runner.pipeline`` in a
        :class:`~rcn_fast.pipelines.spec.Stage`'s ``run``).
    answer_render : {"prefill", "closed_turn", "trailing_space"}
        How the answer turn of every scoring pass ends (:func:`answer_turn`;
        the pipeline config's ``answer_render``).
    """

    def __init__(self, llm: Any, prompts: PromptSet, *, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, observers: Sequence[StageObserver] = (),
                 pipeline: Any = None, answer_render: str = "prefill") -> None:
        check_choice(answer_render, "answer_render", ANSWER_RENDERS)
        self.answer_render = answer_render
        self.llm = llm
        #: the pipeline whose stages this runner runs (what a Stage's run() reads: config, prompts, sources)
        self.pipeline = pipeline
        self.prompts = prompts
        self.gen_kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        self.llm_calls = 0  # batched LLM calls made by this runner (one per stage)
        self.observers = list(observers)
        self._before: dict[str, tuple[int, int, int, int]] = {}

    # ------------------------------------------------------------ batch and cost
    def start(self, questions: Sequence[Any], state_class: type[QuestionState] = QuestionState
              ) -> list[QuestionState]:
        """The working states of a batch (``state_class`` objects); reads the
        LLM's cost tracker so that :meth:`costs` gives what each question
        used from now on."""
        self._before = _tag_costs(self.llm, [q.id for q in questions])
        return [state_class(q) for q in questions]

    def costs(self, states: Sequence[QuestionState]) -> list[QuestionCost]:
        """Per question, the LLM usage since :meth:`start` (tracker counts by
        question id) and the rows the stages sent."""
        after = _tag_costs(self.llm, [st.id for st in states])
        out = []
        for st in states:
            b, a = self._before.get(st.id, (0, 0, 0, 0)), after[st.id]
            out.append(QuestionCost(
                llm_calls=a[0] - b[0], generations=st.generations, scoring_passes=st.scoring_passes,
                prompt_tokens=a[1] - b[1], generated_tokens=a[2] - b[2], cached_calls=a[3] - b[3],
            ))
        return out

    @contextmanager
    def stage(self, stage: str, states: Sequence[QuestionState]) -> Iterator[None]:
        """Report a block of work as ``stage`` for ``states`` to the observers."""
        for ob in self.observers:
            ob.stage_start(stage)
        yield
        ids = [st.id for st in states]
        for ob in self.observers:
            ob.stage_done(stage, ids)

    # ------------------------------------------------------------ LLM calls
    def _decoding(self, decoding: dict[str, Any] | None) -> dict[str, Any]:
        kwargs = dict(self.gen_kwargs)
        if decoding:
            unknown = set(decoding) - {"temperature", "top_p", "seed"}
            if unknown:
                raise ValueError(f"decoding: unknown key(s) {sorted(unknown)}; expected temperature, top_p, seed")
            kwargs.update(decoding)
        return kwargs

    def generate(self, stage: str, states: Sequence[QuestionState],
                 chats: Sequence[Sequence[list[dict[str, str]]]], *,
                 decoding: dict[str, Any] | None = None) -> list[list[str]]:
        """Generate for every chat of every question in one LLM call.

        Parameters
        ----------
        stage : str
            Stage name (recorded in the trace).
        states : the batch's question states, length B
        chats : per question, a list of chats (may be empty)
        decoding : dict, optional
            Overrides of the run's decoding for this call (keys among
            ``temperature``, ``top_p``, ``seed``); recorded in each trace
            entry as ``decoding``.

        Returns
        -------
        per question, the generated texts in the order of its chats
        """
        kwargs = self._decoding(decoding)
        flat, tags, owner = [], [], []
        for i, (st, cs) in enumerate(zip(states, chats)):
            for c in cs:
                flat.append(c)
                tags.append(st.id)
                owner.append(i)
        out: list[list[str]] = [[] for _ in states]
        if not flat:
            return out
        with self.stage(stage, states):
            res = self.llm.generate(flat, tags=tags, **kwargs)
            self.llm_calls += 1
        if len(res) != len(flat):
            raise RuntimeError(f"llm: generate returned {len(res)} rows for {len(flat)} chats")
        for chat, i, gens in zip(flat, owner, res):
            g = gens[0]
            out[i].append(g.text)
            states[i].generations += 1
            states[i].trace.append({
                "stage": stage, "type": "generate", "prompt": copy.deepcopy(chat), "output": g.text,
                "finish_reason": g.finish_reason, "prompt_tokens": g.prompt_tokens,
                "generated_tokens": g.generated_tokens,
            })
            if decoding:
                states[i].trace[-1]["decoding"] = dict(decoding)
        return out

    def sample(self, stage: str, states: Sequence[QuestionState], chats: Sequence[list[dict[str, str]]], *,
               num_samples: int, trace: Sequence[dict[str, Any]] | None = None) -> list[list[str]]:
        """``num_samples`` generations of one chat per question, in one LLM call.

        Each question gets one trace entry (``outputs``, ``finish_reasons``,
        ``num_samples``, summed ``generated_tokens``); ``trace[i]`` adds to
        (or, for ``stage``, overrides) question i's entry.

        Returns
        -------
        per question, its ``num_samples`` texts
        """
        if not states:
            return []
        with self.stage(stage, states):
            res = self.llm.generate(list(chats), max_new_tokens=self.gen_kwargs["max_new_tokens"],
                                    temperature=self.gen_kwargs["temperature"], top_p=self.gen_kwargs["top_p"],
                                    num_samples=num_samples, seed=self.gen_kwargs["seed"],
                                    tags=[st.id for st in states])
            self.llm_calls += 1
        if len(res) != len(chats):
            raise RuntimeError(f"llm: generate returned {len(res)} rows for {len(chats)} chats")
        out = []
        for i, (st, chat, gens) in enumerate(zip(states, chats, res)):
            if len(gens) != num_samples:
                raise RuntimeError(f"llm: generate returned {len(gens)} samples, expected num_samples={num_samples}")
            st.generations += 1
            st.trace.append({
                "stage": stage, "type": "generate", "prompt": copy.deepcopy(chat), **(trace[i] if trace else {}),
                "num_samples": num_samples, "outputs": [g.text for g in gens],
                "finish_reasons": [g.finish_reason for g in gens],
                "prompt_tokens": gens[0].prompt_tokens if gens else 0,
                "generated_tokens": sum(g.generated_tokens for g in gens),
            })
            out.append([g.text for g in gens])
        return out

    def score(self, stage: str, states: Sequence[QuestionState],
              chats: Sequence[list[dict[str, str]]]) -> list[list[float]]:
        """One scoring pass per question (one LLM call for the batch):
        log-probabilities over each question's labels."""
        return [r[0] for r in self.score_rows(stage, states, [[c] for c in chats])]

    def score_rows(self, stage: str, states: Sequence[QuestionState],
                   chats: Sequence[Sequence[list[dict[str, str]]]]) -> list[list[list[float]]]:
        """Scoring passes for every chat of every question (one LLM call for
        the batch) -> per question, per chat, log-probabilities over the
        question's labels. Each chat's answer turn ends by the runner's
        ``answer_render`` (:func:`answer_turn`): the one rule of every
        pipeline's answer."""
        flat, labels, tags, owner = [], [], [], []
        for i, (st, cs) in enumerate(zip(states, chats)):
            for c in cs:
                flat.append(answer_turn(c, self.answer_render))
                labels.append(list(st.question.labels))
                tags.append(st.id)
                owner.append(i)
        out: list[list[list[float]]] = [[] for _ in states]
        if not flat:
            return out
        with self.stage(stage, states):
            lp = np.asarray(self.llm.label_logprobs(flat, labels, tags=tags))
            self.llm_calls += 1
        if lp.shape[0] != len(flat):
            raise RuntimeError(f"llm: label_logprobs returned {lp.shape[0]} rows for {len(flat)} chats")
        for chat, labs, i, row in zip(flat, labels, owner, lp):
            vals = [float(x) for x in row[: len(labs)]]
            out[i].append(vals)
            states[i].scoring_passes += 1
            states[i].trace.append({"stage": stage, "type": "score", "prompt": copy.deepcopy(chat), "labels": labs,
                                    "logprobs": vals})
        return out


class Answer(Stage):
    """The answer stage of a declared stage list: the pipeline's
    :meth:`StagedPipeline.answer_stage` (one scoring pass per question:
    by default the labels after the answering prompt with the knowledge),
    or for a batch of open questions its ``open_answer_stage``."""

    name = "answer"
    reads = ("question", "knowledge")
    writes = ("result", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        pipe = runner.pipeline
        if states and not isinstance(states[0].question, MCQuestion):
            results = pipe.open_answer_stage(states, runner)
        else:
            results = pipe.answer_stage(states, runner)
        for st, r in zip(states, results):
            st.result = r


class StagedPipeline:
    """Base of the built-in pipelines: question checks, batching, prompts,
    cost bookkeeping, the answer stage. A subclass declares its ``spec``
    (:class:`~rcn_fast.pipelines.spec.PipelineSpec`) and either lists its
    stage objects there (run in order over ``state_class`` states: vanilla,
    single retrieval, ZEBRA, ReConnect) or implements
    :meth:`knowledge_stages`, which fills ``state.knowledge`` (and
    ``state.passages``) for a whole batch before :meth:`answer_stage`."""

    name = ""
    config_class: type = object
    #: What the class is, declared once (:class:`~rcn_fast.pipelines.spec.PipelineSpec`):
    #: what it needs, whether it answers open questions, its stages. The
    #: eval command reads only this (never a pipeline's name).
    spec: ClassVar[PipelineSpec] = PipelineSpec()
    #: The per-question state its stages read and write.
    state_class: ClassVar[type[QuestionState]] = QuestionState

    @property
    def does_retrieve(self) -> bool:
        """Whether this pipeline, under its settings, retrieves (the one
        answer to "does it retrieve?": its spec's ``retrieves``; a pipeline
        with ``"optional_corpus"`` says per settings)."""
        return self.spec.retrieves != "none"

    def __init__(self, llm: Any, config: Any = None, *, retriever: Any = None, prompts: Any = None) -> None:
        from rcn_fast.llm.base import LLM

        if not isinstance(llm, LLM):
            raise TypeError(
                f"llm: expected an object with generate(), label_logprobs(), identity and cost "
                f"(the rcn_fast.llm.LLM protocol), got {type(llm).__name__}; load one with rcn_fast.llm.load_llm"
            )
        if config is None:
            config = self.config_class()
        if not isinstance(config, self.config_class):
            raise TypeError(f"config: expected {self.config_class.__name__}, got {type(config).__name__}")
        self.llm = llm
        self.config = config
        self.prompts = load_prompts(prompts if prompts is not None else config.prompts)
        self.retriever = retriever
        #: StageObserver objects every runner of this pipeline reports its stages to (e.g. progress bars)
        self.observers: list[StageObserver] = []
        if self.spec.requires_retriever and retriever is None:
            raise TypeError(f"retriever: the {self.name!r} pipeline needs a retriever, got None")
        #: the stage objects this pipeline runs, in order (see :meth:`declared_stages`); none when the
        #: class overrides :meth:`knowledge_stages` (it then runs that and its answer stage, as it always did)
        own = type(self).knowledge_stages is StagedPipeline.knowledge_stages
        self.stages: list[Stage] = list(self.declared_stages()) if own else []

    # ------------------------------------------------------------ public API
    def describe(self) -> dict[str, Any]:
        """What produced the predictions (record it with every result)."""
        from rcn_fast.pipelines.config import config_to_dict

        return {
            "pipeline": self.name,
            "config": config_to_dict(self.config),
            "llm": getattr(self.llm, "identity", type(self.llm).__name__),
            "prompts": self.prompts.source,
            "retriever": None if self.retriever is None else type(self.retriever).__name__,
        }

    def run(self, question: MCQuestion) -> Prediction:
        """The prediction for one question."""
        if not isinstance(question, MCQuestion):
            raise TypeError(f"question: expected an MCQuestion, got {type(question).__name__}")
        return self.run_batch([question])[0]

    def run_batch(self, questions: Sequence[MCQuestion]) -> list[Prediction]:
        """Predictions for a list of questions, stage by stage over each batch.

        Parameters
        ----------
        questions : sequence of MCQuestion
            Ids must be distinct (they key costs and random streams).

        Returns
        -------
        list of Prediction, in the order of ``questions``
        """
        return run_in_batches(mc_questions(questions), self.config.batch_size, self._run_chunk)

    # ------------------------------------------------------------ internals
    def declared_stages(self) -> Sequence[Stage]:
        """The stage objects of this pipeline under its settings: its spec's
        (a subclass edits the list per setting, e.g. ReConnect's ablations)."""
        return [s for s in self.spec.stages if isinstance(s, Stage)]

    def runner(self) -> StageRunner:
        """A stage runner with the run's decoding, reporting to :attr:`observers`."""
        c = self.config
        return StageRunner(self.llm, self.prompts, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                           top_p=c.top_p, seed=c.seed, observers=self.observers, pipeline=self,
                           answer_render=getattr(c, "answer_render", "prefill"))

    def run_stages(self, questions: list[Any],
                   final_stage: Callable[[list[QuestionState], StageRunner], Sequence[Any]]
                   ) -> list[tuple[QuestionState, Any, QuestionCost]]:
        """One batch through the stages -> per question (state, its final
        result, its cost). With declared :attr:`stages`: each stage's
        ``run`` in order, the result being what the answer stage left in
        ``state.result`` (each LLM call of a stage reports it to the
        observers); otherwise :meth:`knowledge_stages`, then ``final_stage``
        (the answer)."""
        if not questions:
            return []
        runner = self.runner()
        states = runner.start(questions, self.state_class)
        if self.stages:
            for stage in self.stages:
                stage.run(states, runner)
            results: Sequence[Any] = [st.result for st in states]
        else:
            self.knowledge_stages(states, runner)
            results = final_stage(states, runner)
        return list(zip(states, results, runner.costs(states)))

    def _run_chunk(self, questions: list[MCQuestion]) -> list[Prediction]:
        return [self.prediction(st, lp if lp is not None else [], cost)
                for st, lp, cost in self.run_stages(questions, self.answer_stage)]

    def prediction(self, st: QuestionState, lp: list[float], cost: QuestionCost) -> Prediction:
        """The record of one question: the argmax of ``lp`` (first on ties)."""
        q = st.question
        pred = int(np.argmax(np.asarray(lp, dtype=np.float64))) if lp else 0
        return Prediction(
            question_id=q.id, pred=pred, pred_label=q.labels[pred], choice_logprobs=lp,
            knowledge=list(st.knowledge), passages=list(st.passages), trace=st.trace, cost=cost,
            gold=q.answer, gold_label=q.answer_label,
        )

    def knowledge_stages(self, states: list[QuestionState], runner: StageRunner) -> None:
        """Fill ``state.knowledge`` for every question (default: none). A
        class that overrides it runs it, then :meth:`answer_stage`, instead
        of its declared stages."""

    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """Score the labels after the answering prompt with the knowledge
        (one pass per question)."""
        P = self.prompts
        chats = [P.chat("answer_with_knowledge", st.question, knowledge=P.format_list(st.knowledge)) for st in states]
        return runner.score("answer", states, chats)


__all__ = ["Prediction", "QuestionCost", "upgrade_prediction", "RENAMED_FIELDS", "Pipeline", "StagedPipeline", "StageRunner", "StageObserver", "QuestionState",
           "Answer", "answer_turn",
           "question_key", "run_in_batches", "mc_questions"]
