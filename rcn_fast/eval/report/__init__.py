"""Reporting an evaluation (lm-evaluation-harness conventions).

* :mod:`~rcn_fast.eval.report.results` -- the results JSON, the markdown
  table and the per-sample JSONL;
* :mod:`~rcn_fast.eval.report.plot` -- the bar chart;
* :mod:`~rcn_fast.eval.report.progress` -- progress bars while it runs.
"""
