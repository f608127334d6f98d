"""Named settings of ReConnect: the ablations of the paper's Tables 3 and 7
(:data:`ABLATIONS`), the presets (:data:`PRESETS`; ``"reference"`` = the
authors' released code) and the named values of ``subset_size`` and
``score_scale``. :mod:`rcn_fast.pipelines.reconnect` (where
:class:`~rcn_fast.pipelines.ReConnectConfig` lives) re-exports every name.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rcn_fast._validate import check_choice


#: Subset sampling strategies: the paper's relevance sampling and Table 3's ablations.
SAMPLING_STRATEGIES = ("relevance", "random", "topk", "mmr", "cluster")


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
    # from the paper's defaults (the answer turn's end: its own rule on any chat
    # template); the rest of its behaviour is already the default here (query
    # parsing, answer prompt, sampler scale, k = choices)
    "reference": {"subset_size": SUBSET_TOP_N_PLUS_ONE, "max_new_tokens": 196, "repeat_decoding": "greedy",
                  "score_scale": SCALE_WIDTH, "sampler_input": "normalized", "first": "uniform",
                  "query_parsing": "reference", "answer_turn": "reference", "answer_render": "closed_turn",
                  "query": "question"},
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


def fill_preset(cfg: Any) -> None:
    """Direct construction with ``preset``: its settings fill the fields
    still at their dataclass defaults."""
    defaults = {f.name: f.default for f in fields(cfg)}
    for key, value in preset_settings(cfg.preset, cfg.sampling).items():  # type: ignore[arg-type]
        if getattr(cfg, key) == defaults[key]:
            setattr(cfg, key, value)


__all__ = ["ABLATIONS", "ablation_settings", "SAMPLING_STRATEGIES", "PRESETS", "preset_settings", "fill_preset",
           "SUBSET_TOP_N_PLUS_ONE", "SCALE_WIDTH"]
