"""The LLM call cache: sqlite (stdlib), one file per output directory.

Every row of a ``label_logprobs`` call, and every sample of a row of a
``generate`` call, is one entry, keyed by the SHA-256 of a canonical JSON of
(model identity, call kind, parameters, the exact chat, and for samples the
sample index). A key, once stored, always answers with its stored value:
when some samples of a row are cached and others are not, the cached ones
are returned as stored and only the missing sample indices are drawn (with
the backend's ``generate_samples`` when it has one; otherwise the row's
first ``max(missing) + 1`` samples are drawn and only the missing ones
kept). Asking for more samples later therefore reuses the ones already
drawn. An interrupted run resumes where it stopped: only entries missing
from the cache reach the model, and reruns are free.

Concurrency: each thread opens its own connection; writes are ``INSERT OR
IGNORE`` in short transactions with a long busy timeout, so several
processes (or threads) can share one file. The first answer written for a
key wins. The journal mode is a setting (``journal``):

* ``"wal"`` (default): write-ahead log, readers never wait for writers. It
  needs shared memory between the processes, so only a local disk (all
  processes on one machine).
* ``"delete"``: a rollback journal with the file system's POSIX locks; for
  a cache on a network file system (NFS, Lustre, GPFS) whose locks work,
  shared by processes on several machines.
* ``"dotfile"``: a rollback journal with lock files (sqlite's
  ``unix-dotfile`` VFS) for network file systems without working POSIX
  locks.

Every process that opens the file must use the same mode: writers with
POSIX locks and writers with lock files do not see each other's locks and
corrupt the file ("invalid page number"). The first process to open a file
records its mode in the table ``cache_meta``; a process asking for another
mode is refused with a :class:`CacheError` naming the recorded one (and a
``"dotfile"`` writer on a file in WAL mode is told so, not to fix
permissions). One change is safe and made: a WAL file that no process has
open (no ``-wal`` / ``-shm`` file beside it) is switched to the rollback
journal a ``"delete"`` or ``"dotfile"`` writer asks for;
:meth:`CallCache.change_journal` switches any file no process uses. Two
processes that *create* the same new file at the same instant with
different modes are not caught: start one first.

Trust: the file, and sqlite's ``-wal`` / ``-shm`` / ``-journal`` files
beside it, are never opened through a symbolic link planted in the folder
(:class:`CacheError` naming the link, :mod:`rcn_fast._files`); a file or
folder owned by another user or writable by group or others is neither
read nor written (:func:`rcn_fast._cache_dirs.trusted_cache`: one warning
naming it; every call is asked of the model).

Faults: a cache path that cannot be opened (a folder in the way, a file
that is not a sqlite database, a folder without write permission) raises
:class:`CacheError` naming the file and what to do. A stored answer that
cannot be read back (bad JSON, or not the shape its call kind needs) is
moved to the table ``calls_quarantine`` of the same file, with a warning,
and asked again, so a damaged row never fails a question for good.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from rcn_fast._cache_dirs import trusted_cache
from rcn_fast._files import LinkError, open_write, refuse_links
from rcn_fast._validate import is_int
from rcn_fast.llm import chat as chatlib
from rcn_fast.llm.base import Cost, CostTracker, Generation, GenerationParams, SampleBackend, check_tags
from rcn_fast.llm.base import normalise_labels, pad_rows
from rcn_fast.llm.scoring.labels import logprob_row_problem
from rcn_fast.llm.scoring.choice import check_label_scores

DEFAULT_NAME = "llm_cache.sqlite"
JOURNAL_MODES = ("wal", "delete", "dotfile")
logger = logging.getLogger("rcn_fast.llm")


class CacheError(RuntimeError):
    """The call cache file cannot be used; the message names it and the fix."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""
