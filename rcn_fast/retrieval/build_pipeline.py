"""The three overlapping stages of a corpus build's embedding loop.

1. **Prepare** (background threads): read a chunk of the input, drop its
   duplicate texts, tokenise and cut it into token-budget batches
   (:meth:`Encoder.prepare_passages`; CPU work that releases the GIL in
   the tokenizer). Up to ``prefetch`` chunks are prepared ahead of the
   device, by ``workers`` threads.
2. **Run** (the calling thread): the encoder's forward passes
   (:meth:`Encoder.run`; on CUDA queued on the device without waiting).
3. **Write** (one background thread): wait for a chunk's embeddings and
   write its ``parts/`` file atomically.

Chunks go through every stage in input order (each stage consumes the
previous one's results in submission order), and a chunk's batches depend
on that chunk and the batch settings alone, so the store is the same
whatever the timing: a build interrupted at any point and resumed with the
same ``batch_size``, token budget (the encoder's ``batch_tokens``) and
attention path (the torch encoder's ``unpadded``) gives the same bytes.
These settings are not in the encoder's ``describe()`` that a resume
checks: a resume with others is not detected, and the chunks embedded
after it may differ from an uninterrupted build's by float rounding. The
torch encoder's automatic budget on CUDA comes from the device memory free
at load; set ``batch_tokens`` where a resumed build must match byte for
byte. An error in any stage stops the others and is raised in the calling
thread.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rcn_fast.retrieval.encoders.batching import Pending, cpu_workers


@dataclass
class ChunkRecords:
    """One chunk as read: its ids and texts (duplicates already dropped)
    and how many duplicates were dropped."""

    chunk: int
    ids: list[str]
    texts: list[str]
    dropped: int = 0


_STOP = object()
_NO_COUNT_LIMIT = 1 << 40  # batch_size None: the encoder's token budget alone sizes a batch


def embed_chunks(chunks: list[int], read: Callable[[int], ChunkRecords], encoder: Any,
                 write: Callable[[ChunkRecords, np.ndarray], None], *, batch_size: int | None = None,
                 prefetch: int = 2, workers: int = 1) -> int:
    """Embed ``chunks`` with prepare / run / write overlapping.

    Parameters
    ----------
    chunks : list of int
        Chunk numbers, in the order to process them.
    read : callable
        ``read(c)`` -> :class:`ChunkRecords` (runs in a prepare thread).
    encoder : Encoder or EncoderLike
        An :class:`~rcn_fast.retrieval.encoders.Encoder` is run through
        ``prepare_passages`` / ``run``; any other object's
        ``encode_passages(texts, batch_size=...)`` runs in the calling
        thread.
    write : callable
        ``write(records, embeddings float32 [n, d])`` (runs in the writer
        thread, chunk after chunk in order).
    batch_size : int or None
        Texts per forward pass at most (None: the token budget alone).
    prefetch : int
        Chunks prepared ahead of the one running.
    workers : int
        Prepare threads.

    Returns
    -------
    int
        Records embedded (duplicates dropped not counted).
    """
    def prepare(c: int) -> tuple[ChunkRecords, Any]:
        rec = read(c)
        return rec, _prepare(encoder, rec.texts, batch_size)

    written = queue.Queue(maxsize=2)
    failure: list[BaseException] = []

    def writer() -> None:
        while True:
            item = written.get()
            if item is _STOP:
                return
            if failure:  # stopping: drain without writing
                continue
            rec, pending = item
            try:
                write(rec, pending.result())
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                failure.append(exc)

    thread = threading.Thread(target=writer, name="rcn_fast-build-writer", daemon=True)
    thread.start()
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="rcn_fast-build-prepare")
    ahead: deque[Future] = deque()
    done = 0
    try:
        for c in chunks:
            ahead.append(pool.submit(prepare, c))
            if len(ahead) > max(0, prefetch) + max(1, workers) - 1:
                done += _run_one(ahead.popleft(), encoder, batch_size, written, failure)
        while ahead:
            done += _run_one(ahead.popleft(), encoder, batch_size, written, failure)
    finally:  # on an error: the chunks not yet being prepared are cancelled
        pool.shutdown(wait=True, cancel_futures=True)
        written.put(_STOP)
        thread.join()
    if failure:
        raise failure[0]
    return done


def _prepare(encoder: Any, texts: list[str], batch_size: int | None) -> Any:
    """The prepare stage: an Encoder's PreparedTexts, None for any other
    encoder (whose ``encode_passages`` :func:`_start` calls)."""
    if not (hasattr(encoder, "prepare_passages") and hasattr(encoder, "run")):
        return None
    return encoder.prepare_passages(texts, batch_size=_NO_COUNT_LIMIT if batch_size is None else batch_size)


def _start(encoder: Any, prepared: Any, texts: list[str], batch_size: int | None) -> Pending:
    """The run stage: the embeddings of ``texts`` from what :func:`_prepare` returned."""
    if prepared is not None:
        return encoder.run(prepared)
    kw = {} if batch_size is None else {"batch_size": batch_size}
    return Pending(np.asarray(encoder.encode_passages(texts, **kw), dtype=np.float32))


def embed_texts(encoder: Any, texts: list[str], batch_size: int | None = None) -> np.ndarray:
    """One chunk's embeddings as :func:`embed_chunks` computes them (the
    same batches, so the same bytes), in the calling thread: what an
    executor that runs chunks itself (Ray) calls.

    Returns
    -------
    float32 [len(texts), d]
    """
    return _start(encoder, _prepare(encoder, texts, batch_size), texts, batch_size).result()


def prepare_workers(encoder: Any) -> int:
    """Prepare threads for ``encoder``: 1 where it computes on the CPU
    (whose cores the forward passes keep busy), else half the cores, at
    most 4 (tokenising ~20-token texts runs at ~40,000 a second a thread;
    a GPU embeds more)."""
    device = getattr(encoder, "device", None)
    on_device = getattr(device, "type", "cpu") != "cpu" or \
        getattr(encoder, "provider", "CPUExecutionProvider") != "CPUExecutionProvider"
    return max(1, min(4, cpu_workers() // 2)) if on_device else 1


def _run_one(fut: Future, encoder: Any, batch_size: int | None, written: queue.Queue,
             failure: list[BaseException]) -> int:
    if failure:
        raise failure[0]
    rec, prepared = fut.result()
    pending = _start(encoder, prepared, rec.texts, batch_size)
    while True:  # hand over, but notice a writer that failed meanwhile
        if failure:
            raise failure[0]
        try:
            written.put((rec, pending), timeout=0.2)
            return len(rec.ids)
        except queue.Full:
            continue


__all__ = ["ChunkRecords", "embed_chunks", "embed_texts", "prepare_workers"]
