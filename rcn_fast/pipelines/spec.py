"""What a pipeline is, declared once: :class:`PipelineSpec` (what it needs,
whether it answers open questions, its stages) and :class:`Stage` (one
step of a batch: its name, the state fields it reads and writes, its LLM
calls per question and a batch ``run``).

Every pipeline class carries one frozen ``spec``; the evaluation reads
nothing else about a class (:mod:`rcn_fast.eval.pipeline_needs`). A
pipeline whose class lists stage objects runs them in order
(:meth:`rcn_fast.pipelines.base.StagedPipeline.run_stages`); the progress
bars, the cost accounting and the trace follow that list.

Examples
--------
A stage is one class; a pipeline is a list of stages:

>>> class Shout(Stage):                                               # doctest: +SKIP
...     name, reads, writes = "shout", ("knowledge",), ("knowledge",)
...     def run(self, states, runner):
...         for st in states:
...             st.knowledge = [k.upper() for k in st.knowledge]
>>> class Loud(ReConnect):                                            # doctest: +SKIP
...     name = "loud"
...     spec = ReConnect.spec.with_stages(insert_stage(ReConnect.spec.stages, Shout(), before="answer"))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

if TYPE_CHECKING:
    from rcn_fast.pipelines.base import QuestionState, StageRunner

#: What a pipeline may retrieve from: nothing, a passage corpus it requires,
#: a passage corpus used when its settings retrieve, an example knowledge base.
RETRIEVES = ("none", "corpus", "optional_corpus", "example_kb")


class Stage:
    """One step of a pipeline, run for a whole batch at once.

    Subclasses set ``name`` (its trace and progress-bar name), ``reads``
    and ``writes`` (the fields of the pipeline's state class it uses:
    documentation a test checks against the state class) and implement
    :meth:`run`; :meth:`llm_calls_per_question` gives its cost under a
    config (0 for retrieval and sampling).
    """

    name: ClassVar[str] = ""
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[tuple[str, ...]] = ()

    def llm_calls_per_question(self, config: Any) -> int:
        """LLM calls (generations plus scoring passes) one multiple-choice
        question costs in this stage under ``config``."""
        return 0

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        """Run the stage for ``states`` (the batch); ``runner.pipeline`` is
        the pipeline (its config, prompts and sources)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


@dataclass(frozen=True)
class PipelineSpec:
    """What a pipeline class is, declared once (its ``spec``).

    Attributes
    ----------
    needs_llm : bool
        False for a trained pipeline (no LLM is loaded for it).
    retrieves : {"none", "corpus", "optional_corpus", "example_kb"}
        What it retrieves from: nothing; a passage corpus (required); a
        passage corpus used when its settings retrieve; an example
        knowledge base (``--kb``).
    answers_open : bool
        Whether it answers OpenQuestion too.
    stages : tuple of Stage or str
        Its stages in order: Stage objects the pipeline runs, or (for a
        pipeline that runs its own steps) their names. The progress bars
        are drawn from these names.
    usage_note : str or None
        A line for ``--list-pipelines`` (default: from ``retrieves``).
    components : tuple of str
        Keyword arguments of the class besides llm/retriever/prompts
        (objects, not settings: e.g. RR's ``nli``).
    check_config : callable or None
        ``check_config(config)``, called while planning an evaluation,
        before anything loads; raises ValueError/OSError on a bad setting.
    result_key : callable or None
        ``result_key(config) -> dict``: what determines the answers
        besides the config (joins the checkpoint key).
    scores_choices : bool
        Whether its multiple-choice predictions carry one log-prob per
        choice (every built-in pipeline's do: the answer is their argmax).
        A checkpoint record of such a pipeline with empty
        ``choice_logprobs`` is refused as a contradicting one is; a
        pipeline that gives no scores declares False.
    """

    needs_llm: bool = True
    retrieves: str = "none"
    answers_open: bool = False
    stages: tuple[Any, ...] = ()
    usage_note: str | None = None
    components: tuple[str, ...] = ()
    check_config: Callable[[Any], None] | None = field(default=None, compare=False)
    result_key: Callable[[Any], dict[str, Any]] | None = field(default=None, compare=False)
    scores_choices: bool = True

    def __post_init__(self) -> None:
        if self.retrieves not in RETRIEVES:
            raise ValueError(f"retrieves: expected one of {list(RETRIEVES)}, got {self.retrieves!r}")
        for f in ("needs_llm", "answers_open", "scores_choices"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{f}: expected a bool, got {getattr(self, f)!r}")
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "components", tuple(self.components))
        for i, s in enumerate(self.stages):
            if not isinstance(s, (Stage, str)) or not (s if isinstance(s, str) else s.name):
                raise TypeError(f"stages[{i}]: expected a named Stage object or a stage name, got {s!r}")
        if self.usage_note is not None and not isinstance(self.usage_note, str):
            raise TypeError(f"usage_note: expected a str or None, got {type(self.usage_note).__name__}")

    @property
    def requires_retriever(self) -> bool:
        """Whether construction requires a retriever (``corpus`` or ``example_kb``)."""
        return self.retrieves in ("corpus", "example_kb")

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s if isinstance(s, str) else s.name for s in self.stages)

    def with_stages(self, stages: Sequence[Any]) -> "PipelineSpec":
        """This spec with another stage list (a new pipeline from an old one)."""
        return replace(self, stages=tuple(stages))


def stage_names(stages: Sequence[Any]) -> list[str]:
    """The names of a stage list (Stage objects or names)."""
    return [s if isinstance(s, str) else s.name for s in stages]


def llm_stage_names(stages: Sequence[Any], config: Any) -> list[str]:
    """The names of the stages of a list that call the LLM under ``config``
    (those the observers hear of; a stage given by name counts)."""
    return [s if isinstance(s, str) else s.name for s in stages
            if isinstance(s, str) or s.llm_calls_per_question(config) > 0]


def _index(stages: Sequence[Stage], name: str, arg: str) -> int:
    names = stage_names(stages)
    if name not in names:
        raise ValueError(f"{arg}: no stage named {name!r}; stages: {names}")
    return names.index(name)


def insert_stage(stages: Sequence[Stage], stage: Stage, *, before: str | None = None,
                 after: str | None = None) -> tuple[Stage, ...]:
    """``stages`` with ``stage`` inserted before or after the stage named
    ``before`` / ``after`` (exactly one of them)."""
    if (before is None) == (after is None):
        raise ValueError("before, after: give exactly one stage name")
    out = list(stages)
    if before is not None:
        i = _index(out, before, "before")
    else:
        i = _index(out, str(after), "after") + 1
    out.insert(i, stage)
    return tuple(out)


def remove_stages(stages: Sequence[Stage], *names: str) -> tuple[Stage, ...]:
    """``stages`` without the stages named ``names`` (each must be there)."""
    for n in names:
        _index(stages, n, "names")
    return tuple(s for s in stages if s.name not in names)


def replace_stage(stages: Sequence[Stage], name: str, stage: Stage) -> tuple[Stage, ...]:
    """``stages`` with the stage named ``name`` swapped for ``stage``."""
    i = _index(stages, name, "name")
    out = list(stages)
    out[i] = stage
    return tuple(out)


__all__ = ["PipelineSpec", "Stage", "RETRIEVES", "stage_names", "llm_stage_names", "insert_stage", "remove_stages",
           "replace_stage"]
