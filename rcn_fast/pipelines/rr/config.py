"""Settings of self-consistency and RR (:class:`SelfConsistencyConfig`,
:class:`RRConfig`) and the constants they check against."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from rcn_fast._validate import check_bool as _bool
from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast._validate import is_number
from rcn_fast.pipelines.config import PipelineConfig
from rcn_fast.retrieval.bm25 import METHODS as BM25_METHODS

PAPER_SIMILARITY_MODEL = "sentence-transformers/all-mpnet-base-v2"


#: Sentence openings that mark a conclusion (RR skips them: not checked against evidence).
CONCLUSION_WORDS = ["thus", "therefore", "so", "yes", "no", "hence", "consequently", "in conclusion", "the answer",
                    "answer"]
FAITHFULNESS_FUNCTIONS = (1, 2, 3)


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
        check_choice(self.fallback, "fallback", ("score", "first"))
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
        check_choice(self.bm25_method, "bm25_method", BM25_METHODS)
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


__all__ = ["SelfConsistencyConfig", "RRConfig", "CONCLUSION_WORDS", "FAITHFULNESS_FUNCTIONS", "PAPER_SIMILARITY_MODEL",
           "BM25_METHODS"]
