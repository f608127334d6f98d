"""Reporting an evaluation (lm-evaluation-harness conventions).

* :mod:`~rcn_fast.eval.report.results` -- the results JSON, the markdown
  table and the per-sample JSONL;
* :mod:`~rcn_fast.eval.report.table` -- the table's rows and notes;
* :mod:`~rcn_fast.eval.report.diagnostics` -- what distorts the numbers
  (label histograms, majority baseline, warnings, truncation, permutations);
* :mod:`~rcn_fast.eval.report.settings` -- the settings that tell runs apart;
* :mod:`~rcn_fast.eval.report.page` -- the results page (with
  :mod:`~rcn_fast.eval.report.page_data`, :mod:`~rcn_fast.eval.report.svg`,
  ``page.js`` and ``page.css``);
* :mod:`~rcn_fast.eval.report.plot` -- the bar chart;
* :mod:`~rcn_fast.eval.report.progress` -- progress bars while it runs.
"""
