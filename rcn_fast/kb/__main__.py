"""``python -m rcn_fast.kb``: build a silver example KB, or turn a KB into a
corpus input.

    python -m rcn_fast.kb build-silver --train FILE --llm SPEC --out FILE
    python -m rcn_fast.kb to-corpus --kb FILE --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rcn_fast.kb", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("build-silver", help="ZEBRA's silver KB from a training split (resumable)")
    s.add_argument("--train", required=True, help="questions (CommonsenseQA JSON lines, a directory, or a dataset name)")
    s.add_argument("--split", default=None, help="split, when --train is a directory or dataset name")
    s.add_argument("--llm", required=True, help="model spec for rcn_fast.llm.load_llm (path, package:NAME, openai:URL#MODEL)")
    s.add_argument("--out", required=True, help="output KB file (JSON lines); rerun the same command to resume")
    s.add_argument("--limit", type=int, default=None, help="first N questions only")
    s.add_argument("--batch-size", type=int, default=16, help="questions per LLM call")
    s.add_argument("--max-new-tokens", type=int, default=256)
    s.add_argument("--prompts", default=None, help="prompt file overriding the silver_explanations template")
    s.add_argument("--cache", default=None, help="LLM call cache (directory or .sqlite)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    c = sub.add_parser("to-corpus", help="KB -> corpus input for python -m rcn_fast.corpus build")
    c.add_argument("--kb", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--per-example", action="store_true", help="one passage per example (default: per explanation)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "build-silver":
        from rcn_fast.data import load_questions
        from rcn_fast.kb.silver import build_silver
        from rcn_fast.llm import load_llm

        questions = load_questions(args.train, split=args.split, limit=args.limit)
        llm = load_llm(args.llm, **({"cache": args.cache} if args.cache else {}))
        res = build_silver(questions, llm, args.out, prompts=args.prompts, batch_size=args.batch_size,
                           max_new_tokens=args.max_new_tokens, show_progress=not args.no_progress)
        print(json.dumps({"written": res.written, "resumed": res.resumed, "no_answer": res.no_answer,
                          "total": res.total, "out": res.path}))
        return 0
    from rcn_fast.kb import ExampleKB

    recs = ExampleKB.load(args.kb).corpus_records(per_explanation=not args.per_example)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(json.dumps({"passages": len(recs), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
