"""The id table of a corpus store (:mod:`rcn_fast.retrieval.store`): a
stable 63-bit hash of each passage id and an open-addressing table from
hash to row, built vectorised, and its check when a store opens."""

from __future__ import annotations

import hashlib

import numpy as np


def id_hash(s: str) -> int:
    """Stable 63-bit hash of an id (blake2b); the same on every machine."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def build_id_table(hashes: np.ndarray) -> np.ndarray:
    """Open-addressing (linear probing) table, size a power of two >= 2n.

    Parameters
    ----------
    hashes : int64 [n]
        ``id_hash`` of every row's id.

    Returns
    -------
    int64 [T] with the row stored in its slot, -1 for empty slots.
    Vectorised: each round places, for every free slot wanted by some
    unplaced row, the lowest such row; the rest move one slot on.
    """
    n = len(hashes)
    size = 1 << max(3, int(2 * max(n, 1) - 1).bit_length())
    mask = size - 1
    table = np.full(size, -1, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    pos = hashes.astype(np.int64) & mask
    while rows.size:
        free = table[pos] == -1
        cand_rows, cand_pos = rows[free], pos[free]
        # first row (in row order) per wanted slot wins it
        uniq_pos, first = np.unique(cand_pos, return_index=True)
        table[uniq_pos] = cand_rows[first]
        placed = np.zeros(rows.size, dtype=bool)
        placed_idx = np.flatnonzero(free)[first]
        placed[placed_idx] = True
        rows, pos = rows[~placed], (pos[~placed] + 1) & mask
    return table


def check_id_table(table: np.ndarray, n: int, where: str, fix: str, block: int = 1 << 20) -> None:
    """ValueError naming ``where`` unless the id table holds each of the
    ``n`` rows once and nothing else but -1 (read ``block`` slots at a time)."""
    seen = np.zeros(n, dtype=bool)
    filled = 0
    for s in range(0, len(table), block):
        part = np.asarray(table[s : s + block])
        rows = part[part >= 0]
        if (part < -1).any() or (rows >= n).any():
            raise ValueError(f"{where} holds rows outside [-1, {n}); {fix}")
        seen[rows] = True
        filled += rows.size
    if filled != n or not seen.all():
        raise ValueError(f"{where} holds {filled} rows, not each of the {n} rows once; {fix}")


__all__ = ["id_hash", "build_id_table", "check_id_table"]
