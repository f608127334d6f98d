"""The SEPTA work directory: the offline steps (align, build-db, train) and
the loaded system that scores questions.

Layout of a SEPTA directory (what ``checkpoint=`` points at)::

    septa.json           manifest: graph source, encoder, every setting
    graph/               the knowledge graph (KnowledgeGraph.save)
    node_features.npy    frozen text embeddings of the node names (text features)
    align_data.npz       alignment pairs: sampled subgraphs + text embeddings
    align_state.safetensors      alignment training state (resume)
    align.safetensors            the aligned graph encoder + text projection
    db/                  the subgraph vector database (SubgraphDB)
    features_*.npz       predictor inputs of a question file (cache)
    predictor_state.safetensors  predictor training state (resume)
    predictor.safetensors        the trained predictor
    metrics.json         alignment recall@1 and predictor accuracy
    db_parts/            finished chunks of an interrupted build-db (resume; removed when done)

What the ``"septa"`` pipeline reads (and :func:`checkpoint_fingerprint`
covers): ``septa.json``, ``graph/``, ``node_features.npy``,
``align.safetensors``, ``db/`` and ``predictor.safetensors``.

Checkpoints are safetensors files with their settings as JSON
(:mod:`rcn_fast.septa.checkpoint`); nothing in the directory is unpickled.
A directory of an older rcn_fast holding pickle ``.pt`` checkpoints is
refused with how to convert it once (``python -m rcn_fast.septa convert
--dir DIR``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from rcn_fast._stamped_json import read_stamped_json
from rcn_fast._validate import Settings, is_int
from rcn_fast.data import MCQuestion
from rcn_fast.kg import KnowledgeGraph, Subgraphs, bfs_subgraphs, load_graph, subgraph_text
from rcn_fast.septa.checkpoint import SUFFIX, load_checkpoint, part, save_checkpoint
from rcn_fast.septa.align import AlignConfig, AlignModel, recall_at_k, subgraph_vectors, train_alignment
from rcn_fast.septa.gnn import GNNConfig, SubgraphTable, torch_module
from rcn_fast.septa.predictor import FinetunedText, PredictorConfig, QuestionFeatures, SeptaPredictor
from rcn_fast.septa.predictor import accuracy, train_predictor
from rcn_fast.septa.query import QueryEnhancer
from rcn_fast.septa.vectordb import SubgraphDB

logger = logging.getLogger("rcn_fast.septa")
_FORMAT = "rcn_fast.septa/1"
MANIFEST = "septa.json"


@dataclass
class SamplerConfig(Settings):
    """BFS sampling of the subgraphs (eq. 1) for alignment pairs and the database.

    Attributes
    ----------
    p, max_depth, max_nodes, max_edges, seed : see :func:`rcn_fast.kg.bfs_subgraphs`
    """

    settings_name: ClassVar[str] = "sampler"

    p: float = 0.5
    max_depth: int = 2
    max_nodes: int = 12
    max_edges: int = 24
    seed: int = 0

    def sample(self, graph: KnowledgeGraph, centres: Any) -> Subgraphs:
        return bfs_subgraphs(graph, centres, p=self.p, max_depth=self.max_depth, max_nodes=self.max_nodes,
                             max_edges=self.max_edges, seed=self.seed)


# ------------------------------------------------------------------ helpers
def _encoder_record(encoder: Any) -> dict[str, Any]:
    cfg = getattr(encoder, "config", None)
    rec: dict[str, Any] = {"describe": encoder.describe() if hasattr(encoder, "describe") else {}}
    if cfg is not None and hasattr(cfg, "to_dict"):
        rec["config"] = cfg.to_dict()
    return rec


def load_encoder(record: dict[str, Any]) -> Any:
    """The rcn_fast Encoder a manifest's ``encoder`` record describes."""
    from rcn_fast.retrieval.encoders import Encoder

    if "config" not in record:
        raise ValueError("encoder: this SEPTA directory was built with a custom encoder object; pass encoder=")
    return Encoder.from_config(record["config"])


