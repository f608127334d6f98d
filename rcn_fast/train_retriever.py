"""Train an explanation- or concept-based retriever (see :mod:`rcn_fast.retrieval.train`).

    python -m rcn_fast.train_retriever --train FILE --base MODEL --out DIR [...]

From ZEBRA-KB's public releases (ReConnect App. A.3), joining explanations
and questions by id first (:mod:`rcn_fast.retrieval.zebra_kb`)::

    python -m rcn_fast.train_retriever \\
        --train hub:sapienzanlp/zebra-kb-explanations:all \\
        --questions hub:sapienzanlp/zebra-kb --base intfloat/e5-base-v2 --out DIR

(``--train`` and ``--questions`` may be repeated; the joined file is
``DIR/zebra_kb_train.jsonl``), or the join alone::

    python -m rcn_fast.train_retriever prepare --train SRC [--train SRC] \\
        --questions SRC [--questions SRC] --out FILE
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rcn_fast.retrieval.train import build_parser
from rcn_fast.retrieval.train import main as train_main

JOINED_FILE = "zebra_kb_train.jsonl"


def _join_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Join ZEBRA-KB explanations with their questions by id.")
    p.add_argument("--train", action="append", required=True, metavar="SRC",
                   help="explanation records: hub:sapienzanlp/zebra-kb-explanations[:CONFIG] or a .jsonl/.parquet file")
    p.add_argument("--questions", action="append", required=True, metavar="SRC",
                   help="ZEBRA-KB questions: hub:OWNER/NAME, a documents.jsonl file or folder, or a CSQA-layout file")
    p.add_argument("--out", required=True)
    return p


def _join(train: list[str], questions: list[str], out: Path) -> int:
    from rcn_fast.retrieval.zebra_kb import prepare_explanation_training

    try:
        stats = prepare_explanation_training(train, questions, out)
    except (ValueError, OSError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(stats.to_dict()))
    if stats.records == 0:
        print(f"error: no explanation matched a question by id ({stats.unmatched_explanation_ids} unmatched); "
              "check that --questions covers the tasks of --train", file=sys.stderr)
        return 2
    return 0


def _help_parser() -> argparse.ArgumentParser:
    """The training flags, plus ``--questions`` and the ``prepare`` subcommand
    this entry point adds (what ``--help`` shows)."""
    p = build_parser()
    p.add_argument("--questions", action="append", metavar="SRC",
                   help="ZEBRA-KB questions to join with --train by id first (repeatable; the joined file is "
                        f"OUT/{JOINED_FILE}, reused when a run resumes)")
    p.epilog = ("The join alone: python -m rcn_fast.train_retriever prepare --train SRC --questions SRC --out FILE "
                "(prepare --help).")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["prepare"] and any(a in ("-h", "--help") for a in argv):
        _help_parser().parse_args(["--help"])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if argv[:1] == ["prepare"]:
        args = _join_parser("python -m rcn_fast.train_retriever prepare").parse_args(argv[1:])
        return _join(args.train, args.questions, Path(args.out))
    if not any(a == "--questions" or a.startswith("--questions=") for a in argv):
        return train_main(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--train", action="append", default=[])
    pre.add_argument("--questions", action="append", default=[])
    pre.add_argument("--out")
    known, rest = pre.parse_known_args(argv)
    if not known.out:
        print("error: --out: required", file=sys.stderr)
        return 2
    joined = Path(known.out) / JOINED_FILE
    if not joined.exists():  # a resumed run reuses the join of the first
        rc = _join(known.train, known.questions, joined)
        if rc:
            return rc
    return train_main(rest + ["--train", str(joined), "--out", known.out, "--mode", "explanation"])


if __name__ == "__main__":
    sys.exit(main())
