"""What the evaluation asks of a pipeline class: the registry, the config
class of a name, and the class's one declaration (:func:`spec_of`: whether
it needs an LLM, what it retrieves from, whether it answers open-domain
questions); the ``--pipeline-args`` split per pipeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rcn_fast.eval.config import EvalError

if TYPE_CHECKING:
    from rcn_fast.pipelines.spec import PipelineSpec


def pipeline_registry() -> dict[str, Any]:
    """The pipelines known right now (looked up at run time)."""
    from rcn_fast.pipelines import PIPELINES

    return dict(PIPELINES)


def pipeline_config_class(name: str) -> Any:
    from rcn_fast.pipelines import CONFIGS

    return CONFIGS[name]


RETRIEVER_KINDS = ("none", "corpus", "optional_corpus", "example_kb")  # rcn_fast.pipelines.spec.RETRIEVES


def spec_of(cls: Any) -> PipelineSpec:
    """A pipeline class's declaration (its ``spec``, a frozen
    :class:`~rcn_fast.pipelines.spec.PipelineSpec`): the one thing the
    evaluation reads about a class."""
    from rcn_fast.pipelines.spec import PipelineSpec

    spec = getattr(cls, "spec", None)
    if not isinstance(spec, PipelineSpec):
        raise EvalError(f"pipeline {getattr(cls, 'name', cls)!r}: expected a class attribute spec = "
                        f"rcn_fast.pipelines.PipelineSpec(...), got {type(spec).__name__}")
    return spec


def retriever_kind(cls: Any) -> str:
    """What a pipeline class retrieves from (``spec.retrieves``): "none",
    "corpus" (a passage corpus is required), "optional_corpus" (used when
    its settings retrieve), "example_kb" (an example knowledge base, ``--kb``)."""
    return spec_of(cls).retrieves


def is_open_capable(cls: Any) -> bool:
    """Whether a pipeline class answers open-domain questions (``spec.answers_open``)."""
    return spec_of(cls).answers_open


def needs_llm(cls: Any) -> bool:
    """Whether a pipeline class answers with the LLM (``spec.needs_llm``;
    False for a trained pipeline such as SEPTA: no LLM is loaded for it)."""
    return spec_of(cls).needs_llm


def scores_choices(cls: Any) -> bool:
    """Whether a pipeline class's choice predictions carry their log-probs
    (``spec.scores_choices``; a record without them is then refused)."""
    return spec_of(cls).scores_choices


def may_use_retriever(cls: Any) -> bool:
    """Whether a pipeline class may want the corpus retriever."""
    return retriever_kind(cls) in ("corpus", "optional_corpus")


def needs_example_kb(cls: Any) -> bool:
    """Whether a pipeline class retrieves from an example knowledge base (``--kb``)."""
    return retriever_kind(cls) == "example_kb"


def split_pipeline_args(args: dict[str, Any], pipelines: list[str]) -> dict[str, dict[str, Any]]:
    """``{"k": v, "p.k": v}`` -> per-pipeline settings (validated by name)."""
    out: dict[str, dict[str, Any]] = {p: {} for p in pipelines}
    fields_of = {p: set(pipeline_config_class(p).__dataclass_fields__) for p in pipelines}
    for key, value in args.items():
        key = str(key)
        if "." in key:
            p, _, k = key.partition(".")
            if p not in out:
                known = pipeline_registry()
                if p in known:
                    continue  # a setting of a pipeline this run does not include (a shared config file)
                raise EvalError(f"pipeline-args: {key!r} names an unknown pipeline {p!r}; available pipelines: "
                                f"{', '.join(sorted(known))}")
            if k not in fields_of[p]:
                raise EvalError(f"pipeline-args: {p!r} has no setting {k!r}; its settings: "
                                f"{', '.join(sorted(fields_of[p]))}")
            out[p][k] = value
        else:
            takers = [p for p in pipelines if key in fields_of[p]]
            if not takers and not any(key in pipeline_config_class(n).__dataclass_fields__
                                      for n in pipeline_registry()):
                raise EvalError(f"pipeline-args: no pipeline has a setting {key!r} "
                                f"(settings of this run's pipelines: "
                                f"{', '.join(sorted(set().union(*fields_of.values())))})")
            for p in takers:
                out[p].setdefault(key, value)
    return out


__all__ = ["pipeline_registry", "pipeline_config_class", "spec_of", "retriever_kind", "is_open_capable", "needs_llm",
           "may_use_retriever", "needs_example_kb", "split_pipeline_args", "RETRIEVER_KINDS"]
