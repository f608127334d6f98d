"""ReConnect's settings: :class:`ReConnectConfig`, the named ablations of
the paper's Tables 3 and 7 (:data:`ABLATIONS`) and the named presets
(:data:`PRESETS`; ``"reference"`` = the authors' released code).

Split out of :mod:`rcn_fast.pipelines.reconnect`, which re-exports every name.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast._validate import is_number
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.pipelines.rag import ANSWER_EXTRACTIONS
from rcn_fast.pipelines.reconnect_parsing import QUERY_PARSINGS
from rcn_fast.pipelines.simple import QUERY_MODES


#: Subset sampling strategies: the paper's relevance sampling and Table 3's ablations.
SAMPLING_STRATEGIES = ("relevance", "random", "topk", "mmr", "cluster")


@dataclass
class ReConnectConfig(PipelineConfig):
    """ReConnect (explanation-guided retrieval + knowledge connection).

    Every default follows the paper (or, where the paper is silent, its
    reference code); docs/FIDELITY.md lists each step with its setting.

    Attributes
    ----------
    top_n : int
        Passages retrieved per query (paper: n = 5). Without explanation
        retrieval ("w/o ER") the question query retrieves
        ``top_n * (k + 1)`` passages, k the explanation cap
        (``max_queries``, default the number of choices), so the pool is as
        large as with ER (the reference code does the same).
    num_subsets : int
        N, document subsets per question (paper: 3); one extraction each.
    subset_size : int or "top_n+1"
        K, documents per subset (paper: 5). ``"top_n+1"`` is the reference
        code's rule: ``top_n + 1`` documents per subset (6 with n = 5; the
        whole pool when it holds at most ``top_n`` documents); the
        ``reference`` preset sets it. See :attr:`subset_k`.
    tau : float
        Softmax temperature of the relevance sampler, as in the paper's
        grid {1.0, 1.5, 2.0} (default 1.0). The sampler draws from
        ``softmax(score_scale * s / tau)``.
    score_scale : float or "width"
        Factor on the sampler's scores s = e.e_j + e_q.e_j (and on the
        relevance of the first draw with ``first="relevance"``): the native
        sampler runs with ``tau / score_scale``. ``"width"`` (default)
        resolves to the width d of the embeddings the sampler sees (the
        encoder's dimension: 384 for all-MiniLM-L6-v2, 768 for E5-base),
        recorded in the trace (``score_scale``) and in
        :meth:`ReConnect.describe`. Why: the reference code sampled on the
        retriever's raw pooled vectors, a LayerNorm output whose squared
        norm is about d, so its scores were d times the cosines this
        pipeline sees by default (``sampler_input="normalized"``); d on
        unit vectors restores the reference's concentration for any
        encoder (issue 31: against the reference's sampler on its own
        vectors, total-variation distance 0.064 at d against 0.335 with
        the former default 32). The paper's tau grid {1.0, 1.5, 2.0} acts
        on top of it (docs/FIDELITY.md shows the subset distribution at
        each tau). A number fixes the factor (32 was the former default;
        ``sampler_input="stored", score_scale=1`` samples on a store's own
        vectors). Strategies other than ``"relevance"`` do not depend on it.
    sampling : {"relevance", "random", "topk", "mmr", "cluster"}
        Subset strategy (ReConnect's Table 3).
    first : {"uniform", "relevance"}
        How the relevance sampler draws the first document of a subset
        (paper and reference code: uniformly).
    sampler_input : {"normalized", "stored"}
        Embeddings the sampler sees: L2-normalised (default, so
        ``score_scale`` has the same meaning for every encoder and store),
        or as the retriever stores them.
    mmr_lambda : float
        Relevance weight of the ``"mmr"`` strategy.
    max_queries : int or None
        Explanation lines kept as queries (>= 1); None = the number of
        choices (open questions, which have none: :attr:`open_queries`,
        4; see :meth:`num_queries`). To retrieve with the question alone
        (no query-expansion generation at all) set
        ``explanation_retrieval=False`` ("w/o ER");
        0 is refused rather than paying for a generation whose output
        would be thrown away.
    query : {"question", "question_choices"}
        The text of the question query Q.
    repeat_decoding : {"nucleus", "greedy"}
        Decoding of the extractions of a question whose N subsets are not
        all distinct (always with ``sampling="topk"`` or ``"mmr"``; with
        the other strategies when two draws coincide, e.g. a pool of at
        most K documents, or two concentrated relevance draws from the
        same first document). ``"nucleus"``
        (default, as the reference code does for top-K): every extraction
        of that question is sampled with ``repeat_temperature`` and
        ``repeat_top_p``, extraction i with its own seed (``seed`` for
        i = 0, a hash of ``(seed, i)`` otherwise; the draw also depends on
        the prompt, so on the question and the subset): the N
        extractions differ and do not depend on batching. ``"greedy"``:
        the run's decoding for every extraction (identical subsets then
        give N identical extractions). Questions whose subsets are all
        distinct always use the run's decoding.
    repeat_top_p : float
        Nucleus mass of those extractions (reference code: 0.7).
    repeat_temperature : float
        Their sampling temperature (> 0; reference code: 1.0, the
        transformers default).
    explanation_retrieval : bool
        False = ablation "w/o ER": retrieve with the question only, no
        query-expansion generation, ``top_n * (k + 1)`` passages.
    knowledge_connection : bool
        False = "w/o KC": no sampling, extraction or aggregation; the
        answering step gets every pooled passage (the paper's Tables 3 and
        7 give identical numbers for "w/o KC" and "w/o KE, KA": it is the
        same setting). Setting it False also sets ``knowledge_extraction``
        and ``knowledge_aggregation`` False, so the recorded config says
        what ran.
    knowledge_extraction : bool
        False = "w/o KE": no sampling and no extraction; aggregate
        directly from every pooled passage.
    knowledge_aggregation : bool
        False = "w/o KA": no aggregation; answer with the N extraction
        outputs as an N-item list (one item per extraction, its
        explanations joined; empty extractions left out).
        ``knowledge_extraction`` and ``knowledge_aggregation`` both False
        is "w/o KE, KA" = "w/o KC".
    query_parsing : {"reference", "markers"}
        How the query-expansion output becomes queries
        (:func:`~rcn_fast.pipelines.reconnect_parsing.parse_queries`).
        ``"reference"`` (default; the reference code's rule, the paper is
        silent): the first paragraph's lines with every ``*`` deleted,
        stripped, empty ones dropped, the first k kept (numbers and
        ``D:`` prefixes stay). ``"markers"``: rcn_fast's former parser
        (:func:`~rcn_fast.prompts.parse_bullets`, list markers stripped).
    answer_turn : {"reference", "shared"}
        The answering prompt. ``"reference"`` (default): ReConnect's own
        ``reconnect_answer`` prompt (paper Table 18) whose pre-filled turn
        is ``Answer:`` continued with no trailing space, the ids the
        reference code scores with Llama-3's template (it renders the turn
        as a complete message, the template trims it, and the end-of-turn
        token is cut). ``"shared"``: the ``answer_with_knowledge`` prompt
        the other pipelines score with (pre-fill ``Answer: ``), rcn_fast's
        former ReConnect answer, for comparisons on one footing.
    preset : {"reference"} or None
        A named set of settings (:data:`PRESETS`): ``"reference"`` = the
        authors' released code where it differs from the paper
        (``subset_size="top_n+1"``, ``max_new_tokens=196``,
        ``repeat_decoding="greedy"`` unless ``sampling="topk"``). Settings
        given beside the preset win (``from_dict`` / ``build``); on direct
        construction the preset fills the fields left at their defaults.
    answer_extraction : {"full", "final"}
        Open questions only (rcn_fast's extension; the answer is generated):
        what StringEM and exact match are computed on, as in the
        open-domain RAG pipelines (:class:`RAGConfig`): ``"full"``
        (default) the whole answer generation, ``"final"`` its
        ``Answer:`` line (first non-empty line without a marker).
    """

    name: ClassVar[str] = "reconnect"
    #: Explanations kept for an open question when ``max_queries`` is None.
    open_queries: ClassVar[int] = 4
    top_n: int = 5
    num_subsets: int = 3
    subset_size: int | str = 5
    tau: float = 1.0
    score_scale: float | str = "width"
    sampling: str = "relevance"
    first: str = "uniform"
    sampler_input: str = "normalized"
    mmr_lambda: float = 0.5
    max_queries: int | None = None
    query: str = "question"
    repeat_decoding: str = "nucleus"
    repeat_top_p: float = 0.7
    repeat_temperature: float = 1.0
    explanation_retrieval: bool = True
    knowledge_connection: bool = True
    knowledge_extraction: bool = True
    knowledge_aggregation: bool = True
    query_parsing: str = "reference"
    answer_turn: str = "reference"
    preset: str | None = None
    answer_extraction: str = "full"

    def __post_init__(self) -> None:
        if self.preset is not None:
            check_choice(self.preset, "preset", tuple(PRESETS))
            _fill_preset(self)
        super().__post_init__()
        _int(self.top_n, "top_n")
        _int(self.num_subsets, "num_subsets")
        if self.subset_size != SUBSET_TOP_N_PLUS_ONE:
            if isinstance(self.subset_size, str):
                raise ValueError(f"subset_size: expected an int >= 1 or {SUBSET_TOP_N_PLUS_ONE!r}, "
                                 f"got {self.subset_size!r}")
            _int(self.subset_size, "subset_size")
        if self.max_queries == 0 and not isinstance(self.max_queries, bool):
            raise ValueError("max_queries: expected an int >= 1 or None, got 0; to retrieve with the question "
                             "only, set explanation_retrieval=False (the 'w/o ER' ablation)")
        _int(self.max_queries, "max_queries", 1, allow_none=True)
        for f in ("tau", "score_scale", "repeat_temperature"):
            v = getattr(self, f)
            if f == "score_scale" and v == SCALE_WIDTH:
                continue
            if not is_number(v) or not 0 < v < float("inf"):
                raise ValueError(f"{f}: expected a finite number > 0, got {v!r}")
            setattr(self, f, float(v))
        if not is_number(self.repeat_top_p) or not 0 < self.repeat_top_p <= 1:
            raise ValueError(f"repeat_top_p: expected a number in (0, 1], got {self.repeat_top_p!r}")
        self.repeat_top_p = float(self.repeat_top_p)
        check_choice(self.repeat_decoding, "repeat_decoding", ("nucleus", "greedy"))
        check_choice(self.sampling, "sampling", SAMPLING_STRATEGIES)
        check_choice(self.first, "first", ("uniform", "relevance"))
        check_choice(self.sampler_input, "sampler_input", ("normalized", "stored"))
        if not isinstance(self.mmr_lambda, (int, float)) or not 0 <= self.mmr_lambda <= 1:
            raise ValueError(f"mmr_lambda: expected a number in [0, 1], got {self.mmr_lambda!r}")
        check_choice(self.query, "query", QUERY_MODES)
        for f in ("explanation_retrieval", "knowledge_connection", "knowledge_extraction", "knowledge_aggregation"):
            _bool(getattr(self, f), f)
        if not self.knowledge_connection:  # "w/o KC" is "w/o KE, KA" (Tables 3 and 7)
            self.knowledge_extraction = self.knowledge_aggregation = False
        elif not (self.knowledge_extraction or self.knowledge_aggregation):
            self.knowledge_connection = False
        check_choice(self.answer_extraction, "answer_extraction", ANSWER_EXTRACTIONS)
        check_choice(self.query_parsing, "query_parsing", QUERY_PARSINGS)
        check_choice(self.answer_turn, "answer_turn", ("reference", "shared"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ReConnectConfig":
        """Settings -> config; a ``preset`` key starts from that preset's
        settings and the other keys override them."""
        d = dict(d)
        name = d.pop("preset", None)
        if name is None:
            return super().from_dict(d)  # type: ignore[return-value]
        check_choice(name, "preset", tuple(PRESETS))
        cfg = super().from_dict({**preset_settings(name, d.get("sampling", "relevance")), **d})
        cfg.preset = name
        return cfg  # type: ignore[return-value]

    @property
    def subset_k(self) -> int:
        """K, the documents per subset: ``subset_size``, or ``top_n + 1``
        with ``subset_size="top_n+1"`` (the sampler caps it at the pool)."""
        if self.subset_size == SUBSET_TOP_N_PLUS_ONE:
            return self.top_n + 1
        return int(self.subset_size)

    def resolved_score_scale(self, width: int) -> float:
        """The factor on the sampler's scores for embeddings of ``width``
        dimensions (``score_scale``, or ``width`` with ``"width"``)."""
        if self.score_scale == SCALE_WIDTH:
            _int(width, "width")
            return float(width)
        return float(self.score_scale)

    def sampler_tau(self, width: int) -> float:
        """The temperature the sampler runs with on embeddings of ``width``
        dimensions: ``tau / score_scale`` (see :meth:`resolved_score_scale`)."""
        return self.tau / self.resolved_score_scale(width)

    @property
    def samples_subsets(self) -> bool:
        """Whether subsets are drawn (knowledge connection with extraction)."""
        return self.knowledge_connection and self.knowledge_extraction

    def num_queries(self, num_choices: int) -> int:
        """k: the explanations kept as queries for a question with
        ``num_choices`` options (``max_queries``, else ``num_choices``; an
        open question, 0 options, gets :attr:`open_queries`)."""
        if self.max_queries is not None:
            return self.max_queries
        return num_choices if num_choices > 0 else self.open_queries

    def pool_queries(self, num_choices: int) -> int:
        """k + 1: the queries of explanation retrieval for a question with
        ``num_choices`` options (k explanations + the question, see
        :meth:`num_queries`). Without ER the question query retrieves
        ``top_n`` times this many passages."""
        return self.num_queries(num_choices) + 1

    @property
    def generations_per_question(self) -> int:
        """LLM generations one question costs under these settings (1 for
        query expansion, N extractions, 1 aggregation, each when on)."""
        n = int(self.explanation_retrieval)
        if self.samples_subsets:
            n += self.num_subsets
        return n + int(self.knowledge_connection and self.knowledge_aggregation)

    @property
    def llm_calls_per_question(self) -> int:
        """Generations plus the one answer-scoring pass (the paper's
        Table 9 counts 6 for N = 3)."""
        return self.generations_per_question + 1

    @property
    def open_generations_per_question(self) -> int:
        """Generations of one open question: the same stages, and the
        answer is a generation instead of the scoring pass (so as many LLM
        calls as :attr:`llm_calls_per_question`, none of them scoring)."""
        return self.generations_per_question + 1


# Named ablations of ReConnect's Tables 3 and 7 -> the settings they switch
# off. "w/o KC" and "w/o KE, KA" are one setting (the tables report
# identical numbers for them). Sampling rows of Table 3 ("w/ Random", ...)
# are ``sampling=`` values, not ablations.
ABLATIONS: dict[str, dict[str, Any]] = {
    "w/o ER": {"explanation_retrieval": False},
    "w/o KC": {"knowledge_connection": False, "knowledge_extraction": False, "knowledge_aggregation": False},
    "w/o ER, KC": {"explanation_retrieval": False, "knowledge_connection": False, "knowledge_extraction": False,
                   "knowledge_aggregation": False},
    "w/o KE": {"knowledge_extraction": False},
    "w/o KA": {"knowledge_aggregation": False},
    "w/o KE, KA": {"knowledge_connection": False, "knowledge_extraction": False, "knowledge_aggregation": False},
}


def ablation_settings(names: str | list[str] | None) -> dict[str, Any]:
    """``"w/o KC"`` (or ``"wo_kc"``, a list of them) -> ReConnect settings."""
    if names is None:
        return {}
    if isinstance(names, str):
        names = [names]
    out: dict[str, Any] = {}
    norm = {k.lower().replace("/", "").replace(" ", "").replace("_", ""): k for k in ABLATIONS}
    for n in names:
        key = norm.get(str(n).lower().replace("/", "").replace(" ", "").replace("_", "").replace("-", ""))
        if key is None:
            raise ValueError(f"ablation: expected one of {list(ABLATIONS)}, got {n!r}")
        out.update(ABLATIONS[key])
    return out


#: ``subset_size`` value of the reference code's rule, and ``score_scale``'s encoder-width value.
SUBSET_TOP_N_PLUS_ONE = "top_n+1"
SCALE_WIDTH = "width"

#: Named presets -> the settings they set (see :func:`preset_settings`).
PRESETS: dict[str, dict[str, Any]] = {
    # the authors' released code (src/generate.py, OurRAG) where it differs
    # from the paper's defaults; the rest of its behaviour is already the
    # default here (query parsing, answer turn, sampler scale, k = choices)
    "reference": {"subset_size": SUBSET_TOP_N_PLUS_ONE, "max_new_tokens": 196, "repeat_decoding": "greedy",
                  "score_scale": SCALE_WIDTH, "sampler_input": "normalized", "first": "uniform",
                  "query_parsing": "reference", "answer_turn": "reference", "query": "question"},
}


def preset_settings(name: str, sampling: str = "relevance") -> dict[str, Any]:
    """The settings of preset ``name`` for a run with ``sampling`` (the
    reference code samples its top-K extractions with nucleus sampling and
    decodes every other strategy's greedily)."""
    check_choice(name, "preset", tuple(PRESETS))
    out = dict(PRESETS[name])
    if name == "reference" and sampling == "topk":
        out["repeat_decoding"] = "nucleus"
    return out


def _fill_preset(cfg: "ReConnectConfig") -> None:
    """Direct construction with ``preset``: its settings fill the fields
    still at their dataclass defaults."""
    defaults = {f.name: f.default for f in fields(cfg)}
    for key, value in preset_settings(cfg.preset, cfg.sampling).items():  # type: ignore[arg-type]
        if getattr(cfg, key) == defaults[key]:
            setattr(cfg, key, value)


__all__ = ["ReConnectConfig", "ABLATIONS", "ablation_settings", "SAMPLING_STRATEGIES", "PRESETS", "preset_settings",
           "SUBSET_TOP_N_PLUS_ONE", "SCALE_WIDTH"]