def encode(encoder: Any, texts: Sequence[str], side: str = "passage", progress: bool = False) -> np.ndarray:
    """float32 [n, d] from ``encoder.encode_passages`` / ``encode_queries``."""
    fn = encoder.encode_passages if side == "passage" else encoder.encode_queries
    texts = list(texts)
    try:
        out = fn(texts, show_progress=progress) if progress else fn(texts)
    except TypeError:
        out = fn(texts)
    return np.asarray(out, dtype=np.float32)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    d = Path(directory)
    f = d / MANIFEST
    if not d.is_dir():
        raise FileNotFoundError(f"checkpoint: {d} does not exist (a SEPTA directory holds {MANIFEST}, db/ and "
                                f"predictor.safetensors; build one with `python -m rcn_fast.septa align`, `build-db`, `train`)")
    if not f.is_file():
        raise FileNotFoundError(f"checkpoint: {d} has no {MANIFEST} (run `python -m rcn_fast.septa align` first)")
    return read_stamped_json(f, _FORMAT, what="a SEPTA directory", arg="checkpoint")


def write_manifest(directory: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    d = Path(directory)
    tmp = d / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, d / MANIFEST)


# what each part of a SEPTA directory needs, and the step that writes it
_PARTS = (("graph/graph.json", "align"), ("align.safetensors", "align"), ("db/db.json", "build-db"),
          ("predictor.safetensors", "train"))
# the files that determine the pipeline's answers
INFERENCE_FILES = (MANIFEST, "graph", "node_features.npy", "align.safetensors", "db", "predictor.safetensors")


def check_directory(directory: str | os.PathLike[str], *, db: bool = True,
                    predictor: bool = True) -> dict[str, Any]:
    """Check that a SEPTA directory holds what the loaded system reads
    (without loading anything heavy) and return its manifest.

    Raises
    ------
    FileNotFoundError
        The directory, its manifest or a part is missing; the message names
        every missing part and the command that writes it.
    ValueError
        The manifest is unreadable or of another format, or a checkpoint is
        an old pickle ``.pt`` (refused, with how to convert it).
    """
    d = Path(directory)
    m = read_manifest(d)
    wanted = [(f, step) for f, step in _PARTS
              if (db or step != "build-db") and (predictor or step != "train")]
    for f, _ in wanted:
        if f.endswith(SUFFIX):
            part(d, f[:-len(SUFFIX)])  # an old pickle in its place: refused, with how to convert it
    if m.get("gnn", {}).get("node_features") == "text":
        wanted.insert(1, ("node_features.npy", "align"))
    missing = [(f, step) for f, step in wanted if not (d / f).is_file()]
    if missing:
        names = ", ".join(f.split("/")[0] + ("/" if "/" in f else "") for f, _ in missing)
        steps = list(dict.fromkeys(step for _, step in missing))
        raise FileNotFoundError(f"checkpoint: {d} has no {names} (run "
                                + ", then ".join(f"`python -m rcn_fast.septa {s}`" for s in steps) + " first)")
    return m


_HASH_LIMIT = 256 << 20  # larger files are fingerprinted by size and mtime
_FP_MEMO: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FP_MEMO:
        if st.st_size > _HASH_LIMIT:
            _FP_MEMO[key] = f"size={st.st_size},mtime_ns={st.st_mtime_ns}"
        else:
            from rcn_fast._hashing import sha256_file

            _FP_MEMO[key] = sha256_file(path)
    return _FP_MEMO[key]


