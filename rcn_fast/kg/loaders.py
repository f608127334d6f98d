"""Knowledge-graph loaders: ConceptNet assertions, a generic TSV of triples,
and the WordNet database files of Debian's ``wordnet-base`` package."""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from typing import Iterator

from rcn_fast.kg.graph import KnowledgeGraph
from rcn_fast.kg.templates import normalize_relation

WORDNET_DIR = "/usr/share/wordnet"
WORDNET_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
WORDNET_HINT = "apt-get install -y wordnet-base  (Debian/Ubuntu: the database files land in /usr/share/wordnet)"

# WordNet pointer symbol -> relation name. Inverse pointers (hyponym,
# meronyms, domain members) are dropped: WordNet lists both directions, and
# the graph's adjacency already walks edges both ways.
WORDNET_POINTERS: dict[str, str | None] = {
    "!": "antonym", "@": "hypernym", "@i": "instance_hypernym", "~": None, "~i": None,
    "#m": "member_holonym", "#s": "substance_holonym", "#p": "part_holonym",
    "%m": None, "%s": None, "%p": None, "=": "attribute", "+": "derivation",
    ";c": "domain_topic", "-c": None, ";r": "domain_region", "-r": None, ";u": "domain_usage", "-u": None,
    "*": "entailment", ">": "cause", "^": "also_see", "$": "verb_group", "&": "similar_to",
    "<": "participle", "\\": "pertainym",
}
_SYMMETRIC = {"antonym", "derivation", "also_see", "verb_group", "similar_to", "attribute"}


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def concept_name(uri: str) -> str:
    """``"/c/en/ice_cream/n/wn/food"`` -> ``"ice cream"``."""
    parts = uri.split("/")
    if len(parts) < 4 or parts[1] != "c":
        raise ValueError(f"uri: expected a ConceptNet concept like /c/en/word, got {uri!r}")
    return parts[3].replace("_", " ")


def iter_conceptnet(path: str | os.PathLike[str], *, english_only: bool = True,
                    limit: int | None = None) -> Iterator[tuple[str, str, str]]:
    """Yield ``(head, relation, tail)`` from a ConceptNet assertions file.

    Rows are tab-separated: assertion uri, relation (``/r/IsA``), head
    concept (``/c/en/dog``), tail concept, JSON metadata. ``.csv`` or
    ``.csv.gz``. Relations are normalised (``is_a``); concepts become their
    words (``ice cream``).

    Parameters
    ----------
    path : file path
    english_only : bool
        Keep only rows whose head and tail are both ``/c/en/`` concepts.
    limit : int, optional
        Stop after this many kept triples.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no ConceptNet file at {path}")
    kept = 0
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 4:
                if line.strip():
                    raise ValueError(f"path: {path}:{lineno}: expected >= 4 tab-separated columns, got {len(cols)}")
                continue
            rel, head, tail = cols[1], cols[2], cols[3]
            if not head.startswith("/c/") or not tail.startswith("/c/"):
                continue
            if english_only and not (head.startswith("/c/en/") and tail.startswith("/c/en/")):
                continue
            yield concept_name(head), normalize_relation(rel), concept_name(tail)
            kept += 1
            if limit is not None and kept >= limit:
                return


def load_conceptnet(path: str | os.PathLike[str], *, english_only: bool = True,
                    limit: int | None = None) -> KnowledgeGraph:
    """A :class:`KnowledgeGraph` from a ConceptNet assertions file (see
    :func:`iter_conceptnet`)."""
    return KnowledgeGraph.from_triples(iter_conceptnet(path, english_only=english_only, limit=limit),
                                       source=f"conceptnet:{path}")


def load_tsv(path: str | os.PathLike[str], *, normalize: bool = True, limit: int | None = None) -> KnowledgeGraph:
    """A graph from a TSV of ``head<TAB>relation<TAB>tail`` lines.

    Blank lines and lines starting with ``#`` are skipped. ``normalize``
    normalises relation names (``UsedFor`` -> ``used_for``).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path: no TSV file at {path}")

    def rows() -> Iterator[tuple[str, str, str]]:
        kept = 0
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                s = line.rstrip("\n")
                if not s.strip() or s.startswith("#"):
                    continue
                cols = s.split("\t")
                if len(cols) != 3:
                    raise ValueError(f"path: {path}:{lineno}: expected 3 tab-separated columns "
                                     f"(head, relation, tail), got {len(cols)}")
                h, r, t = (c.strip() for c in cols)
                yield h, normalize_relation(r) if normalize else r, t
                kept += 1
                if limit is not None and kept >= limit:
                    return

    return KnowledgeGraph.from_triples(rows(), source=f"tsv:{path}")


