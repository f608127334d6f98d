"""The ``"septa"`` pipeline: a trained SEPTA directory answering questions
through the standard :class:`rcn_fast.pipelines.Prediction` records (no LLM
calls; ``choice_logprobs`` = log-softmax of the predictor's scores).

What the evaluation reads from the class is its ``spec``
(:class:`rcn_fast.pipelines.spec.PipelineSpec`): ``needs_llm=False`` (no
LLM is loaded, nor its package checked, and the LLM is not part of the
result key), ``retrieves="none"``, its ``usage_note`` for
``--list-pipelines``, its stages ``("retrieve", "predict")`` (reported to
the ``observers`` after each stage of a batch, for the progress bars),
:meth:`Septa.check_config` (called while planning, before anything loads:
a missing or incomplete checkpoint is one clear message) and
:meth:`Septa.result_key` (a fingerprint of the checkpoint's contents, so
retraining in place is not answered from old results).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, ClassVar, Sequence

import numpy as np

from rcn_fast._validate import check_int as _int
from rcn_fast.data import MCQuestion
from rcn_fast.pipelines.base import Prediction, QuestionCost, mc_questions, run_in_batches
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.spec import PipelineSpec
from rcn_fast.retrieval.types import Passage

logger = logging.getLogger("rcn_fast.septa")


@dataclasses.dataclass
class SeptaConfig(PipelineConfig):
    """SEPTA: a trained predictor over retrieved knowledge-graph subgraph
    vectors (no LLM). The LLM decoding fields are unused.

    Attributes
    ----------
    checkpoint : str or None
        A SEPTA directory built by ``python -m rcn_fast.septa align`` /
        ``build-db`` / ``train`` (required to run).
    top_k : int or None
        Subgraph vectors retrieved per choice; None: the value it was trained with.
    """

    name: ClassVar[str] = "septa"
    checkpoint: str | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.checkpoint, os.PathLike):
            self.checkpoint = os.fspath(self.checkpoint)
        if self.checkpoint is not None and not isinstance(self.checkpoint, str):
            raise TypeError(f"checkpoint: expected a directory path or None, got {type(self.checkpoint).__name__}")
        _int(self.top_k, "top_k", 1, allow_none=True)


class Septa:
    """SEPTA as a pipeline.

    Parameters
    ----------
    llm : ignored (SEPTA needs none; accepted so ``build("septa", llm=...)`` works)
    config : SeptaConfig
        ``checkpoint`` must name a trained SEPTA directory.
    encoder : text encoder, optional
        Overrides the encoder recorded in the directory.

    Examples
    --------
    >>> from rcn_fast import pipelines                                   # doctest: +SKIP
    >>> p = pipelines.build("septa", llm=None, checkpoint="runs/septa")
    >>> p.run_batch(questions)[0].choice_logprobs
    """

    name = "septa"
    config_class = SeptaConfig

    @staticmethod
    def check_config(config: SeptaConfig) -> None:
        """Check that ``config.checkpoint`` names a complete SEPTA directory
        (``septa.json``, ``graph/``, ``align.safetensors``, ``db/``, ``predictor.safetensors``)
        without loading it.

        Raises
        ------
        ValueError
            No checkpoint given, or an unreadable manifest.
        FileNotFoundError
            A missing directory or part (the message names the command that
            writes it).
        """
        from rcn_fast.septa.system import check_directory

        if config.checkpoint is None:
            raise ValueError("checkpoint: the 'septa' pipeline needs a trained SEPTA directory: pass "
                             "--pipeline-args septa.checkpoint=DIR (build one with python -m rcn_fast.septa "
                             "align, build-db, train)")
        check_directory(config.checkpoint)

    @staticmethod
    def result_key(config: SeptaConfig) -> dict[str, Any]:
        """What determines the answers besides ``config``: a fingerprint of
        the checkpoint's contents (see
        :func:`rcn_fast.septa.system.checkpoint_fingerprint`)."""
        from rcn_fast.septa.system import checkpoint_fingerprint

        if config.checkpoint is None:
            return {"checkpoint": None}
        return {"checkpoint": checkpoint_fingerprint(config.checkpoint)}

    spec = PipelineSpec(
        needs_llm=False, retrieves="none", stages=("retrieve", "predict"), components=("encoder",),
        usage_note=("needs --pipeline-args septa.checkpoint=DIR, a directory built by python -m rcn_fast.septa "
                    "align, build-db, train; no LLM"),
        check_config=check_config.__func__, result_key=result_key.__func__,  # type: ignore[attr-defined]
    )

    def __init__(self, llm: Any = None, config: SeptaConfig | None = None, *, retriever: Any = None,
                 prompts: Any = None, encoder: Any = None) -> None:
        from rcn_fast.septa.system import SeptaSystem

        config = config if config is not None else SeptaConfig()
        if not isinstance(config, SeptaConfig):
            raise TypeError(f"config: expected SeptaConfig, got {type(config).__name__}")
        if config.checkpoint is None:
            raise ValueError("checkpoint: the 'septa' pipeline needs a trained SEPTA directory "
                             "(python -m rcn_fast.septa align|build-db|train), got None")
        if retriever is not None:
            raise TypeError("retriever: the 'septa' pipeline retrieves from its own subgraph database; pass None")
        self.llm, self.config = llm, config
        #: StageObserver objects told of each stage ("retrieve", "predict") and the questions it finished
        self.observers: list[Any] = []
        self.stages = list(self.spec.stages)
        self.system = SeptaSystem(config.checkpoint, encoder=encoder)
        if config.top_k is not None:
            self.system.config = dataclasses.replace(self.system.config, top_k=config.top_k)

    def describe(self) -> dict[str, Any]:
        from rcn_fast.pipelines.config import config_to_dict

        m = self.system.manifest
        return {"pipeline": self.name, "config": config_to_dict(self.config), "llm": None,
                "graph": m.get("graph"), "encoder": m.get("encoder", {}).get("describe"),
                "predictor": self.system.config.to_dict(), "db": m.get("db")}

    def run(self, question: MCQuestion) -> Prediction:
        if not isinstance(question, MCQuestion):
            raise TypeError(f"question: expected an MCQuestion, got {type(question).__name__}")
        return self.run_batch([question])[0]

    def run_batch(self, questions: Sequence[MCQuestion]) -> list[Prediction]:
        """Predictions for ``questions`` (batched: one encoder pass per batch
        for the queries, one index search)."""
        return run_in_batches(mc_questions(questions), self.config.batch_size, self._run_chunk, ids_key=None)

    def _report(self, stage: str, ids: list[str], *, done: bool = False) -> None:
        for ob in self.observers:
            if done:
                ob.stage_done(stage, ids)
            else:
                ob.stage_start(stage)

    def _run_chunk(self, questions: list[MCQuestion]) -> list[Prediction]:
        if not questions:
            return []
        sysm = self.system
        ids = [q.id for q in questions]
        self._report("retrieve", ids)
        feats, enhanced = sysm.features(questions)
        self._report("retrieve", ids, done=True)
        self._report("predict", ids)
        scores = sysm.score(feats)
        self._report("predict", ids, done=True)
        preds = []
        for qi, q in enumerate(questions):
            n = len(q.choices)
            sc = scores[qi, :n].astype(np.float64)
            lp = sc - (sc.max() + np.log(np.exp(sc - sc.max()).sum()))
            trace: list[dict[str, Any]] = []
            passages: dict[int, Passage] = {}
            knowledge: list[str] = []
            for ci in range(n):
                enh = enhanced[qi][ci]
                ids = [int(x) for x in feats.G_ids[qi, ci] if x >= 0]
                sims = [float(x) for x, i in zip(feats.G_scores[qi, ci], feats.G_ids[qi, ci]) if i >= 0]
                texts = [sysm.db.texts[i] for i in ids]
                trace.append({"stage": "retrieve", "type": "retrieve", "choice": ci, "query": enh.text,
                              "linked_nodes": [sysm.graph.node_names[v] for v in enh.nodes],
                              "triples": list(enh.triples), "subgraph_ids": ids,
                              "subgraph_centres": [sysm.graph.node_names[int(sysm.db.centres[i])] for i in ids],
                              "subgraph_texts": texts, "scores": sims})
                knowledge += [t for t in enh.triples if t not in knowledge]
                for i, t, s in zip(ids, texts, sims):
                    if i not in passages or passages[i].score < s:
                        passages[i] = Passage(id=f"subgraph:{i}", text=t, score=s, meta={"row": i})
            trace.append({"stage": "predict", "type": "score", "labels": list(q.labels),
                          "scores": [float(x) for x in sc], "logprobs": [float(x) for x in lp]})
            pred = int(np.argmax(lp))
            preds.append(Prediction(question_id=q.id, pred=pred, pred_label=q.labels[pred],
                                    choice_logprobs=[float(x) for x in lp], knowledge=knowledge,
                                    passages=sorted(passages.values(), key=lambda p: -p.score), trace=trace,
                                    cost=QuestionCost(), gold=q.answer, gold_label=q.answer_label))
        return preds
