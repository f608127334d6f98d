"""Pipeline configurations: plain dataclasses, JSON/YAML serialisable.

Every field is a setting recorded with each result. ``to_dict`` gives plain
data; :func:`config_to_dict` adds the pipeline name so a saved file can be
read back with :func:`load_config`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

SAMPLING_STRATEGIES = ("relevance", "random", "topk", "mmr", "cluster")


def _int(v: Any, name: str, minimum: int = 1, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}{' or None' if allow_none else ''}, got {v!r}")


def _bool(v: Any, name: str) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected true or false, got {v!r}")


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
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature: expected a number >= 0, got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        _int(self.seed, "seed", 0)
        _int(self.batch_size, "batch_size", 1, allow_none=True)
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PipelineConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"config: unknown {cls.name or 'pipeline'} setting(s) {sorted(unknown)}; "
                             f"known: {sorted(known)}")
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

    Attributes
    ----------
    top_n : int
        Passages retrieved per query (paper: n = 5).
    num_subsets : int
        N, document subsets per question (paper: 3); one extraction each.
    subset_size : int
        K, documents per subset (paper: 5).
    tau : float
        Softmax temperature of the relevance sampler (paper: 1.0).
    sampling : {"relevance", "random", "topk", "mmr", "cluster"}
        Subset strategy (ReConnect's Table 3).
    first : {"uniform", "relevance"}
        How the relevance sampler draws the first document of a subset.
    sampler_input : {"stored", "normalized"}
        Embeddings the sampler sees: as the retriever stores them, or
        L2-normalised (then a tau near 0.05 behaves like raw E5 vectors
        with tau = 1; see METHODS.md).
    mmr_lambda : float
        Relevance weight of the ``"mmr"`` strategy.
    max_queries : int or None
        Explanation lines kept as queries; None = the number of choices.
    query : {"question", "question_choices"}
        The text of the question query Q.
    explanation_retrieval : bool
        False = ablation "w/o ER": retrieve with the question only (no
        query-expansion generation).
    knowledge_connection : bool
        False = "w/o KC": no subsets; all pooled passages go to one
        extraction.
    knowledge_extraction : bool
        False = "w/o KE": no extraction; aggregate directly from the
        sampled passages (their union, in draw order).
    knowledge_aggregation : bool
        False = "w/o KA": no aggregation; answer with the explanations of
        all extractions as a list.
    """

    name: ClassVar[str] = "reconnect"
    top_n: int = 5
    num_subsets: int = 3
    subset_size: int = 5
    tau: float = 1.0
    sampling: str = "relevance"
    first: str = "uniform"
    sampler_input: str = "stored"
    mmr_lambda: float = 0.5
    max_queries: int | None = None
    query: str = "question"
    explanation_retrieval: bool = True
    knowledge_connection: bool = True
    knowledge_extraction: bool = True
    knowledge_aggregation: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _int(self.top_n, "top_n")
        _int(self.num_subsets, "num_subsets")
        _int(self.subset_size, "subset_size")
        _int(self.max_queries, "max_queries", 0, allow_none=True)
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)) or not self.tau > 0:
            raise ValueError(f"tau: expected a number > 0, got {self.tau!r}")
        self.tau = float(self.tau)
        if self.sampling not in SAMPLING_STRATEGIES:
            raise ValueError(f"sampling: expected one of {list(SAMPLING_STRATEGIES)}, got {self.sampling!r}")
        if self.first not in ("uniform", "relevance"):
            raise ValueError(f"first: expected 'uniform' or 'relevance', got {self.first!r}")
        if self.sampler_input not in ("stored", "normalized"):
            raise ValueError(f"sampler_input: expected 'stored' or 'normalized', got {self.sampler_input!r}")
        if not isinstance(self.mmr_lambda, (int, float)) or not 0 <= self.mmr_lambda <= 1:
            raise ValueError(f"mmr_lambda: expected a number in [0, 1], got {self.mmr_lambda!r}")
        if self.query not in ("question", "question_choices"):
            raise ValueError(f"query: expected 'question' or 'question_choices', got {self.query!r}")
        for f in ("explanation_retrieval", "knowledge_connection", "knowledge_extraction", "knowledge_aggregation"):
            _bool(getattr(self, f), f)

    @property
    def generations_per_question(self) -> int:
        """LLM generations one question costs under these settings."""
        n = int(self.explanation_retrieval)
        if self.knowledge_extraction:
            n += self.num_subsets if self.knowledge_connection else 1
        return n + int(self.knowledge_aggregation)


# Named ablations of ReConnect's Table 2 -> the settings they switch off.
ABLATIONS: dict[str, dict[str, Any]] = {
    "w/o ER": {"explanation_retrieval": False},
    "w/o KC": {"knowledge_connection": False},
    "w/o KE": {"knowledge_extraction": False},
    "w/o KA": {"knowledge_aggregation": False},
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


CONFIGS: dict[str, type[PipelineConfig]] = {
    c.name: c for c in (VanillaConfig, SingleRetrievalConfig, ReConnectConfig, ZebraConfig)
}


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
