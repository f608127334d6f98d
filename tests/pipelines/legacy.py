"""A record in the shape it had before issue 54 (the pinned digests of
tests/test_pipelines_call_pin.py and tests/test_reconnect_call_pin.py were
computed on that shape): the prediction's ``pred_label`` / ``gold`` named
``label`` / ``answer`` again, no ``gold_label``, and the trace without
what issue 54 added (retrieval scores and passages, the sampler's
relevance and probabilities, connect()'s given pool as a ``given`` entry,
``pred_label`` in ActiveRAG's combination). What remains must equal the
former records exactly: issue 54 added to the trace and renamed, nothing
else."""

from __future__ import annotations

import copy
from typing import Any

#: Fields the sampling entry gained with issue 54.
SAMPLE_FIELDS = ("pool", "relevance", "probability", "temperature", "draw_probability", "seed", "key", "first")


def legacy_trace(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in copy.deepcopy(trace):
        if e.get("type") == "retrieve" and e.get("source") == "given":
            e = {"stage": e["stage"], "type": "given", "given": e["given"], "pool": e["pool"]}
        elif e.get("type") == "retrieve" and e.get("stage") == "example_retrieval":
            e.pop("passages", None)
        elif e.get("type") == "retrieve" and e.get("stage") == "evidence":
            e["passages"] = [p["id"] for p in e["passages"]]
        elif e.get("type") == "retrieve" and "queries" in e:
            e.pop("scores", None)
            e.pop("passages", None)
        elif e.get("type") == "sample":
            for k in SAMPLE_FIELDS:
                e.pop(k, None)
        elif e.get("type") == "combine" and isinstance(e.get("agents"), list):
            e["agents"] = [{("label" if k == "pred_label" else k): v for k, v in a.items()} for a in e["agents"]]
        out.append(e)
    return out


def legacy_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A prediction's ``to_dict()`` (or a Connection's, with its
    ``prediction``) in the former shape."""
    rec = dict(rec)
    if "pred" in rec:
        rec = {("label" if k == "pred_label" else "answer" if k == "gold" else k): v
               for k, v in rec.items() if k != "gold_label"}
    if "trace" in rec:
        rec["trace"] = legacy_trace(rec["trace"])
    if isinstance(rec.get("prediction"), dict):
        rec["prediction"] = legacy_record(rec["prediction"])
    return rec
