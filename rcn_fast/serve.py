"""``python -m rcn_fast.serve --model SPEC``: a small OpenAI-compatible HTTP
server over rcn_fast's local LLM backend (see :mod:`rcn_fast.llm.server.app` and its
command line, :mod:`rcn_fast.llm.server.cli`)."""

from rcn_fast.llm.server.cli import main

if __name__ == "__main__":
    main()
