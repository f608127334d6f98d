"""Corpus build on Ray Data: the same store as :func:`build_corpus`, embedded
by an actor pool spread over a Ray cluster.

The driver hashes and scans the input once (:func:`scan_input`: the byte or
row range of every chunk), checks ``out`` and writes ``build.json`` exactly
as the local build does (:func:`prepare_build`). The chunks not yet in
``parts/`` become a Ray dataset of chunk descriptors, mapped by a pool of
actors: each actor loads the encoder once (from its
:class:`EncoderConfig`, never a pickled model), reads only its chunks'
bytes from the input, embeds them and writes ``parts/chunk-XXXXXXXX.npz``
atomically (:func:`write_chunk`). The driver shows progress and joins the
chunks (:func:`finish_build`). The chunk files, ``build.json`` and the
store files are those of a local build byte for byte, so a build started on
Ray can be resumed locally and the other way round; the manifest differs
only in ``built_at`` and ``executor``.

The input file and ``out`` must be on a filesystem every Ray node sees at
the same path (NFS, Lustre, GPFS...), and the encoder's model directory
too (or an installed model package / hub id every node can load).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from rcn_fast.retrieval.build import (
    THROTTLE_ENV,
    BuildConfig,
    finish_build,
    keeping_nothing_on_bad_input,
    log_encoded,
    prepare_build,
    progress_bar,
)
from rcn_fast.retrieval.build_pipeline import embed_texts
from rcn_fast.retrieval.conventions import InputError
from rcn_fast.retrieval.corpus_input import ChunkSpan, read_chunk
from rcn_fast.retrieval.store import CorpusStore, write_chunk

logger = logging.getLogger("rcn_fast.retrieval")
RAY_HINT = 'pip install "rcn_fast[ray]"  (Ray Data: ray[data]>=2.9)'


def import_ray() -> Any:
    """``import ray`` and ``ray.data``, or ImportError with the install command."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--executor ray needs Ray Data, which is not installed ({exc}); {RAY_HINT}") from None
    return ray


def describe_encoder(encoder_config: Any) -> dict[str, Any]:
    """The ``describe()`` of the encoder a config builds, without loading its
    weights (the driver may have no GPU and little memory: only the
    tokenizer, the model config and the model files' fingerprint are read).
    """
    from rcn_fast.retrieval.encoders import Encoder, EncoderConfig

    cfg = EncoderConfig.from_dict(encoder_config) if isinstance(encoder_config, dict) else encoder_config
    return Encoder(cfg).describe()  # the base class loads no weights


class _ChunkEmbedder:
    """Ray Data actor: one encoder per actor; embeds whole chunks."""

    def __init__(self, encoder_config: dict[str, Any], expected: dict[str, Any], build: dict[str, Any],
                 throttle: float) -> None:
        from rcn_fast.retrieval.encoders import Encoder

        self.encoder = Encoder.from_config(encoder_config)
        got = {k: v for k, v in self.encoder.describe().items() if k != "model_dir"}
        if got != expected:
            diff = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
            raise ValueError(f"encoder: on this Ray node the encoder differs from the driver's in {diff} "
                             "(other model files?)")
        self.b = build
        self.dim = int(expected["dim"])
        self.throttle = throttle

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from pathlib import Path

        b = self.b
        counts = []
        for k in range(len(batch["chunk"])):
            span = ChunkSpan(*(int(batch[f][k]) for f in ("chunk", "start", "stop", "first", "count")))
            ids, texts = read_chunk(b["input"], b["format"], span, b["id_field"], b["text_field"])
            emb = embed_texts(self.encoder, texts, b["batch_size"])  # the local build's batches
            write_chunk(Path(b["parts"]), span.chunk, ids, texts, emb, dim=self.dim, dtype=b["dtype"])
            counts.append(len(ids))
            if self.throttle:
                time.sleep(self.throttle)
        return {"chunk": np.asarray(batch["chunk"], dtype=np.int64), "count": np.asarray(counts, dtype=np.int64)}