def wordnet_available(directory: str | os.PathLike[str] = WORDNET_DIR) -> bool:
    """Whether the four WordNet ``data.*`` files exist in ``directory``."""
    d = Path(directory)
    return all((d / f).is_file() for f in WORDNET_FILES)


def _wn_name(word: str) -> str:
    w = word.replace("_", " ")
    if w.endswith(")") and "(" in w:  # adjective markers: "galore(ip)"
        w = w[: w.rindex("(")]
    return w.lower()


def load_wordnet(directory: str | os.PathLike[str] = WORDNET_DIR, *,
                 pos: tuple[str, ...] = ("noun", "verb", "adj", "adv")) -> KnowledgeGraph:
    """WordNet 3.0 as a graph of synsets.

    Nodes are synsets (key ``"n:02084071"``), named by their first lemma
    (``"dog"``); edges are the synset pointers of :data:`WORDNET_POINTERS`
    (hypernym, part/member/substance holonym, antonym, ...), inverse
    pointers dropped and symmetric ones kept once.

    Parameters
    ----------
    directory : path
        Folder holding ``data.noun``, ``data.verb``, ``data.adj``, ``data.adv``.
    pos : tuple of str
        Parts of speech to read.
    """
    d = Path(directory)
    if not wordnet_available(d):
        raise FileNotFoundError(f"directory: WordNet data files not found in {d} (install: {WORDNET_HINT})")
    for p in pos:
        if p not in ("noun", "verb", "adj", "adv"):
            raise ValueError(f"pos: expected items of noun, verb, adj, adv, got {p!r}")
    keys: dict[str, int] = {}
    names: list[str] = []
    raw: list[tuple[str, str, str]] = []
    ss_pos = {"n": "n", "v": "v", "a": "a", "s": "a", "r": "r"}
    for p in pos:
        with open(d / f"data.{p}", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # licence header
                    continue
                body = line.split(" | ", 1)[0].split()
                off, ptype = body[0], ss_pos[body[2]]
                w_cnt = int(body[3], 16)
                words = body[4:4 + 2 * w_cnt:2]
                i = 4 + 2 * w_cnt
                p_cnt = int(body[i])
                key = f"{ptype}:{off}"
                keys[key] = len(names)
                names.append(_wn_name(words[0]))
                for j in range(p_cnt):
                    sym, toff, tpos = body[i + 1 + 4 * j: i + 4 + 4 * j]
                    rel = WORDNET_POINTERS.get(sym)
                    if rel is not None:
                        raw.append((key, rel, f"{ss_pos[tpos]}:{toff}"))
    rels: dict[str, int] = {}
    h, r, t = [], [], []
    for a, rel, b in raw:
        if b not in keys or a == b:
            continue
        ia, ib = keys[a], keys[b]
        if rel in _SYMMETRIC and ia > ib:
            ia, ib = ib, ia
        h.append(ia)
        r.append(rels.setdefault(rel, len(rels)))
        t.append(ib)
    key_list = [""] * len(keys)
    for k, i in keys.items():
        key_list[i] = k
    return KnowledgeGraph(names, list(rels), h, r, t, node_keys=key_list, source=f"wordnet:{d}")


def load_graph(spec: str) -> KnowledgeGraph:
    """Load a graph from a spec string.

    ``"wordnet"`` or ``"wordnet:/dir"``, ``"conceptnet:/path.csv[.gz]"``,
    ``"tsv:/path.tsv"``, or a directory written by :meth:`KnowledgeGraph.save`.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec: expected a graph spec string, got {spec!r}")
    kind, _, arg = spec.partition(":")
    if kind == "wordnet":
        return load_wordnet(arg or WORDNET_DIR)
    if kind == "conceptnet":
        return load_conceptnet(arg)
    if kind == "tsv":
        return load_tsv(arg)
    if Path(spec).is_dir():
        return KnowledgeGraph.load(spec)
    raise ValueError(f"spec: expected 'wordnet[:dir]', 'conceptnet:path', 'tsv:path' or a saved graph "
                     f"directory, got {spec!r}")
