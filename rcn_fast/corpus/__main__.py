"""Command line of the corpus store.

    python -m rcn_fast.corpus build --input FILE --encoder PATH --out DIR
        [--backend torch|onnx] [--dtype float16|float32] [--batch-size N] [--batch-tokens N]
        [--chunk-size N] [--num-shards S --shard-id I] [--id-field id]
        [--text-field text|contents] [--keep-duplicates] [--format jsonl|tsv|parquet] [--pooling mean|cls]
        [--query-prefix "query: "] [--passage-prefix "passage: "]
        [--max-length 512] [--quantize int8] [--device cpu|cuda] [--overwrite]
        [--encoder-dtype float32|float16|bfloat16] [--int8-copy] [--batches auto|packed|buckets|padded]
        [--executor local|ray [--ray-address ADDR] [--num-workers W]
         [--gpus-per-worker G] [--cpus-per-worker C]]
    python -m rcn_fast.corpus assemble --source NAME=PATH_OR_HUB_ID [--source ...] --out FILE
        [--exclude NAME] [--task TASK=FILE_OR_NAME ...] [--drop-leaks] [--dedup exact|near|none]
    python -m rcn_fast.corpus merge --out DIR SHARD_DIR [SHARD_DIR ...]
    python -m rcn_fast.corpus info DIR
    python -m rcn_fast.corpus verify DIR

``build`` runs ONNX Runtime on the CPU where it is installed (the torch
backend otherwise, and always on CUDA, in bfloat16 unless
``--encoder-dtype`` says otherwise); texts are sorted by length and
batched up to ``--batch-tokens`` padded tokens (default: 512 on the CPU,
from the free memory on a GPU), tokenised in background threads while
the encoder runs, and the chunks written by another thread. On CUDA a
BERT model runs rcn_fast's own BERT on packed tokens (no padding computed)
and the loop never waits on the device until a chunk's result is read;
``--batches buckets`` pads instead into length buckets of a few static
shapes, ``--batches padded`` to each batch's longest text (the CPU's
default, the bytes of transformers' ``BertModel``).
``--executor ray`` embeds with a Ray Data actor pool (one encoder per
worker; ``pip install "rcn_fast[ray]"``) on the cluster at ``--ray-address``
or ``RAY_ADDRESS`` (a local one when neither is set) and writes the same
store as the local build; input and ``--out`` must be on a filesystem every
node sees. Rerunning an interrupted ``build`` with the same arguments
(either executor) resumes it; a local build stopped by a record it cannot
read keeps nothing in ``--out`` (the fixed input is another input: the
same command then starts over); ``--overwrite`` discards what an earlier
build with other settings left in ``--out`` and starts over.
``--int8-copy`` also writes an int8 copy of the embeddings with the bounds
of the exact int8 bounded scan (rcn_fast.search.int8_files: the store's
FlatIndex then searches through it, with the same exact result).
Passages whose text repeats an earlier one are dropped (the first kept, the
count logged) unless ``--keep-duplicates``; the text is the ``text`` field,
else FlashRAG's ``contents``, unless ``--text-field`` names another.
Errors a user can fix (bad input, missing or corrupt files, an unwritable
``--out``) print one message and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

#: ``--batches``: the torch encoder's ``unpadded`` and ``buckets`` settings
BATCHES = {"auto": {}, "packed": {"unpadded": True}, "buckets": {"unpadded": False, "buckets": True},
           "padded": {"unpadded": False, "buckets": False}}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rcn_fast.corpus", description="Build and inspect corpus stores.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="embed a corpus file into a store directory (resumable)")
    b.add_argument("--input", required=True, help="JSON lines, TSV (header row) or Parquet file")
    b.add_argument("--encoder", required=True, help="model directory, installed model package or Hugging Face id "
                   "(downloaded unless HF_HUB_OFFLINE=1)")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--format", choices=["jsonl", "tsv", "parquet"], default=None)
    b.add_argument("--id-field", default="id")
    b.add_argument("--text-field", default=None,
                   help="field of the passage text (default: text, else FlashRAG's contents, whichever the file has)")
    b.add_argument("--keep-duplicates", action="store_true",
                   help="keep passages whose text repeats an earlier one (default: keep the first, drop the rest "
                   "and log how many)")
    b.add_argument("--backend", choices=["torch", "onnx"], default=None,
                   help="default: onnx on the CPU where onnxruntime is installed (torch for a half-precision "
                   "--encoder-dtype), else torch")
    b.add_argument("--device", default=None)
    b.add_argument("--quantize", choices=["int8"], default=None,
                   help="ONNX on CPU: dynamic int8 weights (per-row cosine to fp32 >= 0.98)")
    b.add_argument("--onnx-cache", default=None, help="ONNX export cache dir ('model' = inside the model dir)")
    b.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                   help="storage dtype of the embeddings")
    b.add_argument("--encoder-dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="torch encoder weights/activations (default: bfloat16 on CUDA, else float32; float16 on "
                   "CUDA only; recorded in the manifest)")
    b.add_argument("--batches", choices=list(BATCHES), default="auto",
                   help="torch backend: packed tokens with variable-length attention, padded length buckets "
                   "of static shapes, or batches padded to their longest text (default auto: packed on CUDA "
                   "for BERT models, else padded; buckets for other models on CUDA)")
    b.add_argument("--batch-size", type=int, default=None,
                   help="texts per forward pass at most (default: as many as --batch-tokens holds)")
    b.add_argument("--batch-tokens", type=int, default=None,
                   help="padded tokens per forward pass (default: 512 on the CPU, from free memory on a GPU)")
    b.add_argument("--chunk-size", type=int, default=4096, help="records per resumable chunk")
    b.add_argument("--num-shards", type=int, default=1)
    b.add_argument("--shard-id", type=int, default=0)
    b.add_argument("--pooling", choices=["mean", "cls"], default=None)
    b.add_argument("--no-normalize", action="store_true", help="store raw (un-normalised) embeddings")
    b.add_argument("--query-prefix", default=None)
    b.add_argument("--passage-prefix", default=None)
    b.add_argument("--max-length", type=int, default=None)
    b.add_argument("--keep-parts", action="store_true")
    b.add_argument("--overwrite", action="store_true",
                   help="discard an earlier (unfinished or finished) build in --out and start over")
    b.add_argument("--no-progress", action="store_true")
    b.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: this process; ray: a Ray Data actor pool (pip install \"rcn_fast[ray]\")")
    b.add_argument("--ray-address", default=None, help="Ray cluster to join (default: RAY_ADDRESS, else a "
                   "local cluster)")
    b.add_argument("--num-workers", type=int, default=None,
                   help="encoder actors (default: as many as the cluster's GPUs or CPUs allow)")
    b.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs per actor (> 0: device cuda)")
    b.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs per actor")
    b.add_argument("--int8-copy", action="store_true",
                   help="also write the int8 copy of the embeddings for the exact int8 bounded search "
                   "(rows of at most 1024 values)")
    from rcn_fast.corpus.assemble import add_parser as add_assemble_parser

    add_assemble_parser(sub)
    m = sub.add_parser("merge", help="join the directories of a sharded build into one store")
    m.add_argument("--out", required=True)
    m.add_argument("shards", nargs="+")
    i = sub.add_parser("info", help="summarise a store")
    i.add_argument("dir")
    v = sub.add_parser("verify", help="check every file of a store against its manifest checksums")
    v.add_argument("dir")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from rcn_fast.retrieval.build import BuildConfig, build_corpus, merge_shards
    from rcn_fast.retrieval.conventions import EmptyInputError
    from rcn_fast.retrieval.store import CorpusStore

    try:
        if args.cmd == "assemble":
            from rcn_fast.corpus.assemble import run as run_assemble

            return run_assemble(args)
        if args.cmd == "build":
            from rcn_fast.retrieval.encoders import Encoder

            cfg = BuildConfig(input=args.input, out=args.out, format=args.format, id_field=args.id_field,
                              text_field=args.text_field, dtype=args.dtype, batch_size=args.batch_size,
                              chunk_size=args.chunk_size, num_shards=args.num_shards, shard_id=args.shard_id,
                              keep_parts=args.keep_parts, overwrite=args.overwrite,
                              keep_duplicates=args.keep_duplicates)
            from rcn_fast.retrieval.encoders.onnx import corpus_backend

            device = "cuda" if args.executor == "ray" and args.gpus_per_worker > 0 and args.device is None \
                else args.device
            backend = args.backend or corpus_backend(device, args.quantize, args.encoder_dtype)
            enc_kw = dict(backend=backend, device=device, quantize=args.quantize,
                          cache_dir=args.onnx_cache, pooling=args.pooling,
                          normalize=False if args.no_normalize else None, query_prefix=args.query_prefix,
                          passage_prefix=args.passage_prefix, max_length=args.max_length,
                          batch_tokens=args.batch_tokens, dtype=args.encoder_dtype, **BATCHES[args.batches],
                          **({"batch_size": args.batch_size} if args.batch_size else {}))
            if args.executor == "ray":
                from rcn_fast.retrieval.build_ray import build_corpus_ray, import_ray
                from rcn_fast.retrieval.encoders import EncoderConfig

                import_ray()  # before any work: say how to install it
                store = build_corpus_ray(
                    cfg, EncoderConfig(model=args.encoder, **enc_kw), ray_address=args.ray_address,
                    num_workers=args.num_workers, gpus_per_worker=args.gpus_per_worker,
                    cpus_per_worker=args.cpus_per_worker, show_progress=not args.no_progress)
            else:
                from rcn_fast.eval.report.progress import quiet_loading

                with quiet_loading(args.no_progress, gguf=False):  # --no-progress: no loading bars either
                    enc = Encoder.from_pretrained(args.encoder, **enc_kw)
                store = build_corpus(cfg, enc, show_progress=not args.no_progress)
            if store is None:
                print(f"shard {cfg.shard_id}/{cfg.num_shards} done in {cfg.out}; join the shards with "
                      f"`python -m rcn_fast.corpus merge --out DIR SHARD_DIRS...`")
            else:
                if args.int8_copy:
                    from rcn_fast.search.int8_files import load_int8_copy, write_int8_copy

                    try:
                        current = load_int8_copy(store.path)
                    except ValueError:  # a copy of other embeddings: written again
                        current = None
                    if current is None:
                        copy = write_int8_copy(store.path)
                        logging.getLogger(__name__).info("int8 copy written: %d rows, %d columns", len(copy),
                                                         copy.width)
                print(json.dumps(store.info(), indent=2))
        elif args.cmd == "merge":
            store = merge_shards(args.shards, args.out)
            print(json.dumps(store.info(), indent=2))
        elif args.cmd == "info":
            print(json.dumps(CorpusStore.open(args.dir).info(), indent=2))
        elif args.cmd == "verify":
            CorpusStore.open(args.dir, verify=True)
            print(f"{args.dir}: all files match the manifest")
    except EmptyInputError as exc:  # say how the file came to be empty when assemble wrote it
        from rcn_fast.corpus.assemble import explain_empty

        why = explain_empty(exc.path)
        print(f"error: {EmptyInputError(exc.path, why) if why else exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError, ImportError) as exc:  # OSError: FileNotFoundError, PermissionError, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
