"""``python -m rcn_fast.serve``: a small OpenAI-compatible HTTP server over
rcn_fast's local backends.

* :mod:`~rcn_fast.llm.server.app` -- the server (routes, the model queue);
* :mod:`~rcn_fast.llm.server.body` -- request bodies measured on their bytes
  before they are parsed, and the server-wide cap on the bytes in flight;
* :mod:`~rcn_fast.llm.server.limits` -- what one request may ask for;
* :mod:`~rcn_fast.llm.server.connections` -- timeouts, the first-come
  model lock, and how a running request is stopped;
* :mod:`~rcn_fast.llm.server.completion` -- one request's model work, as a
  JSON answer or a stream;
* :mod:`~rcn_fast.llm.server.streaming` -- incremental detokenisation, stop
  strings held back, server-sent events;
* :mod:`~rcn_fast.llm.server.responses` -- OpenAI's JSON shapes;
* :mod:`~rcn_fast.llm.server.metrics` -- ``/metrics`` and the request log;
* :mod:`~rcn_fast.llm.server.protocol` -- what a served model offers;
* :mod:`~rcn_fast.llm.server.cli` -- the command line.
"""
