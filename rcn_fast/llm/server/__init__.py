"""``python -m rcn_fast.serve``: a small OpenAI-compatible HTTP server over
rcn_fast's local backends.

* :mod:`~rcn_fast.llm.server.app` -- the server (routes, batching, streaming);
* :mod:`~rcn_fast.llm.server.limits` -- what one request may ask for, and how
  a running request is stopped;
* :mod:`~rcn_fast.llm.server.cli` -- the command line.
"""