_META = "CREATE TABLE IF NOT EXISTS cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_QUARANTINE = """
CREATE TABLE IF NOT EXISTS calls_quarantine (
    key TEXT, model TEXT, kind TEXT, request TEXT, response TEXT, created REAL, reason TEXT, moved REAL
)
"""


def check_generation(value: Any, key: str | None = None) -> None:
    """Raise ValueError unless ``value`` is a stored :class:`Generation`
    (fields of the right types, token counts >= 0)."""
    if not isinstance(value, dict) or set(value) != {"text", "prompt_tokens", "generated_tokens", "finish_reason"}:
        raise ValueError(f"expected a generation record, got {str(value)[:80]}")
    if not isinstance(value["text"], str) or not isinstance(value["finish_reason"], str) or not all(
            is_int(value[k]) and value[k] >= 0 for k in ("prompt_tokens", "generated_tokens")):
        raise ValueError(f"a generation record with fields of the wrong type or range: {str(value)[:80]}")


def check_logprobs(value: Any, labels: Sequence[str] | None = None) -> None:
    """Raise ValueError unless ``value`` is a stored label-logprobs row: a
    number per label (``labels``: the row's labels, when known), none NaN,
    ``+inf`` or positive and not all ``-inf`` -- the rule fresh scores are
    held to (:func:`rcn_fast.llm.scoring.labels.logprob_row_problem`)."""
    if not isinstance(value, dict) or not isinstance(value.get("logprobs"), list) \
            or not is_int(value.get("prompt_tokens")) or value["prompt_tokens"] < 0:
        raise ValueError(f"expected a label-logprobs record, got {str(value)[:80]}")
    lp = value["logprobs"]
    problem = logprob_row_problem(lp, list(labels) if labels is not None else [f"#{i}" for i in range(len(lp))])
    if problem is not None:
        kind, why = problem
        raise ValueError(f"a label-logprobs record {'with' if kind == 'shape' else 'whose'} {why}")


def _file_in_wal_mode(path: Path) -> bool:
    """Whether ``path`` is a sqlite file whose header marks WAL mode (the
    unix-dotfile VFS cannot open those)."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head.startswith(b"SQLite format 3\x00") and head[18] == 2


def _wal_in_use(path: Path) -> bool:
    """Whether a WAL writer has ``path`` open: its ``-wal`` / ``-shm``
    files exist while any connection is open (and after a crash)."""
    return any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm"))


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class CallCache:
    """A sqlite store of LLM answers.

    Parameters
    ----------
    path : str or Path
        A directory (the file ``llm_cache.sqlite`` inside it is used) or a
        file path ending in ``.sqlite`` / ``.db``.
    timeout : float
        Seconds a writer waits for another writer's lock.
    journal : {"wal", "delete", "dotfile"}
        How concurrent writers are kept apart (see the module notes):
        ``"wal"`` on a local disk, ``"delete"`` or ``"dotfile"`` on a
        network file system shared by several machines.

    Raises
    ------
    CacheError
        The file cannot be created, opened or written, or is not a sqlite
        database; the message names it and says what to do.
    ValueError
        ``journal`` is not one of the modes.
    """

    def __init__(self, path: str | Path, timeout: float = 60.0, *, journal: str = "wal") -> None:
        if journal not in JOURNAL_MODES:
            raise ValueError(f"journal: expected one of {list(JOURNAL_MODES)}, got {journal!r}")
        self.journal = journal
        p = Path(path)
        root = p if p.suffix not in (".sqlite", ".db") else p.parent  # the folder the user named
        try:
            root.mkdir(parents=True, exist_ok=True)
            p = p / DEFAULT_NAME if p.suffix not in (".sqlite", ".db") else p
            for f in (p, *(Path(f"{p}{x}") for x in ("-wal", "-shm", "-journal"))):
                refuse_links(root, f, what="llm cache")  # sqlite would write through a planted link
        except LinkError as exc:
            raise CacheError(str(exc)) from None
        except OSError as exc:
            raise CacheError(f"llm cache: cannot create the folder of {p}: {exc}") from None
        self.path = p
        self.timeout = float(timeout)
        self._local = threading.local()
        self._mode_checked = False
        self.hits = 0
        self.misses = 0
        #: False when the file or its folder is another user's or writable by others: nothing is read or written
        self.trusted = trusted_cache(p, root, what="llm cache")
        if not self.trusted:
            return
        if p.is_dir():
            raise CacheError(f"llm cache: {p} is a folder, where the cache file should be; move it away "
                             "or use another output folder")
        if journal != "wal" and _file_in_wal_mode(p):
            if _wal_in_use(p):  # a WAL writer has it open (the unix-dotfile VFS could not even open it)
                raise self._mode_error("wal", header=True)
            try:  # no process has it open: switch it to a rollback journal and record the new mode
                CallCache.change_journal(p, journal, timeout=timeout)
            except sqlite3.Error as exc:
                raise self._error(exc) from None
        try:
            if not p.exists():
                try:
                    open_write(root, p, "ab", what="llm cache").close()  # created here, never through a link
                except LinkError:
                    raise
                except OSError as exc:
                    raise CacheError(f"llm cache: cannot open {p} for writing ({exc.strerror or exc}); make its "
                                     "folder writable or use another output folder") from None
            con = self._conn()
            con.execute(_SCHEMA)
            con.execute(_QUARANTINE)
            con.execute("SELECT key, response FROM calls LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            self.close()
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> CacheError:
        """A CacheError naming the file for a sqlite failure."""
        msg = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and any(
                w in msg for w in ("not a database", "malformed", "encrypted", "no such column", "has no column")):
            return CacheError(f"llm cache: {self.path} is not a readable call cache ({msg}); delete it (its "
                              "answers are lost and asked again) or use another output folder")
        if "readonly" in msg or "unable to open" in msg or "disk I/O" in msg:
            return CacheError(f"llm cache: cannot open {self.path} for writing ({msg}); make its folder "
                              "writable or use another output folder")
        return CacheError(f"llm cache: {self.path}: {msg}")

    def _conn(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            if self.journal == "dotfile":
                from urllib.parse import quote

                con = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?vfs=unix-dotfile",
                                      timeout=self.timeout, isolation_level=None, uri=True)
            else:
                con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            con.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            if not self._mode_checked:  # before switching the journal: refuse a file another mode uses
                try:
                    self._check_mode(con)
                except BaseException:
                    con.close()
                    raise
            # a rollback journal for "delete"/"dotfile"; a file left in WAL mode by an earlier run is switched back
            self._set_journal(con, "wal" if self.journal == "wal" else "delete")
            con.execute("PRAGMA synchronous=NORMAL" if self.journal == "wal" else "PRAGMA synchronous=FULL")
            self._local.con = con
        return con

    def _check_mode(self, con: sqlite3.Connection) -> None:
        """Record this cache's journal mode in a new (or older, unrecorded)
        file; raise :class:`CacheError` when the file records another."""
        con.execute(_META)
        row = con.execute("SELECT value FROM cache_meta WHERE key = 'journal'").fetchone()
        if row is None:  # a new file (or one from before modes were recorded): the first writer's mode
            con.execute("INSERT OR IGNORE INTO cache_meta VALUES ('journal', ?)", (self.journal,))
            row = con.execute("SELECT value FROM cache_meta WHERE key = 'journal'").fetchone()
        if row is not None and row[0] != self.journal:
            raise self._mode_error(str(row[0]))
        self._mode_checked = True

    def _mode_error(self, recorded: str, header: bool = False) -> CacheError:
        where = "is in WAL mode and open in a WAL writer" if header else f"records journal mode {recorded!r}"
        return CacheError(f"llm cache: {self.path} {where} and this process asks for {self.journal!r}: every process "
                          f"that opens a cache file must use the same journal mode (mixing them corrupts it); use "
                          f"--cache-journal {recorded} (journal={recorded!r}) here, or another cache file (to change "
                          f"the mode of a file no process uses: CallCache.change_journal(path, mode))")

    @staticmethod
    def change_journal(path: str | Path, journal: str, *, timeout: float = 60.0) -> None:
        """Switch a cache file that **no process is using** to ``journal``
        and record it (a WAL file left by finished runs is switched this way
        when a rollback-journal writer opens it).

        Parameters
        ----------
        path : str or Path
            A cache file, or the folder holding ``llm_cache.sqlite``.
        journal : {"wal", "delete", "dotfile"}
        """
        if journal not in JOURNAL_MODES:
            raise ValueError(f"journal: expected one of {list(JOURNAL_MODES)}, got {journal!r}")
        p = Path(path)
        p = p / DEFAULT_NAME if p.is_dir() else p
        con = sqlite3.connect(p, timeout=timeout, isolation_level=None)
        try:
            con.execute(f"PRAGMA journal_mode={'WAL' if journal == 'wal' else 'DELETE'}")
            con.execute(_META)
            con.execute("INSERT OR REPLACE INTO cache_meta VALUES ('journal', ?)", (journal,))
        finally:
            con.close()

    def _set_journal(self, con: sqlite3.Connection, mode: str) -> None:
        """Switch ``con``'s file to journal ``mode`` unless it is in it
        already. Changing the mode needs the file to itself, and sqlite may
        answer "database is locked" at once (without its busy handler) while
        other connections open the same new file: retry until ``timeout``."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                if str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() != mode:
                    con.execute(f"PRAGMA journal_mode={mode.upper()}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @staticmethod
    def key(model: str, kind: str, request: Any) -> str:
        return hashlib.sha256(_canonical({"model": model, "kind": kind, "request": request}).encode()).hexdigest()

    def get_many(self, keys: Sequence[str], *, count: bool = True,
                 check: Callable[[Any, str], None] | None = None) -> dict[str, Any]:
        """Cached responses (decoded JSON) of the keys present.

        ``count`` adds the lookups to ``hits`` / ``misses``. A row whose
        response is not JSON, or for which ``check(value, key)`` raises
        ValueError, is moved to ``calls_quarantine`` (with a warning naming
        the file and the row's key) and reported missing, so its call is
        made again.
        """
        out: dict[str, Any] = {}
        bad: dict[str, str] = {}
        uniq = list(dict.fromkeys(keys)) if self.trusted else []
        try:
            con = self._conn()
            for i in range(0, len(uniq), 500):
                chunk = uniq[i : i + 500]
                rows = con.execute(
                    f"SELECT key, response FROM calls WHERE key IN ({','.join('?' * len(chunk))})", chunk
                ).fetchall()
                for k, v in rows:
                    try:
                        value = json.loads(v)
                        if check is not None:
                            check(value, k)
                    except (ValueError, TypeError) as exc:
                        bad[k] = f"{type(exc).__name__}: {exc}"[:200]
                        continue
                    out[k] = value
            if bad:
                self._quarantine(con, bad)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        if count:
            self.hits += sum(1 for k in keys if k in out)
            self.misses += sum(1 for k in keys if k not in out)
        return out

    def put_many(self, items: Iterable[tuple[str, str, str, Any, Any]]) -> None:
        """Store ``(key, model, kind, request, response)`` entries (first write wins)."""
        rows = [(k, m, kind, _canonical(req), json.dumps(resp), time.time()) for k, m, kind, req, resp in items]
        if not rows or not self.trusted:
            return
        try:
            con = self._conn()
            con.execute("BEGIN IMMEDIATE")
            try:
                con.executemany("INSERT OR IGNORE INTO calls VALUES (?, ?, ?, ?, ?, ?)", rows)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def _quarantine(self, con: sqlite3.Connection, bad: dict[str, str]) -> None:
        """Move the rows of ``bad`` (key -> reason) out of ``calls``."""
        now = time.time()
        con.execute("BEGIN IMMEDIATE")
        try:
            for k, why in bad.items():
                con.execute("INSERT INTO calls_quarantine SELECT key, model, kind, request, response, created, ?, ? "
                            "FROM calls WHERE key = ?", (why, now, k))
                con.execute("DELETE FROM calls WHERE key = ?", (k,))
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        first = next(iter(bad))
        logger.warning("llm cache %s: %d stored answer(s) are damaged (row key %s...: %s); moved them to its table "
                       "calls_quarantine and asking again", self.path, len(bad), first[:16], bad[first])

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM calls").fetchone()[0]) if self.trusted else 0

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None


class CachedLLM(SampleBackend):
    """An LLM whose answers come from a :class:`CallCache` when present.

    A :class:`~rcn_fast.llm.base.SampleBackend`: :meth:`generate` and
    :meth:`generate_samples` check their arguments there; every requested
    sample is then looked up in the cache, rows with all samples cached
    skip the model, and only the missing sample indices are drawn from the
    wrapped LLM (and stored).

    Its ``cost`` counts every row (cached rows with ``cached_calls`` and
    the tokens recorded when they were first computed), so a resumed run
    reports the same cost as an uninterrupted one.
    """

    def __init__(self, llm: Any, cache: CallCache) -> None:
        self.llm = llm
        self.cache = cache
        self.cost = CostTracker()

    @property
    def identity(self) -> str:
        return self.llm.identity

    def __getattr__(self, name: str) -> Any:  # tokenizer, model ... of the wrapped LLM
        if name in ("llm", "cache", "cost"):
            raise AttributeError(name)
        return getattr(self.llm, name)

    def _draw(self, chats: list[Any], params: GenerationParams, sample_ids: list[list[int]],
              tags: list[str] | None) -> list[list[Generation]]:
        """Samples ``sample_ids[b]`` of ``chats[b]``: the stored ones from the
        cache, the others from the wrapped LLM (then stored)."""
        model = self.identity
        base = params.to_dict()
        base.pop("num_samples")
        if params.greedy:
            base.pop("seed")
            base.pop("top_p")

        def req(chat: Any, s: int) -> dict[str, Any]:
            return {"chat": chat, "params": base, "sample": s}

        keys = [{s: self.cache.key(model, "generate", req(c, s)) for s in ss} for c, ss in zip(chats, sample_ids)]
        found = self.cache.get_many([k for row in keys for k in row.values()], check=check_generation)
        missing = {i: [s for s, k in row.items() if k not in found] for i, row in enumerate(keys)}
        missing = {i: ss for i, ss in missing.items() if ss}
        fresh: dict[tuple[int, int], Generation] = {}
        if missing:
            rows = list(missing)
            drawn = self._draw_uncached([chats[i] for i in rows], [missing[i] for i in rows], params)
            items = []
            for i, gens in zip(rows, drawn):
                for s, g in zip(missing[i], gens):
                    fresh[(i, s)] = g
                    items.append((keys[i][s], model, "generate", req(chats[i], s), g.to_dict()))
            self.cache.put_many(items)
            # another writer may have stored some of these keys first: its answer wins
            found.update(self.cache.get_many([keys[i][s] for i, s in fresh], count=False, check=check_generation))
        out: list[list[Generation]] = []
        costs: list[Cost] = []
        for i, row in enumerate(keys):
            gens = [Generation.from_dict(found[k]) if k in found else fresh[(i, s)] for s, k in row.items()]
            out.append(gens)
            cached = 0 if i in missing else 1
            costs.append(Cost(1, gens[0].prompt_tokens, sum(g.generated_tokens for g in gens), cached))
        self.cost.record_rows(costs, tags)
        return out

    def _draw_uncached(self, chats: list[Any], sample_ids: list[list[int]],
                       params: GenerationParams) -> list[list[Generation]]:
        """Samples ``sample_ids[b]`` of ``chats[b]`` from the wrapped LLM."""
        kw = dict(max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                  seed=params.seed, stop=params.stop)
        if hasattr(self.llm, "generate_samples"):
            return self.llm.generate_samples(chats, sample_ids, **kw)
        # a backend without indexed sampling: draw the first max+1 samples, keep the missing ones
        n = max(max(ss) for ss in sample_ids) + 1
        res = self.llm.generate(chats, num_samples=n, **kw)
        return [[gens[s] for s in ss] for gens, ss in zip(res, sample_ids)]

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        """As :meth:`LLM.label_logprobs`; cached rows skip the model."""
        valid = chatlib.validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        model = self.identity
        reqs = [{"chat": c, "labels": r} for c, r in zip(valid, rows)]
        keys = [self.cache.key(model, "label_logprobs", q) for q in reqs]
        labels_of = dict(zip(keys, rows))
        check = lambda value, key: check_logprobs(value, labels_of[key])  # noqa: E731 - the same rule as fresh rows
        found = self.cache.get_many(keys, check=check)
        miss = [i for i, k in enumerate(keys) if k not in found]
        results: dict[int, tuple[list[float], int, int]] = {}
        if miss:
            lp = self.llm.label_logprobs([valid[i] for i in miss], [rows[i] for i in miss],
                                         tags=None if tags is None else [tags[i] for i in miss])
            last = getattr(self.llm.cost, "last", None) or [Cost() for _ in miss]
            # an LLM that does not check its own scores: a NaN/+inf/positive row fails here, before it is stored
            check_label_scores([list(lp[j, : len(rows[i])]) for j, i in enumerate(miss)], [rows[i] for i in miss],
                               model, None if tags is None else [tags[i] for i in miss])
            items = []
            for j, i in enumerate(miss):
                vals = [float(v) for v in lp[j, : len(rows[i])]]
                results[i] = (vals, last[j].prompt_tokens, 0)
                items.append((keys[i], model, "label_logprobs", reqs[i], {"logprobs": vals, "prompt_tokens": last[j].prompt_tokens}))
            self.cache.put_many(items)
            # another writer may have stored some of these keys first: its answer wins
            stored = self.cache.get_many([keys[i] for i in miss], count=False, check=check)
            for i in miss:
                if keys[i] in stored:
                    results[i] = (stored[keys[i]]["logprobs"], stored[keys[i]]["prompt_tokens"], 0)
        costs = []
        out_rows = []
        for i, k in enumerate(keys):
            if i in results:
                vals, pt, cached = results[i]
            else:
                vals, pt, cached = found[k]["logprobs"], found[k]["prompt_tokens"], 1
            out_rows.append(vals)
            costs.append(Cost(1, pt, 0, cached))
        self.cost.record_rows(costs, tags)
        return pad_rows(out_rows)
