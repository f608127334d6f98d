"""Resumable, shardable corpus build: input file -> :class:`CorpusStore`.

The input is cut into fixed-size chunks (``chunk_size`` records). One read
of the file hashes it and records where each chunk lies (byte range for
JSON lines / TSV, row range for Parquet; :func:`scan_input`, memoised per
file in the rcn_fast cache); each chunk is then read on its own
(:func:`read_chunk`; both in :mod:`rcn_fast.retrieval.corpus_input`).
Each finished chunk is written atomically to
``DIR/parts/`` (a ``.npz`` with its embeddings, texts and ids, renamed into
place only when complete), and ``DIR/build.json`` records the settings.
Running the same command again skips every chunk already in ``parts/``
(a build stopped by a record it cannot read keeps nothing instead: the
fixed input is another input);
settings that differ from ``build.json`` (another input file, encoder,
dtype, chunk size, ...) are an error, not a silently mixed store. When all
chunks exist they are joined into the store files and ``manifest.json`` is
written last (the chunk files and the store layout are written by
:mod:`rcn_fast.retrieval.store`, which also reads them).

The chunks are embedded by three overlapping stages
(:mod:`rcn_fast.retrieval.build_pipeline`): background threads read and
tokenise the next chunks (texts sorted by length, batches filled to the
encoder's token budget), the calling thread runs the encoder, and a writer
thread writes the finished chunks; a chunk's batches depend on that chunk
alone, so the bytes of the store do not depend on the timing or on where
a build was interrupted.

Shards: with ``num_shards=S, shard_id=I`` a machine embeds chunks
``c`` with ``c % S == I`` into its own directory, decoding only those
chunks; :func:`merge_shards` joins the S directories into a store
identical to a one-machine build. :mod:`rcn_fast.retrieval.build_ray`
runs the same chunks on a Ray Data actor pool instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from rcn_fast._files import read_text
from rcn_fast._stamped_json import MAX_STAMP_BYTES
from rcn_fast.retrieval.build_pipeline import ChunkRecords, embed_chunks, prepare_workers
from rcn_fast.retrieval.conventions import DEDUP, EmptyInputError, InputError, detect_text_field, first_in_chunk
from rcn_fast.retrieval.corpus_input import FORMATS, ChunkSpan, infer_format, read_chunk, scan_input
from rcn_fast.retrieval.store import (
    CHUNK_GLOB, DATA_FILES, FLAT_INDEX_HEADER, MANIFEST, CorpusStore, chunk_name, read_manifest, write_chunk,
    write_json_atomic, write_store,
)

logger = logging.getLogger("rcn_fast.retrieval")
BUILD_FORMAT = "rcn_fast.CorpusBuild/1"
# Testing/debug hook: seconds to sleep after each finished chunk (lets a test
# kill a build mid-way on a tiny corpus). Never set in normal use.
THROTTLE_ENV = "RCN_FAST_BUILD_THROTTLE"


@dataclass
class BuildConfig:
    """Settings of a corpus build (plain data; JSON/YAML serialisable).

    Attributes
    ----------
    input : str
        JSON lines, TSV (with a header row) or Parquet file.
    out : str
        Output directory.
    format : str or None
        ``"jsonl" | "tsv" | "parquet"``; None infers it from the suffix.
    id_field : str
        Column / key name of the id.
    text_field : str or None
        Column / key name of the text. None: ``"text"``, else FlashRAG's
        ``"contents"``, whichever the file has (resolved by
        :func:`prepare_build`).
    dtype : {"float16", "float32"}
        Storage dtype of the embeddings.
    batch_size : int or None
        Texts per encoder forward pass at most. None (default): as many as
        the encoder's token budget holds (``batch_tokens`` of its
        :class:`~rcn_fast.retrieval.encoders.EncoderConfig`: texts sorted
        by length fill each batch up to it).
    chunk_size : int
        Records per resumable unit of work.
    num_shards, shard_id : int
        This machine embeds chunks ``c`` with ``c % num_shards == shard_id``.
    keep_parts : bool
        Keep ``parts/`` after the store is written.
    overwrite : bool
        Start over: first delete what an earlier build left in ``out``
        (its chunks, ``build.json``/``shard.json`` and the store files, and
        nothing else), even when the settings or the input changed.
    keep_duplicates : bool
        Keep passages whose text repeats an earlier one. Default False: the
        first of each distinct text is kept, the rest dropped and counted
        (:mod:`rcn_fast.retrieval.conventions`).
    """

    input: str
    out: str
    format: str | None = None
    id_field: str = "id"
    text_field: str | None = None
    dtype: str = "float16"
    batch_size: int | None = None
    chunk_size: int = 4096
    num_shards: int = 1
    shard_id: int = 0
    keep_parts: bool = False
    overwrite: bool = False
    keep_duplicates: bool = False

    def __post_init__(self) -> None:
        self.input, self.out = str(self.input), str(self.out)
        if self.text_field is not None and (not isinstance(self.text_field, str) or not self.text_field):
            raise ValueError(f"text_field: expected a field name or None (text, else contents), got {self.text_field!r}")
        if self.format is None:
            self.format = infer_format(self.input)
        if self.format not in FORMATS:
            raise ValueError(f"format: expected one of {list(FORMATS)}, got {self.format!r}")
        if self.dtype not in ("float16", "float32"):
            raise ValueError(f"dtype: expected 'float16' or 'float32', got {self.dtype!r}")
        for name in ("batch_size", "chunk_size", "num_shards"):
            v = getattr(self, name)
            if name == "batch_size" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        if not (0 <= self.shard_id < self.num_shards):
            raise ValueError(f"shard_id: expected 0 <= shard_id < num_shards={self.num_shards}, got {self.shard_id}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------- build
def _spec(cfg: BuildConfig, encoder_desc: dict[str, Any], input_sha: str, input_bytes: int) -> dict[str, Any]:
    enc = {k: v for k, v in encoder_desc.items() if k != "model_dir"}
    spec = {
        "format": BUILD_FORMAT,
        "input": {"name": Path(cfg.input).name, "sha256": input_sha, "bytes": input_bytes, "format": cfg.format,
                  "id_field": cfg.id_field, "text_field": cfg.text_field},
        "encoder": enc, "dtype": cfg.dtype, "chunk_size": cfg.chunk_size, "num_shards": cfg.num_shards,
    }
    if not cfg.keep_duplicates:  # absent: duplicates kept (as every store built before this setting)
        spec["dedup"] = DEDUP
    return spec


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix[:-1]}: {a!r} != {b!r}"]


@dataclass
class PreparedBuild:
    """What :func:`prepare_build` found: the build to run in ``out``.

    Attributes
    ----------
    out, parts : Path
        The output directory and its ``parts/`` folder.
    spec : dict
        The settings recorded in ``build.json`` and the manifest.
    state : dict
        The content of ``build.json``.
    spans : list of ChunkSpan
        Every chunk of the input (all shards).
    mine : list of int
        The chunks this shard builds (all of them for one shard).
    todo : list of int
        Chunks of ``mine`` not yet in ``parts/``.
    done_records : int
        Records of ``mine`` already in ``parts/`` (an earlier run's).
    store : CorpusStore or None
        The finished store when ``out`` already held it (nothing to do).
    """

    out: Path
    parts: Path
    spec: dict[str, Any]
    state: dict[str, Any]
    spans: list[ChunkSpan]
    mine: list[int]
    todo: list[int]
    done_records: int
    store: CorpusStore | None = None



def progress_bar(prep: PreparedBuild, label: str, todo: int) -> Any:
    """The build's tqdm bar on stderr (docs/s): ``todo`` documents to encode
    after the ``prep.done_records`` an earlier run finished."""
    from tqdm.auto import tqdm

    return tqdm(desc=f"build {prep.out.name}{label}", total=prep.done_records + todo, initial=prep.done_records,
                unit="doc", unit_scale=True, file=sys.stderr)


def log_encoded(computed: int, t0: float, reused: int) -> None:
    """Log how many documents were encoded since ``t0`` (perf_counter), how
    fast, and how many an earlier run had finished."""
    dt = time.perf_counter() - t0
    logger.info("encoded %d docs in %.1f s (%.1f docs/s), %d reused from an earlier run",
                computed, dt, computed / dt if dt > 0 else 0.0, reused)

def prepare_build(config: BuildConfig, encoder_desc: dict[str, Any]) -> PreparedBuild:
    """Check ``config.out`` against the settings, write ``build.json`` and
    list the chunks left to embed: the part of a build every executor shares.

    Parameters
    ----------
    config : BuildConfig
    encoder_desc : dict
        The encoder's ``describe()``.

    Returns
    -------
    PreparedBuild (its ``store`` is set when ``out`` already holds the
    finished store).

    Raises
    ------
    ValueError
        ``config.out`` holds a build or store made with other settings
        (the differing settings are listed).
    """
    cfg = config
    out = Path(cfg.out)
    inp = Path(cfg.input)
    if not inp.is_file():
        raise FileNotFoundError(f"input: {inp} does not exist")
    if cfg.text_field is None:
        cfg.text_field = detect_text_field(str(inp), cfg.format)
    t_hash = time.perf_counter()
    input_sha, input_bytes, spans = scan_input(str(inp), cfg.format, cfg.chunk_size)
    if not sum(s.count for s in spans):  # a store of nothing would retrieve nothing, silently
        raise EmptyInputError(str(inp))
    spec = _spec(cfg, encoder_desc, input_sha, input_bytes)
    logger.debug("input hashed and scanned in %.2f s", time.perf_counter() - t_hash)
    out.mkdir(parents=True, exist_ok=True)
    cleared = _clear_build(out) if cfg.overwrite else False
    parts = out / "parts"
    state = {"spec": spec, "shard_id": cfg.shard_id, "encoder_model_dir": encoder_desc.get("model_dir")}

    if (out / MANIFEST).is_file():
        manifest = read_manifest(out / MANIFEST)
        built = manifest.get("build") if isinstance(manifest.get("build"), dict) else {}
        diff = _diff({k: built.get(k) for k in spec if k != "num_shards"},
                     {k: v for k, v in spec.items() if k != "num_shards"})
        if diff:
            raise ValueError(f"out: {out} already holds a corpus store built with other settings: "
                             + "; ".join(diff) + ". Use another --out directory, or pass --overwrite "
                             "(overwrite=True) to replace it.")
        logger.warning("%s is already complete (%d passages); nothing to do", out, manifest["count"])
        return PreparedBuild(out, parts, spec, state, spans, [], [], 0, store=CorpusStore.open(out))

    build_file = out / "build.json"
    if build_file.is_file():
        try:
            prev = json.loads(read_text(out, "build.json", limit=MAX_STAMP_BYTES))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"out: {build_file} is not valid JSON ({exc}); pass --overwrite (overwrite=True) "
                             "to start the build over") from None
        prev = prev if isinstance(prev, dict) else {}
        diff = _diff({"spec": prev.get("spec"), "shard_id": prev.get("shard_id")},
                     {"spec": spec, "shard_id": cfg.shard_id})
        if diff:
            raise ValueError(f"out: {out} holds an unfinished build with other settings: " + "; ".join(diff)
                             + ". Rerun with the original settings to resume, pass --overwrite (overwrite=True) "
                             "to discard it and start over, or use another --out directory.")
    elif any(out.iterdir()) and not cleared:
        raise ValueError(f"out: {out} is not empty and holds no corpus build; choose an empty or new directory")
    else:
        write_json_atomic(build_file, state)

    parts.mkdir(exist_ok=True)
    for stale in parts.glob(".*.tmp*"):  # a chunk that was being written when killed
        stale.unlink(missing_ok=True)
    done_before = {p.name for p in parts.glob(CHUNK_GLOB)}
    if done_before:
        logger.warning("resuming %s: %d chunk(s) already done, skipping them", out, len(done_before))
    mine = [s.chunk for s in spans if s.chunk % cfg.num_shards == cfg.shard_id]
    todo = [c for c in mine if chunk_name(c) not in done_before]
    done_records = sum(spans[c].count for c in mine if chunk_name(c) in done_before)
    return PreparedBuild(out, parts, spec, state, spans, mine, todo, done_records)


def finish_build(prep: PreparedBuild, config: BuildConfig, *, executor: str = "local") -> CorpusStore | None:
    """After every chunk of this shard is in ``parts/``: write ``shard.json``
    (one shard of many; returns None) or join the chunks into the store
    (returns it) and delete ``parts/`` and ``build.json`` unless
    ``keep_parts``."""
    cfg, out = config, prep.out
    missing = [c for c in prep.mine if not (prep.parts / chunk_name(c)).is_file()]
    if missing:
        raise RuntimeError(f"build of {out}: chunks {missing[:10]} are missing from parts/ after the run")
    if cfg.num_shards > 1:
        write_json_atomic(out / "shard.json", {**prep.state, "n_chunks": len(prep.spans), "chunks": prep.mine})
        return None
    store = write_store(out, [prep.parts / chunk_name(c) for c in prep.mine], prep.spec,
                      model_dir=prep.state["encoder_model_dir"], shards=1, executor=executor)
    if not cfg.keep_parts:
        shutil.rmtree(prep.parts, ignore_errors=True)
        (out / "build.json").unlink(missing_ok=True)
    return store


def build_corpus(config: BuildConfig, encoder: Any, *, show_progress: bool = True) -> CorpusStore | None:
    """Embed a corpus into a store directory, resuming an unfinished build.

    The input is hashed and scanned once for where each chunk lies
    (:func:`scan_input`); a shard then decodes only its own chunks.

    Parameters
    ----------
    config : BuildConfig
    encoder : EncoderLike
        Its ``describe()`` goes into the manifest and must match on resume.
    show_progress : bool
        tqdm bar (docs/s) on stderr.

    Returns
    -------
    CorpusStore for a one-shard build; None for one shard of many (join the
    shard directories with :func:`merge_shards`).

    Raises
    ------
    ValueError
        ``config.out`` holds a build or store made with other settings
        (the differing settings are listed).
    InputError
        A record of the input cannot be read (file and line named). The
        build's files are then removed from ``config.out`` (and the folder,
        when this call created it and it is left empty): a fixed input is
        another input, so nothing of this build could be resumed, and
        nothing is left to block the rerun. Other failures (an encoder
        error, a kill) keep the finished chunks: the same command resumes.
    """
    cfg = config
    fresh = not Path(cfg.out).exists()
    prep = prepare_build(cfg, encoder.describe())
    if prep.store is not None:
        return prep.store
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    bar = progress_bar(prep, f" [shard {cfg.shard_id}/{cfg.num_shards}]" if cfg.num_shards > 1 else "",
                       sum(prep.spans[c].count for c in prep.todo)) if show_progress else None
    t0 = time.perf_counter()
    dim = int(prep.spec["encoder"]["dim"])

    def read(c: int) -> ChunkRecords:
        ids, texts = read_chunk(cfg.input, cfg.format, prep.spans[c], cfg.id_field, cfg.text_field)
        dropped = 0
        if not cfg.keep_duplicates:  # within the chunk now; across chunks when the store is written
            ids, texts, dropped = first_in_chunk(ids, texts)
        return ChunkRecords(c, ids, texts, dropped)

    def write(rec: ChunkRecords, emb: Any) -> None:
        write_chunk(prep.parts, rec.chunk, rec.ids, rec.texts, emb, dim=dim, dtype=cfg.dtype, dropped=rec.dropped)
        if bar is not None:
            bar.update(len(rec.ids) + rec.dropped)
        if throttle:
            time.sleep(throttle)

    with keeping_nothing_on_bad_input(prep, fresh):
        try:
            computed = embed_chunks(prep.todo, read, encoder, write, batch_size=cfg.batch_size,
                                    workers=prepare_workers(encoder))
        finally:
            if bar is not None:
                bar.close()
        log_encoded(computed, t0, prep.done_records)
        return finish_build(prep, cfg)


@contextlib.contextmanager
def keeping_nothing_on_bad_input(prep: PreparedBuild, fresh: bool) -> Iterator[None]:
    """Around a build's embedding and joining (local or on Ray): an
    :class:`InputError` removes the build's files from ``prep.out`` (and the
    folder, when ``fresh``: this build created it, and it is left empty),
    then is raised again saying so. The input must change, and every chunk
    with it, so nothing of this build could be resumed; nothing is left to
    block the rerun. Other errors pass untouched (the finished chunks stay:
    the same command resumes)."""
    try:
        yield
    except InputError as exc:
        _clear_build(prep.out, quiet=True)
        if fresh and prep.out.is_dir() and not any(prep.out.iterdir()):
            prep.out.rmdir()
        raise InputError(f"{exc}; the build kept nothing in {prep.out}: fix the input and run the same command "
                         "again") from None


def _clear_build(out: Path, *, quiet: bool = False) -> bool:
    """Delete what a build or store left in ``out`` (and nothing else);
    returns whether ``out`` held a build or store (logged unless ``quiet``)."""
    found = any((out / name).is_file() for name in (MANIFEST, "build.json", "shard.json"))
    for name in (MANIFEST, FLAT_INDEX_HEADER, "build.json", "shard.json", *DATA_FILES):
        (out / name).unlink(missing_ok=True)
    for stale in out.glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    for sub in ("parts", "faiss"):
        if (out / sub).is_dir():
            shutil.rmtree(out / sub)
    if found and not quiet:
        logger.warning("overwrite: cleared the earlier build in %s", out)
    return found


def merge_shards(shard_dirs: list[str | os.PathLike[str]], out: str | os.PathLike[str]) -> CorpusStore:
    """Join the directories of a sharded build into one store.

    Every shard must come from the same input, encoder and settings, and
    together they must cover every chunk once. The result is identical to
    a one-machine build of the same input. The shard directories are left
    as they are (delete them once the merged store is verified).

    Parameters
    ----------
    shard_dirs : list of directories, one per shard id 0..S-1 (any order)
    out : directory for the merged store

    Returns
    -------
    CorpusStore
    """
    if not shard_dirs:
        raise ValueError("shard_dirs: expected at least one shard directory")
    infos = []
    for d in shard_dirs:
        f = Path(d) / "shard.json"
        if not f.is_file():
            raise ValueError(f"shard_dirs: {d} has no shard.json (not a finished shard; rerun its build command)")
        infos.append(json.loads(read_text(d, "shard.json", limit=MAX_STAMP_BYTES)))
    spec = infos[0]["spec"]
    for d, info in zip(shard_dirs[1:], infos[1:]):
        diff = _diff(spec, info["spec"])
        if diff:
            raise ValueError(f"shard_dirs: {d} was built with other settings than {shard_dirs[0]}: " + "; ".join(diff))
    n_chunks, S = infos[0]["n_chunks"], spec["num_shards"]
    got = sorted(i["shard_id"] for i in infos)
    if got != list(range(S)):
        raise ValueError(f"shard_dirs: expected shards 0..{S - 1} once each, got shard ids {got}")
    files = {}
    for d, info in zip(shard_dirs, infos):
        for c in info["chunks"]:
            p = Path(d) / "parts" / chunk_name(c)
            if not p.is_file():
                raise ValueError(f"shard_dirs: {d} lacks {p.name}")
            files[c] = p
    if sorted(files) != list(range(n_chunks)):
        raise ValueError(f"shard_dirs: chunks {sorted(set(range(n_chunks)) - set(files))} are missing")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists():
        raise ValueError(f"out: {out} already holds a corpus store")
    return write_store(out, [files[c] for c in range(n_chunks)], spec,
                     model_dir=infos[0].get("encoder_model_dir"), shards=S)


__all__ = ["BuildConfig", "build_corpus", "merge_shards", "PreparedBuild", "prepare_build", "finish_build", "progress_bar",
           "log_encoded"]
