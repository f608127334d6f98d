"""Pipeline configurations: plain dataclasses, JSON/YAML serialisable.

Every field is a setting recorded with each result. ``to_dict`` gives plain
data; :func:`config_to_dict` adds the pipeline name so a saved file can be
read back with :func:`load_config`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_int as _int
from rcn_fast._validate import is_number, unknown_keys

SAMPLING_STRATEGIES = ("relevance", "random", "topk", "mmr", "cluster")


@dataclass
class PipelineConfig:
    """Settings shared by every pipeline.

    Attributes
    ----------
    prompts : str, dict or None
        A prompt file (YAML/JSON) or mapping merged over the packaged
        defaults (see :func:`rcn_fast.prompts.load_prompts`); None = defaults.
    max_new_tokens : int
        Token limit of every generation step.
    temperature, top_p : float
        Decoding; temperature 0 is greedy (the default of every method).
    seed : int
        Seed of every random draw (LLM sampling, subset sampling).
    batch_size : int or None
        Questions per batch inside ``run_batch`` (each stage runs for the
        whole batch at once); None = the whole list in one batch.
    """

    name: ClassVar[str] = ""

    prompts: str | dict | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.prompts is not None and not isinstance(self.prompts, (str, dict, os.PathLike)):
            raise TypeError(f"prompts: expected a file path, a mapping or None, got {type(self.prompts).__name__}")
        if isinstance(self.prompts, os.PathLike):
            self.prompts = os.fspath(self.prompts)
        _int(self.max_new_tokens, "max_new_tokens")
        if not is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature: expected a number >= 0, got {self.temperature!r}")
        if not is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        _int(self.seed, "seed", 0)
        _int(self.batch_size, "batch_size", 1, allow_none=True)
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineConfig":
        unknown, known = unknown_keys(cls, d)
        if unknown:
            raise ValueError(f"config: unknown {cls.name or 'pipeline'} setting(s) {unknown}; known: {known}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(config_to_dict(self), indent=2, sort_keys=False)

    def to_yaml(self) -> str:
        return yaml.safe_dump(config_to_dict(self), sort_keys=False)


@dataclass
class VanillaConfig(PipelineConfig):
    """The LLM answers with no knowledge (one scoring pass per question)."""

    name: ClassVar[str] = "vanilla"


@dataclass
class SingleRetrievalConfig(PipelineConfig):
    """Retrieve ``top_n`` passages for the question and answer with them.

    Attributes
    ----------
    top_n : int
        Passages retrieved for the question.
    query : {"question", "question_choices"}
        The query text: the question alone, or the question followed by
        its options.
    """

    name: ClassVar[str] = "single_retrieval"
    top_n: int = 5
    query: str = "question"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_n, "top_n")
        if self.query not in ("question", "question_choices"):
            raise ValueError(f"query: expected 'question' or 'question_choices', got {self.query!r}")


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
    subset_size : int
        K, documents per subset (paper: 5).
    tau : float
        Softmax temperature of the relevance sampler, as in the paper's
        grid {1.0, 1.5, 2.0} (default 1.0). The sampler draws from
        ``softmax(score_scale * s / tau)``.
    score_scale : float
        Factor on the sampler's scores s = e.e_j + e_q.e_j (and on the
        relevance of the first draw with ``first="relevance"``), i.e. the
        native sampler runs with ``tau / score_scale``. The paper's
        reference code sampled on the retriever's raw pooled vectors (a
        LayerNorm output, squared norms of the order of the width, 768),
        so at tau = 1 each step after the uniform first document was close
        to an argmax. With ``sampler_input="normalized"`` (default) the
        scores are cosines, which span well under one nat: ``score_scale =
        32`` restores a concentrated draw while the paper's tau grid still
        changes it (all-MiniLM-L6-v2, 600 OpenBookQA facts, 30 questions,
        pool of 12: the second document lands among the 3 best-scoring
        candidates 99%, 94% and 92% of the time at tau = 1, 1.5, 2;
        uniform drawing: 27%; stored unit vectors with score_scale = 1:
        28%). ``score_scale = 768`` (the width of an
        E5-base retriever) mimics the reference exactly (an argmax at
        every tau of the grid). The old, nearly uniform behaviour is
        ``sampler_input="stored", score_scale=1.0`` over a store of
        normalised vectors. Strategies other than ``"relevance"`` do not
        depend on the scale.
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
    subset_size: int = 5
    tau: float = 1.0
    score_scale: float = 32.0
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
    answer_extraction: str = "full"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_n, "top_n")
        _int(self.num_subsets, "num_subsets")
        _int(self.subset_size, "subset_size")
        if self.max_queries == 0 and not isinstance(self.max_queries, bool):
            raise ValueError("max_queries: expected an int >= 1 or None, got 0; to retrieve with the question "
                             "only, set explanation_retrieval=False (the 'w/o ER' ablation)")
        _int(self.max_queries, "max_queries", 1, allow_none=True)
        for f in ("tau", "score_scale", "repeat_temperature"):
            v = getattr(self, f)
            if not is_number(v) or not 0 < v < float("inf"):
                raise ValueError(f"{f}: expected a finite number > 0, got {v!r}")
            setattr(self, f, float(v))
        if not is_number(self.repeat_top_p) \
                or not 0 < self.repeat_top_p <= 1:
            raise ValueError(f"repeat_top_p: expected a number in (0, 1], got {self.repeat_top_p!r}")
        self.repeat_top_p = float(self.repeat_top_p)
        if self.repeat_decoding not in ("nucleus", "greedy"):
            raise ValueError(f"repeat_decoding: expected 'nucleus' or 'greedy', got {self.repeat_decoding!r}")
        if self.sampling not in SAMPLING_STRATEGIES:
            raise ValueError(f"sampling: expected one of {list(SAMPLING_STRATEGIES)}, got {self.sampling!r}")
        if self.first not in ("uniform", "relevance"):
            raise ValueError(f"first: expected 'uniform' or 'relevance', got {self.first!r}")
        if self.sampler_input not in ("stored", "normalized"):
            raise ValueError(f"sampler_input: expected 'normalized' or 'stored', got {self.sampler_input!r}")
        if not isinstance(self.mmr_lambda, (int, float)) or not 0 <= self.mmr_lambda <= 1:
            raise ValueError(f"mmr_lambda: expected a number in [0, 1], got {self.mmr_lambda!r}")
        if self.query not in ("question", "question_choices"):
            raise ValueError(f"query: expected 'question' or 'question_choices', got {self.query!r}")
        for f in ("explanation_retrieval", "knowledge_connection", "knowledge_extraction", "knowledge_aggregation"):
            _bool(getattr(self, f), f)
        if not self.knowledge_connection:  # "w/o KC" is "w/o KE, KA" (Tables 3 and 7)
            self.knowledge_extraction = self.knowledge_aggregation = False
        elif not (self.knowledge_extraction or self.knowledge_aggregation):
            self.knowledge_connection = False
        if self.answer_extraction not in ("final", "full"):
            raise ValueError(f"answer_extraction: expected 'final' or 'full', got {self.answer_extraction!r}")

    @property
    def sampler_tau(self) -> float:
        """The temperature the sampler runs with: ``tau / score_scale``."""
        return self.tau / self.score_scale

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


@dataclass
class ZebraConfig(PipelineConfig):
    """ZEBRA (example retrieval + few-shot knowledge generation).

    Attributes
    ----------
    top_k : int
        Examples retrieved from the example knowledge base (paper: 5).
    exclude_same_id : bool
        Never use a KB example whose id equals the question's id (a KB
        built from the evaluated split would otherwise leak the answer).
    max_explanations : int or None
        Explanations of each example shown in the prompt (None = all).
    """

    name: ClassVar[str] = "zebra"
    top_k: int = 5
    exclude_same_id: bool = True
    max_explanations: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_k, "top_k")
        _bool(self.exclude_same_id, "exclude_same_id")
        _int(self.max_explanations, "max_explanations", 1, allow_none=True)


#: Pipeline name -> its config class. Filled by :func:`rcn_fast.pipelines.register`
#: from each registered pipeline class's ``config_class`` (the one source).
CONFIGS: dict[str, type[PipelineConfig]] = {}


# ------------------------------------------------------------ RR / self-consistency
#: Sentence openings that mark a conclusion (RR skips them: not checked against evidence).
CONCLUSION_WORDS = ["thus", "therefore", "so", "yes", "no", "hence", "consequently", "in conclusion", "the answer",
                    "answer"]
FAITHFULNESS_FUNCTIONS = (1, 2, 3)
BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")  # rcn_fast.retrieval.bm25.METHODS


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
        if self.fallback not in ("score", "first"):
            raise ValueError(f"fallback: expected 'score' or 'first', got {self.fallback!r}")
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
        if self.bm25_method not in BM25_METHODS:
            raise ValueError(f"bm25_method: expected one of {list(BM25_METHODS)}, got {self.bm25_method!r}")
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



def config_to_dict(config: PipelineConfig) -> dict[str, Any]:
    """``{"pipeline": name, **settings}``."""
    return {"pipeline": config.name, **config.to_dict()}


def config_from_dict(d: dict[str, Any]) -> PipelineConfig:
    """Inverse of :func:`config_to_dict`."""
    d = dict(d)
    name = d.pop("pipeline", None)
    if name not in CONFIGS:
        raise ValueError(f"pipeline: expected one of {sorted(CONFIGS)}, got {name!r}")
    return CONFIGS[name].from_dict(d)


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read a config file written with ``to_yaml`` / ``to_json``."""
    text = Path(path).read_text(encoding="utf-8")
    d = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if not isinstance(d, dict):
        raise ValueError(f"path: {path} does not hold a mapping")
    return config_from_dict(d)


