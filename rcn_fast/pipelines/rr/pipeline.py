"""The two pipelines: :class:`SelfConsistency` (majority vote of sampled
reasoning paths) and :class:`RR` (the paths weighed by their faithfulness
to retrieved evidence); see :mod:`rcn_fast.pipelines.rr`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcn_fast.data import MCQuestion
from rcn_fast.data.yes_no import is_yes_no
from rcn_fast.pipelines.base import Answer, Prediction, QuestionCost, QuestionState, StagedPipeline, StageRunner
from rcn_fast.pipelines.knowledge import passage_refs
from rcn_fast.pipelines.rr.answers import ReasoningPath, make_path
from rcn_fast.pipelines.spec import PipelineSpec, Stage
from rcn_fast.pipelines.rr.config import RRConfig, SelfConsistencyConfig
from rcn_fast.pipelines.rr.faithfulness import (
    SIMILARITY_KEYS,
    Vote,
    faithful_vote,
    faithfulness_terms,
    load_similarity_model,
    vote_logprobs,
)
from rcn_fast.retrieval.types import Passage


@dataclass
class PathState(QuestionState):
    """One question in RR / self-consistency: its sampled reasoning
    ``paths`` and the vote's ``pred`` (None: no path answered)."""

    paths: list[ReasoningPath] = field(default_factory=list)
    pred: int | None = None


class ReasoningPaths(Stage):
    """One sampling call: ``num_paths`` reasoning paths per question
    (:meth:`SelfConsistency.sample_paths`)."""

    name = "rr_reasoning"
    reads = ("question",)
    writes = ("paths", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        runner.pipeline.sample_paths(states, runner)


class PathCheck(Stage):
    """RR's evidence step: retrieval and faithfulness of the paths'
    sentences (:meth:`RR.check_paths`; no LLM call)."""

    name = "faithfulness"
    reads = ("question", "paths")
    writes = ("paths", "passages")

    def run(self, states: list[QuestionState], runner: StageRunner) -> None:
        runner.pipeline.check_paths(states)


class VoteAnswer(Answer):
    """The vote of the paths (:meth:`SelfConsistency.answer_stage`); with
    ``fallback="score"`` a question no path answered gets one scoring pass."""

    reads = ("question", "paths")
    writes = ("pred", "result", "trace")

    def llm_calls_per_question(self, config: Any) -> int:
        return 1 if config.fallback == "score" else 0


class SelfConsistency(StagedPipeline):
    """Self-consistency: ``num_paths`` sampled chains of thought per question
    (one generation call for the whole batch), majority vote.

    Examples
    --------
    >>> p = rcn_fast.pipelines.build("self_consistency", llm=llm, num_paths=10)   # doctest: +SKIP
    >>> pred = p.run(question); pred.pred_label, pred.trace[-1]["votes"]                  # doctest: +SKIP
    ('B', [2, 7, 1, 0, 0])
    """

    name = "self_consistency"
    config_class = SelfConsistencyConfig
    state_class = PathState
    spec = PipelineSpec(stages=(ReasoningPaths(), VoteAnswer()))

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
        :meth:`runner` when None). Fills ``state.paths``; returns the
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
            st.paths = [make_path(t, st.question, c.conclusion_words) for t in texts]
        return 1

    def check_paths(self, states: list[QuestionState]) -> None:
        """RR's evidence step (nothing for self-consistency)."""

    def decide(self, st: QuestionState) -> Vote:
        paths: list[ReasoningPath] = st.paths
        return faithful_vote([p.answer.index for p in paths], None, len(st.question.choices))

    # ------------------------------------------------------------ the answer
    def answer_stage(self, states: list[QuestionState], runner: StageRunner) -> list[list[float]]:
        """The vote of each question's paths (``state.pred``); the
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
                lps[i] = vote_logprobs(v, softmax=self.does_retrieve)
                preds_idx[i] = v.pred
            elif lps[i] is None:  # fallback "first"
                lps[i] = [-math.log(nc)] * nc
                preds_idx[i] = 0
            self._trace_paths(st)
            st.trace.append(self._vote_trace(st, v, preds_idx[i]))
            st.pred = preds_idx[i]
        return [list(lp or []) for lp in lps]

    def prediction(self, st: QuestionState, lp: list[float], cost: QuestionCost) -> Prediction:
        """The voted answer; its knowledge is the distinct explanations of the
        paths that reached it."""
        q = st.question
        pred = st.pred
        knowledge: list[str] = []
        for p in st.paths:
            if p.answer.index == pred and p.explanation and p.explanation not in knowledge:
                knowledge.append(p.explanation)
        return Prediction(
            question_id=q.id, pred=pred, pred_label=q.labels[pred], choice_logprobs=lp,
            knowledge=knowledge, passages=list(st.passages), trace=st.trace, cost=cost, gold=q.answer,
            gold_label=q.answer_label,
        )

    def _trace_paths(self, st: QuestionState) -> None:
        q = st.question
        for j, p in enumerate(st.paths):
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
            if self.does_retrieve:
                entry["faithfulness"] = p.faithfulness
            st.trace.append(entry)

    def _vote_trace(self, st: QuestionState, v: Vote, pred: int) -> dict[str, Any]:
        paths: list[ReasoningPath] = st.paths
        entry: dict[str, Any] = {
            "stage": "inference", "type": "vote", "method": "faithfulness" if self.does_retrieve else "majority",
            "answers": [p.answer.index for p in paths], "votes": v.votes, "totals": v.totals, "rule": v.rule,
            "pred": pred, "fallback": None if v.pred is not None else self.config.fallback,
        }
        if self.does_retrieve:
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
    spec = PipelineSpec(retrieves="corpus", components=("nli", "similarity"),
                        stages=(ReasoningPaths(), PathCheck(), VoteAnswer()))

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
            for p in st.paths:
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
            for p in st.paths:
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
                             "sentences": sum(sum(p.checked) for p in st.paths),
                             "passages": passage_refs(st.passages)})

    def decide(self, st: QuestionState) -> Vote:
        paths: list[ReasoningPath] = st.paths
        return faithful_vote([p.answer.index for p in paths], [p.faithfulness or 0.0 for p in paths],
                             len(st.question.choices))


__all__ = ["SelfConsistency", "RR"]
