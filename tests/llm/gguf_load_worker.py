"""The worker of tests/llm/test_gguf_mutation.py: loads each GGUF path read
from stdin on the native engine (and generates two tokens when it loads),
answering one JSON line per path. It runs in a process of its own, so a
crash (a signal) or a hang shows as the process dying or not answering,
never as the test runner dying."""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ["RCN_FAST_GGUF_CACHE"] = "0"  # no tokenizer cache entry per mutated file


def load(path: str) -> dict:
    from rcn_fast.llm.backends.engine import EngineConfig, GGUFError, GGUFLLM, NonFiniteLogitsError, UnsupportedModel

    try:
        llm = GGUFLLM(path, config=EngineConfig(num_threads=1, batch_size=2))
        out = llm.generate([[{"role": "user", "content": "Answer: A"}]], max_new_tokens=2)
        return {"outcome": "loaded", "text": out[0][0].text}
    except (GGUFError, UnsupportedModel, NonFiniteLogitsError) as exc:
        return {"outcome": "refused", "type": type(exc).__name__, "message": str(exc), "named": path in str(exc)}
    except BaseException as exc:  # noqa: BLE001 -- what the test must not see: reported, not raised
        return {"outcome": "error", "type": type(exc).__name__, "message": str(exc)[:2000],
                "traceback": traceback.format_exc()[-4000:]}


def main() -> None:
    try:  # a mutated size must never become a huge allocation: past this it is a MemoryError, reported
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    except (ImportError, ValueError, OSError):
        pass
    for line in sys.stdin:
        path = line.strip()
        if path:
            print(json.dumps(load(path)), flush=True)


if __name__ == "__main__":
    main()