# ------------------------------------------------ ActiveRAG and its RAG baselines
ACTIVERAG_AGENTS = ("associate", "anchoring", "logician", "cognition")
# ActiveRAG Table 3 ablations: "CoT w. Note", "CoT w. Passage"
ACTIVERAG_ABLATIONS = ("note", "passage")


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
    #: the LLM calls of one question, declared by each pipeline's config:
    #: generations (multiple choice), generations (open domain; None = the
    #: same), scoring passes (multiple choice)
    generations: ClassVar[int] = 0
    open_generations: ClassVar[int | None] = None
    scoring_passes: ClassVar[int] = 1

    top_k: int = 5
    query: str = "question"
    passage_format: str = "Passage {index}: {text}"
    answer_extraction: str = "full"

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_k, "top_k")
        if self.query not in ("question", "question_choices"):
            raise ValueError(f"query: expected 'question' or 'question_choices', got {self.query!r}")
        if not isinstance(self.passage_format, str):
            raise TypeError(f"passage_format: expected a string, got {type(self.passage_format).__name__}")
        try:
            self.passage_format.format(index=1, text="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"passage_format: only {{index}} and {{text}} may be used ({exc!r})") from None
        if self.answer_extraction not in ("final", "full"):
            raise ValueError(f"answer_extraction: expected 'final' or 'full', got {self.answer_extraction!r}")

    @property
    def generations_per_question(self) -> int:
        """Generations one multiple-choice question costs (open-domain mode
        may add the answer generation, see :meth:`open_generations_per_question`)."""
        return self.generations

    @property
    def open_generations_per_question(self) -> int:
        """Generations one open-domain question costs."""
        return self.generations_per_question if self.open_generations is None else self.open_generations

    @property
    def scoring_passes_per_question(self) -> int:
        """Scoring passes of one multiple-choice question (none in open-domain mode)."""
        return self.scoring_passes


@dataclass
class ActiveRAGConfig(RAGConfig):
    """ActiveRAG: knowledge construction agents + cognitive nexus.

    Attributes
    ----------
    agent : {"associate", "anchoring", "logician", "cognition", "all", "note", "passage"}
        The knowledge construction agent(s) to run (paper's main result:
        associate). ``"all"`` runs the four and combines them (see
        :class:`rcn_fast.pipelines.activerag.ActiveRAG`). The ablations of
        the paper's Table 3: ``"note"`` ("CoT w. Note": the passages refined
        into reading notes, then the cognitive nexus with the chain of
        thought) and ``"passage"`` ("CoT w. Passage": the raw passages go to
        the cognitive nexus; no construction call).
    nexus_context : {"conversation", "fresh"}
        ``"conversation"`` (default, the reference code): the cognitive
        nexus continues the agent's own chat -- its construction prompt and
        reply stay in context and the nexus instruction (which also quotes
        the construction, as the paper's Table 7 prompts do) comes as the
        next user turn. ``"fresh"``: the nexus is a new chat with the chain
        of thought and the construction only (fewer prompt tokens). The
        ``"passage"`` ablation has no construction chat: always fresh.
    """

    name: ClassVar[str] = "activerag"
    agent: str = "associate"
    nexus_context: str = "conversation"

    def __post_init__(self) -> None:
        super().__post_init__()
        allowed = [*ACTIVERAG_AGENTS, "all", *ACTIVERAG_ABLATIONS]
        if self.agent not in allowed:
            raise ValueError(f"agent: expected one of {allowed}, got {self.agent!r}")
        if self.nexus_context not in ("conversation", "fresh"):
            raise ValueError(f"nexus_context: expected 'conversation' or 'fresh', got {self.nexus_context!r}")

    @property
    def agents(self) -> tuple[str, ...]:
        return ACTIVERAG_AGENTS if self.agent == "all" else (self.agent,)

    @property
    def generations_per_question(self) -> int:
        """1 chain of thought + per agent 1 construction (none for
        ``"passage"``) and 1 nexus."""
        return 1 + sum(1 if a == "passage" else 2 for a in self.agents)

    @property
    def scoring_passes_per_question(self) -> int:
        """One answer-scoring pass per agent's nexus output."""
        return len(self.agents)


@dataclass
class RAGVanillaConfig(RAGConfig):
    """Vanilla RAG: the passages, then the question (multiple choice: one
    scoring pass; open domain: one answer generation)."""

    name: ClassVar[str] = "rag_vanilla"
    open_generations: ClassVar[int | None] = 1


@dataclass
class ChainOfNoteConfig(RAGConfig):
    """Chain-of-Note: one generation writes reading notes on the passages and
    then the answer."""

    name: ClassVar[str] = "chain_of_note"
    generations: ClassVar[int] = 1


@dataclass
class SelfRefineConfig(RAGConfig):
    """Self-Refine: summarise the passages (one generation), then answer with
    the summary in place of the passages."""

    name: ClassVar[str] = "self_refine"
    generations: ClassVar[int] = 1
    open_generations: ClassVar[int | None] = 2


@dataclass
class SelfRerankConfig(RAGConfig):
    """Self-Rerank: label each passage useful/useless and relevant/irrelevant
    (one generation), keep the useful ones, then answer with them.

    Attributes
    ----------
    unparsed : {"all", "none"}
        Passages kept when the labelling output names no passage at all
        (the model ignored the format): all of them, or none. When some
        passages are labelled, exactly the ones labelled useful are kept
        (possibly none).
    """

    name: ClassVar[str] = "self_rerank"
    generations: ClassVar[int] = 1
    open_generations: ClassVar[int | None] = 2
    unparsed: str = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.unparsed not in ("all", "none"):
            raise ValueError(f"unparsed: expected 'all' or 'none', got {self.unparsed!r}")


@dataclass
class CoTConfig(RAGConfig):
    """Chain of thought: one reasoning generation, then the answer.

    Attributes
    ----------
    use_passages : bool
        False (the paper's prompt-learning baseline): no retrieval. True:
        retrieve ``top_k`` passages and show them above the question in
        the one chain-of-thought call (rcn_fast's own variant; the paper's
        "CoT w. Passage" row of Table 3 passes the passages to a cognitive
        nexus after the chain of thought: ``activerag`` with
        ``agent="passage"``).
    """

    name: ClassVar[str] = "cot"
    generations: ClassVar[int] = 1
    use_passages: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _bool(self.use_passages, "use_passages")


@dataclass
class GuidelineConfig(RAGConfig):
    """Guideline: a chain of thought and a step-by-step guiding analysis (no
    final answer), then one generation that merges and checks them and
    answers. No retrieval."""

    name: ClassVar[str] = "guideline"
    generations: ClassVar[int] = 3


# ---------------------------------------------------------------- SEPTA (rcn_fast.septa)
@dataclass
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