def build_corpus_ray(config: BuildConfig, encoder_config: Any, *, ray_address: str | None = None,
                     num_workers: int | None = None, gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0,
                     show_progress: bool = True) -> CorpusStore:
    """Embed a corpus on a Ray cluster (see the module docstring).

    Parameters
    ----------
    config : BuildConfig
        ``num_shards`` must be 1: the actor pool replaces manual shards.
    encoder_config : EncoderConfig or dict
        How each actor loads its encoder (:meth:`Encoder.from_config`).
        With ``gpus_per_worker > 0`` and no ``device``, actors use
        ``"cuda"``.
    ray_address : str or None
        Cluster to join (``ray.init(address=...)``); None: ``RAY_ADDRESS``
        when set, else a local cluster. When Ray is already initialised in
        this process that connection is used and left open.
    num_workers : int or None
        Encoder actors. None: as many as the cluster's GPUs
        (``gpus_per_worker > 0``) or CPUs allow, at most one per chunk.
    gpus_per_worker, cpus_per_worker : float
        Resources of each actor (fractions share a device).
    show_progress : bool
        tqdm bar (docs/s) on stderr.

    Returns
    -------
    CorpusStore
        Identical to the local build's in ids, order, texts and
        embeddings (equal file checksums).

    Raises
    ------
    ImportError
        Ray Data is not installed (the message says how to install it).
    ValueError
        Bad settings, an ``out`` built with other settings, or bad input
        (the first error a worker met).
    """
    from rcn_fast.retrieval.encoders import EncoderConfig

    ray = import_ray()
    cfg = config
    if cfg.num_shards != 1:
        raise ValueError("executor ray: num_shards must be 1 (the Ray actor pool spreads the chunks; "
                         "drop --num-shards/--shard-id)")
    enc_cfg = EncoderConfig.from_dict(dict(encoder_config)) if isinstance(encoder_config, dict) \
        else EncoderConfig.from_dict(encoder_config.to_dict())
    if gpus_per_worker < 0 or cpus_per_worker < 0 or (gpus_per_worker == 0 and cpus_per_worker == 0):
        raise ValueError("gpus_per_worker, cpus_per_worker: expected >= 0, not both 0")
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                    or num_workers < 1):
        raise ValueError(f"num_workers: expected a positive int or None, got {num_workers!r}")
    if gpus_per_worker > 0 and enc_cfg.device is None:
        enc_cfg.device = "cuda"
    if str(enc_cfg.device or "cpu").startswith("cuda") and gpus_per_worker <= 0:
        raise ValueError("device cuda needs gpus_per_worker > 0 (Ray hides GPUs from actors that reserve none)")
    if enc_cfg.intra_op_threads is None and gpus_per_worker == 0:
        enc_cfg.intra_op_threads = max(1, int(cpus_per_worker))
    desc = describe_encoder(enc_cfg)
    fresh = not os.path.exists(cfg.out)
    prep = prepare_build(cfg, desc)
    if prep.store is not None:
        return prep.store

    with keeping_nothing_on_bad_input(prep, fresh):  # the local build's rule: bad input keeps nothing
        started = False
        if not ray.is_initialized():
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=False)
            started = True
        try:
            if prep.todo:
                _run_pool(ray, prep, cfg, enc_cfg, desc, num_workers, gpus_per_worker, cpus_per_worker, show_progress)
        finally:
            if started:
                ray.shutdown()
        return finish_build(prep, cfg, executor="ray")