def checkpoint_fingerprint(directory: str | os.PathLike[str], parts: Sequence[str] = INFERENCE_FILES) -> str:
    """A digest of the contents of ``parts`` of a SEPTA directory (files or
    folders): sha256 of each file up to 256 MiB, size and mtime of larger
    ones. Retraining or rebuilding in place changes it; missing parts count
    as missing.

    Returns
    -------
    str
        24 hex digits.
    """
    d = Path(directory)
    h = hashlib.sha256()
    for part in parts:
        p = d / part
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else ([p] if p.is_file() else [])
        if not files:
            h.update(f"{part}\0missing\n".encode())
        for f in files:
            if f.name.endswith(".tmp"):
                continue
            h.update(f"{f.relative_to(d).as_posix()}\0{_file_digest(f)}\n".encode())
    return h.hexdigest()[:24]


def _update_metrics(directory: Path, **kv: Any) -> None:
    f = directory / "metrics.json"
    m = json.loads(f.read_text()) if f.is_file() else {}
    m.update(kv)
    f.write_text(json.dumps(m, indent=2) + "\n")


# ------------------------------------------------------------------ step 1: align
def prepare_alignment(directory: str | os.PathLike[str], graph: KnowledgeGraph | str, encoder: Any, *,
                      num_pairs: int = 64000, eval_pairs: int = 2000, sampler: SamplerConfig | None = None,
                      gnn: GNNConfig | None = None, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Save the graph and node features and build the alignment pairs
    (skipped when already done with the same settings).

    Parameters
    ----------
    directory : path (created)
    graph : KnowledgeGraph or a :func:`rcn_fast.kg.load_graph` spec
    encoder : frozen text encoder
    num_pairs, eval_pairs : int
        Training and held-out subgraph-text pairs (random distinct centres).
    sampler, gnn : settings
    seed : int
        Choice of centres.

    Returns
    -------
    the manifest
    """
    d = Path(directory)
    sampler = sampler or SamplerConfig()
    gnn = gnn or GNNConfig()
    spec = graph if isinstance(graph, str) else graph.source
    want = {"format": _FORMAT, "graph": spec, "encoder": _encoder_record(encoder), "sampler": sampler.to_dict(),
            "gnn": gnn.to_dict(), "pairs": {"num_pairs": num_pairs, "eval_pairs": eval_pairs, "seed": seed}}
    if (d / MANIFEST).is_file() and (d / "align_data.npz").is_file():
        have = read_manifest(d)
        same = all(have.get(k) == want[k] for k in ("graph", "sampler", "gnn", "pairs")) and \
            have["encoder"].get("describe") == want["encoder"]["describe"]
        if same:
            logger.info("alignment data already in %s", d)
            return have
        raise ValueError(f"directory: {d} holds a SEPTA build with other settings; use a new directory")
    # load and check the graph before creating anything (a bad spec leaves no empty directory)
    g = load_graph(graph) if isinstance(graph, str) else graph
    total = min(num_pairs + eval_pairs, g.num_nodes)
    rng = np.random.default_rng(seed)
    # centres with at least one edge: an isolated node makes an empty text
    cand = np.nonzero(g.degree() > 0)[0]
    centres = rng.permutation(cand)[:total]
    if len(centres) < 4:
        raise ValueError(f"graph: only {len(centres)} nodes have edges; need at least 4 for alignment pairs")
    created = not d.exists()
    d.mkdir(parents=True, exist_ok=True)
    try:
        return _write_alignment_data(d, g, encoder, want, centres, eval_pairs, sampler, gnn, progress)
    except BaseException:
        if created:  # nothing usable was written: leave no half-built directory behind
            shutil.rmtree(d, ignore_errors=True)
        raise


def _write_alignment_data(d: Path, g: KnowledgeGraph, encoder: Any, want: dict[str, Any], centres: np.ndarray,
                          eval_pairs: int, sampler: SamplerConfig, gnn: GNNConfig,
                          progress: bool) -> dict[str, Any]:
    g.save(d / "graph")
    if gnn.node_features == "text":
        nf = encode(encoder, g.node_names, progress=progress)
        np.save(d / "node_features.npy", nf.astype(np.float16))
    sg = sampler.sample(g, centres)
    texts = [subgraph_text(g, sg.edge_ids(i)) for i in range(len(sg))]
    temb = encode(encoder, texts, progress=progress)
    n_eval = min(eval_pairs, len(centres) // 4)
    np.savez(d / "align_data.npz", text_emb=temb, n_eval=n_eval, **{f"sg_{k}": v for k, v in asdict(sg).items()})
    want["text_dim"] = int(temb.shape[1])
    want["num_nodes"], want["num_relations"] = g.num_nodes, g.num_relations
    write_manifest(d, want)
    return want


def _load_align_data(d: Path) -> tuple[Subgraphs, np.ndarray, int]:
    z = np.load(d / "align_data.npz")
    sg = Subgraphs(**{k[3:]: z[k] for k in z.files if k.startswith("sg_")})
    return sg, z["text_emb"], int(z["n_eval"])


def node_features(d: Path, manifest: dict[str, Any]) -> np.ndarray | None:
    if manifest["gnn"]["node_features"] != "text":
        return None
    return np.load(d / "node_features.npy", mmap_mode="r")


def run_alignment(directory: str | os.PathLike[str], config: AlignConfig | None = None, *,
                  progress: bool = False, on_step: Any = None) -> dict[str, Any]:
    """Train the alignment (resuming from ``align_state.safetensors``), save
    ``align.safetensors``, and record held-out graph-to-text recall@1 before and after."""
    d = Path(directory)
    config = config or AlignConfig()
    m = read_manifest(d)
    g = KnowledgeGraph.load(d / "graph")
    sg, temb, n_eval = _load_align_data(d)
    ev, tr = np.arange(n_eval), np.arange(n_eval, len(sg))
    t_tr = SubgraphTable.from_subgraphs(sg.select(tr), g)
    t_ev = SubgraphTable.from_subgraphs(sg.select(ev), g)
    model = AlignModel(GNNConfig.from_dict(m["gnn"]), m["text_dim"], config.dim, g.num_relations, g.num_nodes,
                       node_features(d, m), seed=config.seed)
    before = recall_at_k(*model.embed_all(t_ev, temb[ev])) if n_eval >= 2 else None
    hist = train_alignment(model, t_tr, temb[tr], config, checkpoint=part(d, "align_state"), progress=progress,
                           on_step=on_step)
    after = recall_at_k(*model.embed_all(t_ev, temb[ev])) if n_eval >= 2 else None
    model.save(part(d, "align"))
    m["align"] = config.to_dict()
    write_manifest(d, m)
    res = {"recall@1_untrained": before, "recall@1": after, "eval_pairs": int(n_eval),
           "first_loss": hist[0]["loss"] if hist else None, "last_loss": hist[-1]["loss"] if hist else None,
           "steps": len(hist)}
    _update_metrics(d, alignment=res)
    return res


# ------------------------------------------------------------------ step 2: database
def build_database(directory: str | os.PathLike[str], *, encoder: Any = None, centres: Any = None,
                   limit: int | None = None, batch_size: int = 4096, dtype: str = "float32",
                   progress: bool = False) -> SubgraphDB:
    """Sample a subgraph around every node (or ``centres`` / the first
    ``limit`` nodes with edges), embed both sides with the aligned model and
    store eq. 9 vectors in ``db/``.

    Resumable: each finished chunk of ``batch_size`` centres is written to
    ``db_parts/``; after an interruption the same call (same centres, chunk
    size, ``align.safetensors``, graph and encoder) skips the finished chunks. Other
    settings start the parts afresh. ``db_parts/`` is removed once ``db/``
    is written.
    """
    d = Path(directory)
    m = check_directory(d, db=False, predictor=False)
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    g = KnowledgeGraph.load(d / "graph")
    enc = encoder if encoder is not None else load_encoder(m["encoder"])
    model = AlignModel.load(d / "align.safetensors", node_features(d, m))
    sampler = SamplerConfig.from_dict(m["sampler"])
    if centres is None:
        centres = np.nonzero(g.degree() > 0)[0]
        if limit is not None:
            centres = centres[:limit]
    centres = np.ascontiguousarray(np.asarray(centres, dtype=np.int64))
    parts = d / "db_parts"
    plan = {"centres": hashlib.sha256(centres.tobytes()).hexdigest(), "count": int(len(centres)),
            "chunk": batch_size, "sampler": m["sampler"],
            "align": checkpoint_fingerprint(d, ("align.safetensors", "graph", "node_features.npy")),
            "encoder": _describe(enc)}
    plan_file = parts / "plan.json"
    if plan_file.is_file() and _read_json(plan_file) == json.loads(json.dumps(plan)):
        pass
    else:
        if parts.exists():
            logger.info("build-db: %s holds parts of a build with other settings; starting afresh", parts)
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
        plan_file.write_text(json.dumps(plan, indent=2) + "\n")
    starts = list(range(0, len(centres), batch_size))
    done = sum((parts / f"part-{i:06d}.npz").is_file() for i in range(len(starts)))
    if done:
        logger.info("build-db: resuming, %d of %d chunks already done in %s", done, len(starts), parts)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(centres), initial=min(done * batch_size, len(centres)), desc="build-db",
                   unit="subgraph", dynamic_ncols=True)
    vecs, texts = [], []
    try:
        for i, s in enumerate(starts):
            f = parts / f"part-{i:06d}.npz"
            if f.is_file():
                with np.load(f) as z:
                    vecs.append(z["vectors"])
                    texts += json.loads(str(z["texts"]))
                continue
            c = centres[s:s + batch_size]
            sg = sampler.sample(g, c)
            tx = [subgraph_text(g, sg.edge_ids(j)) for j in range(len(sg))]
            e, h = model.embed_all(SubgraphTable.from_subgraphs(sg, g), encode(enc, tx))
            v = subgraph_vectors(np.asarray(e, np.float32), np.asarray(h, np.float32))
            tmp = parts / f"part-{i:06d}.tmp.npz"
            np.savez(tmp, vectors=v, texts=np.array(json.dumps(tx)))
            os.replace(tmp, f)
            vecs.append(v)
            texts += tx
            if bar is not None:
                bar.update(len(c))
    finally:
        if bar is not None:
            bar.close()
    dim = int(vecs[0].shape[1]) if vecs else int(model.dim)
    db = SubgraphDB(np.concatenate(vecs) if vecs else np.zeros((0, dim), np.float32), centres, texts, dtype=dtype)
    db.save(d / "db")
    m["db"] = {"count": len(db), "dtype": dtype}
    write_manifest(d, m)
    shutil.rmtree(parts, ignore_errors=True)
    return db


def _describe(encoder: Any) -> Any:
    desc = encoder.describe() if hasattr(encoder, "describe") else {"encoder": type(encoder).__name__}
    return json.loads(json.dumps(desc, sort_keys=True, default=str))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ the loaded system
class SeptaSystem:
    """A built SEPTA directory, loaded: scores questions.

    Parameters
    ----------
    directory : path
    encoder : text encoder, optional
        Default: the one recorded in the manifest.
    predictor_config : PredictorConfig, optional
        Default: the one recorded (after ``train``) or the defaults.
    """

    def __init__(self, directory: str | os.PathLike[str], encoder: Any = None,
                 predictor_config: PredictorConfig | None = None, load_predictor: bool = True) -> None:
        torch_module()  # needed below: ImportError with the install hint before anything is read
        self.directory = d = Path(directory)
        self.manifest = m = check_directory(d, predictor=load_predictor)
        self.graph = KnowledgeGraph.load(d / "graph")
        self.encoder = encoder if encoder is not None else load_encoder(m["encoder"])
        self.align = AlignModel.load(d / "align.safetensors", node_features(d, m))
        self.db = SubgraphDB.load(d / "db")
        self.config = predictor_config or PredictorConfig.from_dict(m.get("predictor", {}))
        self.enhancer = QueryEnhancer(self.graph, self.encoder, num_triples=self.config.num_triples)
        self.predictor = SeptaPredictor(self.align.dim, m["text_dim"], heads=self.config.heads,
                                        lam=self.config.lam, dropout=self.config.dropout)
        self.text_model = None  # the fine-tuned text encoder (finetune_encoder), else None
        if load_predictor:
            ck = load_checkpoint(d / "predictor.safetensors")
            self.config = PredictorConfig.from_dict(ck["config"])
            self.enhancer.num_triples = self.config.num_triples
            self.predictor = SeptaPredictor(self.align.dim, m["text_dim"], heads=self.config.heads,
                                            lam=self.config.lam, dropout=self.config.dropout)
            self.predictor.load_state_dict(ck["state"])
            if ck.get("text_model") is not None:
                self.text_model = FinetunedText(self.encoder, self.align.module["text"])
                self.text_model.load_state_dict(ck["text_model"])
                self.text_model.eval()
        self.predictor.eval()

    def features(self, questions: Sequence[MCQuestion], progress: bool = False,
                 batch_size: int = 64) -> tuple[QuestionFeatures, list[list[Any]]]:
        """Predictor inputs for ``questions`` and, per question, the enhanced
        queries of its choices (texts, linked nodes, triples). Subgraphs are
        retrieved with the frozen aligned encoder; after fine-tuning
        (``finetune_encoder``) ``t`` and ``v`` come from the fine-tuned one.
        The ``k`` axis holds ``min(top_k, database size)`` slots: slots
        beyond the database could only be padding, which the predictor
        masks anyway."""
        torch = torch_module()
        k = min(self.config.top_k, max(1, len(self.db)))
        C = max((len(q.choices) for q in questions), default=1)
        Q, d, dt = len(questions), self.align.dim, self.manifest["text_dim"]
        t = np.zeros((Q, C, d), np.float32)
        v = np.zeros((Q, C, dt), np.float32)
        ids = np.full((Q, C, k), -1, np.int64)
        scores = np.zeros((Q, C, k), np.float32)
        mask = np.zeros((Q, C), bool)
        answers = np.array([-1 if q.answer is None else q.answer for q in questions], dtype=np.int64)
        enhanced: list[list[Any]] = []
        it = range(0, Q, batch_size)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="features", unit="batch")
        for s in it:
            qs = questions[s:s + batch_size]
            pairs = [(q.question, c) for q in qs for c in q.choices]
            enh = self.enhancer.enhance(pairs)
            tv = encode(self.encoder, [e.text for e in enh])
            vv = encode(self.encoder, [e.base for e in enh])
            with torch.no_grad():
                tt = self.align.text_embed(tv).numpy()
            sc, ii = self.db.search(tt, k)
            if self.text_model is not None:
                with torch.no_grad():
                    tt = self.text_model.project([e.text for e in enh]).numpy()
                    vv = self.text_model.embed([e.base for e in enh]).numpy()
            j = 0
            for qi, q in enumerate(qs):
                row = s + qi
                n = len(q.choices)
                t[row, :n], v[row, :n] = tt[j:j + n], vv[j:j + n]
                ids[row, :n], scores[row, :n] = ii[j:j + n], sc[j:j + n]
                mask[row, :n] = True
                enhanced.append(enh[j:j + n])
                j += n
        G = self.db.get(ids)
        return QuestionFeatures(t, G, ids, scores, v, mask, answers), enhanced

    def score(self, feats: QuestionFeatures) -> np.ndarray:
        """Predictor scores float32 [Q, C] (-inf on padded choices)."""
        torch = torch_module()
        self.predictor.eval()
        with torch.no_grad():
            return self.predictor(**feats.tensors(slice(None))).numpy()


def _features_cached(system: SeptaSystem, questions: list[MCQuestion], name: str,
                     progress: bool) -> QuestionFeatures:
    h = hashlib.sha256(json.dumps([q.to_dict() for q in questions], sort_keys=True).encode())
    d = system.directory
    # everything the features depend on: the aligned model, the graph, the database, the encoder, the linking
    h.update(json.dumps({"k": system.config.top_k, "triples": system.config.num_triples,
                         "db": system.manifest.get("db"), "db_files": checkpoint_fingerprint(d, ("db",)),
                         "align": checkpoint_fingerprint(d, ("align.safetensors", "graph", "node_features.npy")),
                         "encoder": _describe(system.encoder), "enhancer": system.enhancer.describe()},
                        sort_keys=True, default=str).encode())
    f = system.directory / f"features_{name}_{h.hexdigest()[:12]}.npz"
    if f.is_file():
        return QuestionFeatures.load(f)
    feats, _ = system.features(questions, progress=progress)
    feats.save(f)
    return feats


def question_texts(system: SeptaSystem, questions: list[MCQuestion]) -> list[list[tuple[str, str]]]:
    """Per question, per choice: (enhanced query text ``s_i``, plain
    question-choice text) -- what the fine-tuned encoder reads."""
    out: list[list[tuple[str, str]]] = []
    for s in range(0, len(questions), 64):
        qs = questions[s:s + 64]
        enh = system.enhancer.enhance([(q.question, c) for q in qs for c in q.choices])
        j = 0
        for q in qs:
            out.append([(e.text, e.base) for e in enh[j:j + len(q.choices)]])
            j += len(q.choices)
    return out


def run_training(directory: str | os.PathLike[str], train_questions: Sequence[MCQuestion],
                 dev_questions: Sequence[MCQuestion] | None = None, config: PredictorConfig | None = None, *,
                 encoder: Any = None, progress: bool = False, on_epoch: Any = None) -> dict[str, Any]:
    """Train the predictor on ``train_questions`` (resuming from
    ``predictor_state.safetensors``), keep the best dev epoch, save
    ``predictor.safetensors``."""
    torch = torch_module()
    d = Path(directory)
    config = config or PredictorConfig()
    system = SeptaSystem(d, encoder=encoder, predictor_config=config, load_predictor=False)
    torch.manual_seed(config.seed)
    system.predictor = SeptaPredictor(system.align.dim, system.manifest["text_dim"], heads=config.heads,
                                      lam=config.lam, dropout=config.dropout)
    train = _features_cached(system, list(train_questions), "train", progress)
    dev = _features_cached(system, list(dev_questions), "dev", progress) if dev_questions else None
    text_model = train_texts = dev_texts = None
    if config.finetune_encoder:  # the paper's setting: the text encoder trains with the predictor
        text_model = FinetunedText(system.encoder, system.align.module["text"])
        train_texts = question_texts(system, list(train_questions))
        dev_texts = question_texts(system, list(dev_questions)) if dev_questions else None
    hist = train_predictor(system.predictor, train, config, dev=dev, checkpoint=part(d, "predictor_state"),
                           progress=progress, on_epoch=on_epoch, text_model=text_model, train_texts=train_texts,
                           dev_texts=dev_texts)
    save_checkpoint(part(d, "predictor"), {"config": config.to_dict(), "state": system.predictor.state_dict(),
                                           "text_model": text_model.state_dict() if text_model is not None else None})
    m = read_manifest(d)
    m["predictor"] = config.to_dict()
    write_manifest(d, m)
    res = {"epochs": len(hist), "history": hist,
           "train_acc": accuracy(system.predictor, train, texts=train_texts, text_model=text_model),
           "dev_acc": accuracy(system.predictor, dev, texts=dev_texts, text_model=text_model)
           if dev is not None else None,
           "train_questions": len(train), "dev_questions": len(dev) if dev is not None else 0}
    _update_metrics(d, predictor=res)
    return res
