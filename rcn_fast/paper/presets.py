"""The ReConnect paper's tables as evaluation presets.

Each preset says, for one table of the paper (its values are package data,
``reconnect_tables.json``), which rcn_fast pipeline and settings reproduce
each row and which task each column is. A row rcn_fast does not implement
(RACo, FLARE, DRAGIN, Self-Talk, GKP, Rainier, Crystal, COCONUT) keeps its
place in the report with the reason it is not run. The model, corpus, KB and
encoder are the user's (``--model``, ``--corpus``, ``--kb``, ``--encoder``);
Table 6's retriever rows each need their own store (``--paper-corpus
raco=DIR dpr=DIR zebra=DIR``, a store embedded with that retriever).

Three seeds (0, 1, 2) by default, as App. A.1 averages over three seeds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

TABLES_FORMAT = "rcn_fast.paper.tables/1"
DEFAULT_SEEDS = (0, 1, 2)

#: Column label of the paper -> rcn_fast task name.
TASK_OF_COLUMN = {
    "ARC-E": "arc-easy", "ARC-C": "arc-challenge", "PIQA": "piqa", "CSQA2": "csqa2", "CSQA": "csqa",
    "QASC": "qasc", "OBQA": "obqa", "WG": "winogrande", "SCT": "storycloze", "HellaSwag": "hellaswag",
    "NS": "numersense", "QuaRTz": "quartz", "Quartz": "quartz", "RS": "riddlesense", "SciQ": "sciq", "WSC": "wsc",
    "QuaRel": "quarel",
}
ID_TASKS = ("arc-easy", "arc-challenge", "piqa", "csqa2", "csqa", "qasc", "obqa", "winogrande")
OOD_TASKS = ("storycloze", "hellaswag", "numersense", "quartz", "riddlesense", "sciq", "wsc", "quarel")
#: Table 9 averages over "four commonsense reasoning benchmarks" it does not name; these are rcn_fast's choice.
COST_TASKS = ("arc-challenge", "csqa", "obqa", "piqa")
#: Averaged columns of Tables 3, 6 and 7 -> the tasks averaged.
AVERAGE_COLUMNS = {"ID.": ID_TASKS, "OOD.": OOD_TASKS}

NOT_IMPLEMENTED = "not implemented in rcn_fast"


@dataclass(frozen=True)
class RowRun:
    """How one row of a table runs: a pipeline, its settings, what it needs beyond the user's inputs."""

    pipeline: str
    args: tuple[tuple[str, Any], ...] = ()
    corpus_key: str | None = None  # Table 6: the --paper-corpus entry this row retrieves from

    @property
    def pipeline_args(self) -> dict[str, Any]:
        return dict(self.args)

    def slug(self) -> str:
        """A stable label of this run (its pipeline and settings)."""
        parts = [self.pipeline] + [f"{k}={v}" for k, v in self.args] + ([f"corpus={self.corpus_key}"]
                                                                          if self.corpus_key else [])
        return ",".join(parts)


def _rc(*args: tuple[str, Any], corpus_key: str | None = None) -> RowRun:
    return RowRun("reconnect", tuple(args), corpus_key)


#: Method label of the paper -> how rcn_fast runs it (None: not implemented).
RUN_OF_METHOD: dict[str, RowRun | None] = {
    "Llama 3.1-8B Instruct": RowRun("vanilla"), "Mistral-7B Instruct": RowRun("vanilla"),
    "Single Retrieval": RowRun("single_retrieval"), "Single RAG": RowRun("single_retrieval"),
    "ZEBRA (2024)": RowRun("zebra"), "ZEBRA": RowRun("zebra"),
    "RECONNECT (Ours)": _rc(), "RECONNECT w/ Relevance (Ours)": _rc(),
    "RECONNECT w/o ER": _rc(("reconnect.ablation", "w/o ER")),
    "RECONNECT w/o KC": _rc(("reconnect.ablation", "w/o KC")),
    "RECONNECT w/o ER, KC": _rc(("reconnect.ablation", "w/o ER, KC")),
    "RECONNECT w/ Cluster": _rc(("reconnect.sampling", "cluster")),
    "RECONNECT w/ MMR": _rc(("reconnect.sampling", "mmr")),
    "RECONNECT w/ Top-K": _rc(("reconnect.sampling", "topk")),
    "RECONNECT w/ Random": _rc(("reconnect.sampling", "random")),
    "RECONNECT w/o KE": _rc(("reconnect.ablation", "w/o KE")),
    "RECONNECT w/o KA": _rc(("reconnect.ablation", "w/o KA")),
    "RECONNECT w/o KE, KA": _rc(("reconnect.ablation", "w/o KE, KA")),
    "RECONNECT w/ RACo": _rc(corpus_key="raco"), "RECONNECT w/ DPR": _rc(corpus_key="dpr"),
    "RECONNECT w/ ZEBRA": _rc(corpus_key="zebra"),
    **{f"RECONNECT (N={n})": _rc(("reconnect.num_subsets", n)) for n in (1, 2, 3, 5, 7)},
    **{m: None for m in ("RACo (2022)", "FLARE (2023)", "DRAGIN (2024)", "Self-Talk (2020)", "GKP (2022b)",
                         "Rainier (2022a)", "Crystal (2023)", "COCONUT (2024)")},
}

