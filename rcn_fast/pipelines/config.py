"""The base of every pipeline configuration, and reading/writing configs.

A pipeline's settings are a plain dataclass derived from
:class:`PipelineConfig`, defined beside the pipeline that reads them
(``ReConnectConfig`` in :mod:`rcn_fast.pipelines.reconnect`,
``RRConfig`` in :mod:`rcn_fast.pipelines.rr`, ...); ``rcn_fast.pipelines``
exports all of them. Every field is a setting recorded with each result.
``to_dict`` gives plain data; :func:`config_to_dict` adds the pipeline name
so a saved file can be read back with :func:`load_config`, which finds the
class in :data:`CONFIGS` (filled by :func:`rcn_fast.pipelines.register`
from each pipeline class's ``config_class``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from rcn_fast._validate import check_choice
from rcn_fast._validate import check_int as _int
from rcn_fast._validate import is_number, unknown_keys


#: Endings of the answer turn of a label-scoring pass (``PipelineConfig.answer_render``).
ANSWER_RENDERS = ("prefill", "closed_turn", "trailing_space")


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
    answer_render : {"prefill", "closed_turn", "trailing_space"}
        How the answer turn of every label-scoring pass ends, the same for
        every multiple-choice pipeline (the ReConnect authors' code ends
        its four pipelines' answers alike: the assistant reply
        ``"Answer: "`` rendered by one ``apply_chat_template`` call and cut
        by one rule). The turn is the answer prompt's pre-fill without
        trailing white space (``Answer:``), then: ``"prefill"`` (default)
        continued as it is -- the ids the reference code scores with
        Llama-3's template (it trims the reply and cuts the end-of-turn
        token); ``"closed_turn"`` -- the reference's rule on any chat
        template: ``Answer: `` rendered as a complete assistant message and
        cut where the template's end-of-turn token begins
        (:func:`rcn_fast.llm.chat.render_closed_turn`; with ChatML
        templates such as SmolLM2's the space stays); ``"trailing_space"``
        -- the pre-fill ``Answer: `` continued (rcn_fast's former answer
        turn of vanilla, single retrieval, ZEBRA, RR's fallback and the
        ActiveRAG family, for comparisons with earlier runs). See
        docs/FIDELITY.md ("One answer turn").
    """

    name: ClassVar[str] = ""

    prompts: str | dict | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int | None = None
    answer_render: str = "prefill"

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
        check_choice(self.answer_render, "answer_render", ANSWER_RENDERS)
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



#: Pipeline name -> its config class. Filled by :func:`rcn_fast.pipelines.register`
#: from each registered pipeline class's ``config_class`` (the one source).
CONFIGS: dict[str, type[PipelineConfig]] = {}



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
