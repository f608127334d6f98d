"""Batching of tokenised texts for the encoders: texts sorted by token
length and cut into batches filled to a token budget (not a fixed count),
padded (or packed, for unpadded attention) without a Python loop per row,
and the budget a device affords.

These are the plain, framework-free parts of the encoders' fast path; the
encoders (:mod:`rcn_fast.retrieval.encoders.base` and its backends) run
them, the corpus build (:mod:`rcn_fast.retrieval.build`) runs them in
background threads so tokenising overlaps the device.

A batch's cost is counted in *padded* tokens: ``rows x longest row``
(what a padded forward pass computes). Batches are planned longest texts
first; each holds as many rows as fit the budget (and at most
``max_rows``), so no batch ever exceeds the budget, and the rows come back
to input order through the row indices each batch carries.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

logger = logging.getLogger("rcn_fast.retrieval")

#: padded tokens per batch on the CPU (where larger batches only cost cache:
#: ~32 statements of 16 tokens, measured best with ONNX Runtime on this project's
#: 2-core machine; see docs/paper.md)
CPU_BATCH_TOKENS = 512
#: largest automatic budget on a GPU (beyond it a BERT-base forward gains nothing)
MAX_DEVICE_BATCH_TOKENS = 1 << 18
#: share of the free device memory the automatic budget may plan for
DEVICE_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class Tokenized:
    """Token ids of ``n`` texts, back to back.

    Attributes
    ----------
    ids : int64 [total]
        Every text's token ids (special tokens included), text after text.
    offsets : int64 [n + 1]
        Text ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.
    """

    ids: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """int64 [n]: tokens per text."""
        return np.diff(self.offsets)

    @classmethod
    def from_lists(cls, ids: Sequence[Sequence[int]]) -> "Tokenized":
        """From a list of token-id lists (what a tokenizer returns)."""
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(offsets[-1]))
        return cls(flat, offsets)


def plan_batches(lengths: np.ndarray, max_tokens: int, max_rows: int | None = None) -> list[np.ndarray]:
    """Sort rows by length (longest first) and cut them into batches whose
    padded size ``rows x longest`` is at most ``max_tokens``.

    Parameters
    ----------
    lengths : int [n]
        Tokens per text (at least 1 each counts; 0 is counted as 1).
    max_tokens : int
        The token budget of one batch; must hold the longest text.
    max_rows : int or None
        At most this many rows per batch as well.

    Returns
    -------
    list of int64 arrays
        Row indices of each batch, longest text first; together a
        permutation of ``range(n)`` (ties keep input order).

    Raises
    ------
    ValueError
        A text longer than ``max_tokens``, or a non-positive budget.
    """
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if isinstance(max_tokens, bool) or int(max_tokens) < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    if max_rows is not None and (isinstance(max_rows, bool) or int(max_rows) < 1):
        raise ValueError(f"max_rows: expected a positive int or None, got {max_rows!r}")
    n = len(lengths)
    if n == 0:
        return []
    order = np.argsort(-lengths, kind="stable")
    longest = int(lengths[order[0]])
    if longest > max_tokens:
        raise ValueError(f"max_tokens: a text of {longest} tokens does not fit a batch of {max_tokens} tokens; "
                         "raise the budget to at least the encoder's max_length")
    cap = n if max_rows is None else int(max_rows)
    out = []
    start = 0
    while start < n:
        L = int(lengths[order[start]])  # the longest of this batch: rows sorted descending
        take = min(cap, max_tokens // L, n - start)
        out.append(order[start:start + take])
        start += take
    return out


def ladder(n: int) -> int:
    """``n`` rounded up to the static sizes of length buckets and batch
    rows: multiples of 8 up to 64, then 8 steps an octave (72, 80, ...,
    128, 144, ..., 256, 288, ...), so rounding adds at most 7 below 64 and
    at most 12.5% above."""
    n = max(int(n), 1)
    step = 8 if n <= 64 else 1 << ((n - 1).bit_length() - 4)
    return -(-n // step) * step


@dataclass(frozen=True)
class BucketBatch:
    """One batch of :func:`plan_buckets`: its rows and its static shape.

    Attributes
    ----------
    rows : int64 [b]
        Row indices (input positions), longest text first.
    shape : (R, L)
        The padded shape: ``R >= b`` rows of ``L`` tokens (a ladder length
        at least the longest of ``rows``, at most the encoder's limit).
    """

    rows: np.ndarray
    shape: tuple[int, int]


def plan_buckets(lengths: np.ndarray, max_tokens: int, max_rows: int | None = None,
                 max_length: int | None = None) -> list[BucketBatch]:
    """Length buckets with static shapes: each text goes to the bucket of
    :func:`ladder` (its length) (capped at ``max_length``), each bucket is
    cut into batches of ``R(L) = min(max_rows, max_tokens // L)`` rows
    (a multiple of 8 where it is at least 8), and a bucket's last batch
    is padded to ``min(ladder(rows), R(L))`` rows. So every batch has one
    of few shapes (per bucket length, ``R(L)`` and the ladder values below
    it), fixed in advance, which CUDA graphs or ``torch.compile`` can
    serve one per shape, and no batch exceeds ``max_tokens`` padded tokens.

    Parameters
    ----------
    lengths : int [n]
        Tokens per text (0 counts as 1).
    max_tokens : int
        Padded tokens per batch at most; must hold one bucket of the
        longest text.
    max_rows : int or None
        Rows per batch at most.
    max_length : int or None
        The encoder's token limit: no bucket is longer.

    Returns
    -------
    list of BucketBatch, longest bucket first; their rows together are a
    permutation of ``range(n)`` (ties in input order).
    """
    lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
    if isinstance(max_tokens, bool) or int(max_tokens) < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    if max_rows is not None and (isinstance(max_rows, bool) or int(max_rows) < 1):
        raise ValueError(f"max_rows: expected a positive int or None, got {max_rows!r}")
    if len(lengths) == 0:
        return []
    order = np.argsort(-lengths, kind="stable")
    cap = int(max_length) if max_length else None
    buckets = np.array([min(ladder(v), cap) if cap else ladder(v) for v in lengths[order]], dtype=np.int64)
    if int(lengths[order[0]]) > (cap or int(lengths[order[0]])):
        raise ValueError(f"max_length: a text of {int(lengths[order[0]])} tokens is longer than {cap}")
    out = []
    start = 0
    while start < len(order):
        L = int(buckets[start])
        end = start + int(np.searchsorted(-buckets[start:], -L, side="right"))
        full = min(int(max_tokens) // L, int(max_rows) if max_rows else int(max_tokens))
        if full < 1:
            raise ValueError(f"max_tokens: a bucket of {L} tokens does not fit a batch of {max_tokens} tokens; "
                             "raise the budget to at least the encoder's max_length")
        full = full - full % 8 if full >= 8 else full
        for s in range(start, end, full):
            rows = order[s:min(s + full, end)]
            out.append(BucketBatch(rows, (min(ladder(len(rows)), full), L)))
        start = end
    return out


def pad_batch(tok: Tokenized, rows: np.ndarray, pad_id: int, with_token_types: bool = False,
              shape: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Right-padded model inputs of ``rows`` (no Python loop per row).

    Parameters
    ----------
    tok : Tokenized
    rows : int [b]
        Which texts, in batch order.
    pad_id : int
    with_token_types : bool
        Add ``token_type_ids`` (zeros).
    shape : (R, L) or None
        Pad to this static shape (a length bucket's,
        :func:`plan_buckets`): ``R >= b`` rows (the ``R - b`` filler rows
        hold one attended ``pad_id`` token, so no row is fully masked) of
        ``L`` tokens, ``L`` at least the longest row. None: ``b`` rows of
        the longest row's length (at least 1).

    Returns
    -------
    dict
        ``input_ids`` and ``attention_mask`` int64 [R, L] (and
        ``token_type_ids``), and ``padded``: a bool array (0-d), whether
        any position is masked (so the model need not read the mask on
        the device to know).
    """
    rows = np.asarray(rows, dtype=np.int64)
    lens = tok.offsets[rows + 1] - tok.offsets[rows]
    longest = int(max(lens.max(initial=0), 1))
    R, L = (len(rows), longest) if shape is None else (int(shape[0]), int(shape[1]))
    if R < len(rows) or L < longest:
        raise ValueError(f"shape: {(R, L)} cannot hold {len(rows)} rows of up to {longest} tokens")
    cols = np.arange(L, dtype=np.int64)
    mask = np.zeros((R, L), dtype=bool)
    mask[:len(rows)] = cols[None, :] < lens[:, None]
    mask[len(rows):, 0] = True  # filler rows: one pad token each
    input_ids = np.full((R, L), pad_id, dtype=np.int64)
    real = mask[:len(rows)]
    src = (tok.offsets[rows][:, None] + cols[None, :])[real]
    input_ids[:len(rows)][real] = tok.ids[src]
    feed = {"input_ids": input_ids, "attention_mask": mask.astype(np.int64),
            "padded": np.asarray(not mask.all())}
    if with_token_types:
        feed["token_type_ids"] = np.zeros_like(input_ids)
    return feed


def pack_batch(tok: Tokenized, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Unpadded model inputs of ``rows``: their tokens back to back.

    Returns
    -------
    dict
        ``input_ids`` int64 [T] (T = the rows' tokens), ``position_ids``
        int64 [T] (0.. within each text), ``cu_seqlens`` int32 [b + 1]
        (text ``j`` is ``[cu_seqlens[j], cu_seqlens[j + 1])``),
        ``max_seqlen`` and ``min_seqlen`` int64 scalar arrays (the longest
        and shortest text).
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = tok.offsets[rows]
    lens = tok.offsets[rows + 1] - starts
    cu = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=cu[1:])
    T = int(cu[-1])
    pos = np.arange(T, dtype=np.int64) - np.repeat(cu[:-1], lens)
    src = np.repeat(starts, lens) + pos
    return {"input_ids": tok.ids[src], "position_ids": pos, "cu_seqlens": cu.astype(np.int32),
            "max_seqlen": np.asarray(int(lens.max(initial=0)), dtype=np.int64),
            "min_seqlen": np.asarray(int(lens.min(initial=0)), dtype=np.int64)}


def device_batch_tokens(free_bytes: int, *, hidden: int, intermediate: int, heads: int, max_length: int,
                        dtype_bytes: int, share: float = DEVICE_MEMORY_SHARE,
                        cap: int = MAX_DEVICE_BATCH_TOKENS) -> int:
    """The token budget of one batch that a device's free memory affords.

    Counts, per padded token, the activations one encoder layer keeps
    alive at once (hidden states, Q/K/V, the attention output, the
    feed-forward's two intermediate tensors) in the compute dtype, the
    attention scores of a padded row should the attention kernel
    materialise them (``heads x max_length``), and the float32 copy of the
    last hidden state pooling reads; ``share`` of the free memory is
    planned for. The result is a multiple of 1024 (or ``max_length``),
    between ``max_length`` and ``cap``.

    Parameters
    ----------
    free_bytes : int
        Free device memory (``torch.cuda.mem_get_info()[0]``).
    hidden, intermediate, heads : int
        The model's widths and attention heads.
    max_length : int
        The encoder's token limit (a batch always holds one such text).
    dtype_bytes : int
        2 for float16/bfloat16, 4 for float32.

    Returns
    -------
    int
    """
    per_token = dtype_bytes * (8 * hidden + 2 * intermediate + 2 * heads * max_length) + 8 * hidden
    budget = int(share * max(int(free_bytes), 0) // per_token)
    budget = min(budget - budget % 1024, int(cap))
    return max(budget, int(max_length))


def cpu_workers() -> int:
    """CPU cores this process may run on (its affinity mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class PreparedTexts:
    """Texts tokenised and cut into batches, ready for a backend to run
    (made by :meth:`Encoder.prepare`, in any thread).

    Attributes
    ----------
    n : int
        How many texts.
    batches : list of (rows, feed)
        Row indices int64 [b] (input positions) and the batch's inputs
        (:func:`pad_batch` or :func:`pack_batch` arrays, or pinned torch
        tensors where a backend moved them there).
    """

    n: int
    batches: list[tuple[np.ndarray, Any]]


# ---------------------------------------------------------------- tokenising
_LOCAL = threading.local()  # per thread: {tokenizer: {max_length: backend copy or None}}
# tokenizer -> {max_length: whether its backend copy gives the tokenizer's own ids}
_CHECKED: "weakref.WeakKeyDictionary[Any, dict[int, bool]]" = weakref.WeakKeyDictionary()
_CHECK_LOCK = threading.Lock()


def _hf_ids(tokenizer: Any, texts: list[str], max_length: int) -> list[list[int]]:
    return tokenizer(texts, truncation=True, max_length=max_length, padding=False, return_attention_mask=False,
                     return_token_type_ids=False)["input_ids"]


def _backend_copy(tokenizer: Any, max_length: int) -> Any:
    """This thread's own copy of a fast tokenizer's Rust tokenizer, set to
    truncate at ``max_length`` and not pad (None for a slow tokenizer).
    A copy per thread: the transformers wrapper sets truncation on its
    backend at every call, so threads never share one."""
    copies = getattr(_LOCAL, "copies", None)
    if copies is None:
        copies = _LOCAL.copies = weakref.WeakKeyDictionary()
    cache = copies.setdefault(tokenizer, {})
    key = max_length
    if key not in cache:
        copy = None
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        if backend is not None:
            from tokenizers import Tokenizer

            copy = Tokenizer.from_str(backend.to_str())
            copy.enable_truncation(max_length, stride=0, strategy="longest_first",
                                   direction=getattr(tokenizer, "truncation_side", "right"))
            copy.no_padding()
        cache[key] = copy
    return cache[key]


def tokenize_texts(tokenizer: Any, texts: list[str], max_length: int) -> Tokenized:
    """Token ids of ``texts`` (special tokens added, truncated to
    ``max_length``), exactly as ``tokenizer(texts, truncation=True,
    max_length=max_length)`` gives them.

    A fast tokenizer is run through a per-thread copy of its Rust backend
    (``encode_batch_fast`` where available: no offsets computed), which
    releases the GIL, so threads tokenise in parallel; the first call per
    tokenizer compares the copy's ids with the tokenizer's own on a few of
    the texts and falls back to the tokenizer (logged) if they differ.

    Parameters
    ----------
    tokenizer : a transformers tokenizer
    texts : list of str (prefixes and lower-casing already applied)
    max_length : int

    Returns
    -------
    Tokenized
    """
    if not texts:
        return Tokenized(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64))
    backend = _backend_copy(tokenizer, max_length)
    agree = False
    if backend is not None:
        with _CHECK_LOCK:  # the wrapper's own call (and this first check) is not thread-safe
            checked = _CHECKED.setdefault(tokenizer, {})
            if max_length not in checked:
                probe = texts[:8] + [texts[-1], "", " ".join(texts[:64])]
                want = _hf_ids(tokenizer, probe, max_length)
                checked[max_length] = [e.ids for e in backend.encode_batch(probe, add_special_tokens=True)] == want
                if not checked[max_length]:
                    logger.warning("tokenizer: its Rust backend gives other ids than the tokenizer itself; "
                                   "tokenising through the tokenizer (slower)")
            agree = checked[max_length]
    if not agree:
        with _CHECK_LOCK:
            return Tokenized.from_lists(_hf_ids(tokenizer, texts, max_length))
    run = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
    return Tokenized.from_lists([e.ids for e in run(texts, add_special_tokens=True)])


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise the rows of float32 [n, d] in place (zero rows stay 0)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x /= np.where(norms > 0, norms, 1.0)
    return x


class Pending:
    """Embeddings being computed (on a device, asynchronously):
    :meth:`result` waits for them.

    Parameters
    ----------
    value : float32 [n, d] or None
        The finished result.
    wait : callable or None
        Called once by :meth:`result` to finish and return it.
    """

    def __init__(self, value: np.ndarray | None = None, wait: Callable[[], np.ndarray] | None = None) -> None:
        self._value, self._wait = value, wait

    def result(self) -> np.ndarray:
        """float32 [n, d], rows in input order."""
        if self._wait is not None:
            self._value, self._wait = self._wait(), None
        assert self._value is not None
        return self._value


@contextlib.contextmanager
def batch_progress(total: int, show: bool) -> Iterator[Callable[[], None]]:
    """A ``tick()`` to call as each of ``total`` batches finishes: a tqdm
    bar ("encode", in batches) when ``show``, else a no-op."""
    if not show:
        yield lambda: None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="encode", unit="batch") as bar:
        yield lambda: bar.update(1)


__all__ = ["Pending", "batch_progress", "tokenize_texts", "normalize_rows", "Tokenized", "PreparedTexts", "plan_batches",
           "plan_buckets", "BucketBatch", "ladder", "pad_batch", "pack_batch", "device_batch_tokens", "cpu_workers", "CPU_BATCH_TOKENS", "MAX_DEVICE_BATCH_TOKENS", "DEVICE_MEMORY_SHARE"]