def _run_pool(ray: Any, prep: Any, cfg: BuildConfig, enc_cfg: Any, desc: dict[str, Any], num_workers: int | None,
              gpus: float, cpus: float, show_progress: bool) -> None:
    total = sum(prep.spans[c].count for c in prep.todo)
    if num_workers is None:
        res = ray.cluster_resources()
        num_workers = int(res.get("GPU", 0) // gpus) if gpus > 0 else int(res.get("CPU", 1) // max(cpus, 1e-9))
        if num_workers < 1:
            raise ValueError(f"the Ray cluster ({res.get('CPU', 0)} CPUs, {res.get('GPU', 0)} GPUs) cannot hold "
                             f"one worker of {cpus} CPUs and {gpus} GPUs")
    num_workers = min(num_workers, len(prep.todo))
    ctx = ray.data.DataContext.get_current()
    # our own bar; a worker's ValueError raised as itself (newer Ray Data); restored afterwards
    saved = {k: getattr(ctx, k) for k in ("enable_progress_bars", "raise_original_map_exception") if hasattr(ctx, k)}
    for k in saved:
        setattr(ctx, k, k == "raise_original_map_exception")
    try:
        _map_chunks(ray, prep, cfg, enc_cfg, desc, num_workers, gpus, cpus, show_progress, total)
    finally:
        for k, v in saved.items():
            setattr(ctx, k, v)


def _map_chunks(ray: Any, prep: Any, cfg: BuildConfig, enc_cfg: Any, desc: dict[str, Any], num_workers: int,
                gpus: float, cpus: float, show_progress: bool, total: int) -> None:
    items = [{"chunk": s.chunk, "start": s.start, "stop": s.stop, "first": s.first, "count": s.count}
             for s in (prep.spans[c] for c in prep.todo)]
    build = {"input": os.path.abspath(cfg.input), "format": cfg.format, "id_field": cfg.id_field,
             "text_field": cfg.text_field, "parts": os.path.abspath(prep.parts), "dtype": cfg.dtype,
             "batch_size": cfg.batch_size}
    expected = {k: v for k, v in desc.items() if k != "model_dir"}
    try:  # one block per chunk
        ds = ray.data.from_items(items, override_num_blocks=len(items))
    except TypeError:  # Ray < 2.10
        ds = ray.data.from_items(items, parallelism=len(items))
    ds = ds.map_batches(
        _ChunkEmbedder, batch_size=1, compute=ray.data.ActorPoolStrategy(size=num_workers),
        num_gpus=gpus or None, num_cpus=cpus,
        fn_constructor_kwargs={"encoder_config": enc_cfg.to_dict(), "expected": expected, "build": build,
                               "throttle": float(os.environ.get(THROTTLE_ENV, "0") or 0)})
    logger.info("ray: embedding %d chunk(s) (%d docs) with %d worker(s) of %s CPU / %s GPU", len(items), total,
                num_workers, cpus, gpus)
    bar = progress_bar(prep, f" [ray x{num_workers}]", total) if show_progress else None
    t0 = time.perf_counter()
    done = 0
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            n = int(np.sum(batch["count"]))
            done += n
            if bar is not None:
                bar.update(n)
    except Exception as exc:  # a worker's InputError/ValueError/OSError arrives wrapped by Ray
        cause = _user_error(exc)
        if cause is not None:
            # Ray Data appends its own lines to the worker's message (the UDF it ran, its operators'
            # statistics); the worker's one-line message is the first line
            raise type(cause)(str(cause).split("\n", 1)[0]) from exc
        raise
    finally:
        if bar is not None:
            bar.close()
    log_encoded(done, t0, prep.done_records)


def _user_error(exc: BaseException) -> BaseException | None:
    """The error a worker raised for bad input or settings: the first
    :class:`InputError`, or builtin ValueError / OSError, in the exception's
    chain. Ray wraps a worker's exception in a ``RayTaskError(X)`` whose
    ``cause`` is the original (its ``__cause__`` is Ray Data's own
    exception), so ``cause`` is followed first."""
    seen = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if type(e) is InputError or (type(e).__module__ == "builtins" and isinstance(e, (ValueError, OSError))):
            return e
        cause = getattr(e, "cause", None)
        todo += [x for x in (cause, e.__cause__) if isinstance(x, BaseException)]
    return None


__all__ = ["build_corpus_ray", "describe_encoder", "import_ray", "RAY_HINT"]
