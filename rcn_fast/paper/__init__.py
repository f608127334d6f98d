"""The ReConnect paper's tables: their values as package data, presets that run
their rows (``python -m rcn_fast.eval --paper table1``), and the report that
puts measured numbers beside the paper's.

* :func:`get_preset`, :func:`available_presets` -- the tables (:mod:`rcn_fast.paper.presets`).
* :func:`run_preset` -- run a table's rows and write ``paper_<table>.{md,json,png}``.
* :class:`PaperReport` -- the filled table (Markdown, JSON, figure).
"""

from rcn_fast.paper.presets import available_presets, get_preset, paper_tables
from rcn_fast.paper.report import Cell, PaperReport
from rcn_fast.paper.run import run_preset

__all__ = ["available_presets", "get_preset", "paper_tables", "run_preset", "PaperReport", "Cell"]