#: Table 6's retrievers: the public checkpoints each row corresponds to (docs/paper.md).
TABLE6_RETRIEVERS = {
    "raco": "RACo's commonsense DPR retriever (Yu et al., 2022), trained on commonsense datasets",
    "dpr": "intfloat/e5-base-v2 without fine-tuning (the paper calls this backbone 'DPR')",
    "zebra": "sapienzanlp/zebra-retriever-e5-base-v2 (ZEBRA's question-similarity retriever)",
}


@dataclass(frozen=True)
class Preset:
    """One table: its paper values and how each row and column runs."""

    name: str
    title: str
    model: str
    kind: str  # "accuracy" or "cost"
    columns: tuple[str, ...]
    rows: tuple[str, ...]
    paper: dict[str, tuple[float, ...]] = field(hash=False)
    note: str | None = None

    def tasks(self) -> tuple[str, ...]:
        """Every task this table's cells are computed from, in column order."""
        out: list[str] = []
        for col in self.columns:
            for t in column_tasks(self, col):
                if t not in out:
                    out.append(t)
        return tuple(out)

    def run_of(self, row: str) -> RowRun | None:
        return RUN_OF_METHOD.get(row)


def column_tasks(preset: Preset, column: str) -> tuple[str, ...]:
    """The tasks whose accuracies make one cell of ``column`` (one task, or the averaged ones)."""
    if preset.kind == "cost":
        return COST_TASKS
    if column in AVERAGE_COLUMNS:
        return AVERAGE_COLUMNS[column]
    if column == "Avg.":
        return tuple(TASK_OF_COLUMN[c] for c in preset.columns if c != "Avg.")
    return (TASK_OF_COLUMN[column],)


@lru_cache(maxsize=1)
def paper_tables() -> dict[str, Any]:
    """The paper's values (package data ``reconnect_tables.json``)."""
    text = resources.files("rcn_fast.paper").joinpath("reconnect_tables.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    if doc.get("format") != TABLES_FORMAT:
        raise ValueError(f"rcn_fast/paper/reconnect_tables.json: format {doc.get('format')!r}, expected {TABLES_FORMAT!r}")
    return doc


def available_presets() -> list[str]:
    return sorted(paper_tables()["tables"], key=lambda k: int(k.removeprefix("table")))


def get_preset(name: str) -> Preset:
    """The preset of a table (``"table1"``, ``"table2"``, ``"table3"``, ``"table6"``,
    ``"table7"``, ``"table9"``, ``"table10"``); ValueError naming ``--paper`` otherwise."""
    tables = paper_tables()["tables"]
    key = str(name).lower().replace(" ", "").replace("_", "")
    if key.isdigit():
        key = f"table{key}"
    if key not in tables:
        raise ValueError(f"--paper: unknown table {name!r}; available: {', '.join(available_presets())}")
    t = tables[key]
    return Preset(name=key, title=t["title"], model=t["model"], kind=t["kind"], columns=tuple(t["columns"]),
                  rows=tuple(r["method"] for r in t["rows"]),
                  paper={r["method"]: tuple(r["values"]) for r in t["rows"]}, note=t.get("note"))
