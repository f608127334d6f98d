"""What a GGUF file says its model is, checked the way llama.cpp's loader
checks it (llama-model-loader.cpp, llama-model.cpp): the sizes
(:func:`read_hparams`), the rope (:func:`read_rope`) and every tensor
claimed by name and shape (:func:`claim_tensors`).

Two kinds of refusal, each naming the file:

* :class:`~rcn_fast.llm.backends.engine.gguf_file.GGUFError`: the file
  contradicts itself or is malformed (a size of 0 heads, a block count the
  tensors do not have, a tensor of the wrong shape, a required tensor
  missing, a key of the wrong type). No backend runs it; ``engine="auto"``
  does not fall back.
* :class:`UnsupportedModel`: a well-formed model the native engine does not
  run (another architecture, a tensor type its kernels do not multiply, a
  tensor it would not use, a rope scaling it does not implement):
  ``engine="auto"`` goes to a backend that runs it, and ``load_llm`` names
  one in the message (:mod:`rcn_fast.llm.backends.probe`).

Rope, as llama.cpp reads it: ``<arch>.rope.scaling.type`` (absent: llama.cpp
reads ``"linear"``) with ``<arch>.rope.scaling.factor`` (or the older
``rope.scale_linear``; absent or 0: 1); ``"none"`` and ``"linear"`` are run
(linear divides the positions by the factor, as transformers' ``linear``
type), ``"yarn"``, ``"longrope"`` and any other type are refused by name, as
is an ``attn_factor`` other than 1. A ``rope_freqs.weight`` tensor (what
llama.cpp's converter writes for Llama 3.1/3.2's ``llama3`` rope) divides
each rotation frequency by its entry, as ggml's rope does.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from rcn_fast.llm.backends.engine import ggml_types
from rcn_fast.llm.backends.engine.gguf_file import GGUFError, GGUFFile, TensorInfo

#: architecture -> whether its rope rotates half-split (NEOX) pairs
ARCHITECTURES = {"llama": False, "qwen2": True}
#: rope scaling types llama.cpp writes (llama-model.cpp LLAMA_ROPE_SCALING_TYPES) -> whether the engine runs them
ROPE_SCALING_TYPES = {"none": True, "linear": True, "yarn": False, "longrope": False}
#: the C++ decoder's limits
MAX_LAYERS, MAX_HEAD_DIM, MAX_GROUP = 4096, 512, 64
_INT32 = (1 << 31) - 1
_BLOCK = re.compile(r"blk\.(\d+)\.")
_REQUIRED = object()


class UnsupportedModel(NotImplementedError):
    """A well-formed GGUF model a backend does not run (the message says
    why; ``load_llm`` adds the backends that do run it)."""


def unsupported(g: GGUFFile, why: str) -> UnsupportedModel:
    return UnsupportedModel(f"{g.path}: {why}; the native engine does not run it")


@dataclass(frozen=True)
class HParams:
    """The sizes of a Llama-family decoder (from the GGUF metadata, checked).

    ``rope_scale``: positions are divided by it (linear rope scaling; 1: none).
    """

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_dim: int
    eps: float
    rope_base: float
    rope_neox: bool
    rope_scale: float
    context_length: int | None

    def native(self) -> dict[str, Any]:
        """The fields of the C++ ``LlamaHParams``."""
        d = asdict(self)
        d.pop("arch")
        d.pop("context_length")
        return d


def file_blocks(g: GGUFFile) -> set[int]:
    """The block indices ``N`` of the file's ``blk.N.*`` tensors."""
    return {int(m.group(1)) for name in g.tensors if (m := _BLOCK.match(name))}


def blocks_problem(g: GGUFFile, arch: str, n: int) -> str | None:
    """Why ``<arch>.block_count`` = ``n`` does not match the file's
    ``blk.N.*`` tensors (blocks 0..n-1, each present), or None; in the time
    and memory of the tensors there are, whatever ``n`` says."""
    blocks = file_blocks(g)
    if len(blocks) == n and (n == 0 or max(blocks) == n - 1):  # n distinct indices >= 0 below n: all of 0..n-1
        return None
    held = f" (numbered {min(blocks)}..{max(blocks)})" if blocks else ""
    return f"{arch}.block_count is {n} but the file holds tensors of {len(blocks)} blocks{held}"


def _int(g: GGUFFile, key: str, lo: int, hi: int, default: Any = _REQUIRED, per_layer: int = 0) -> int:
    """An integer key in [lo, hi]; with ``per_layer`` an array of that many
    equal values is read as that value (llama.cpp's get_key_or_arr)."""
    kind = ("int", "int[]") if per_layer else "int"
    v = g.meta(key, kind) if default is _REQUIRED else g.meta(key, kind, default)
    if not isinstance(v, int):
        if len(v) != per_layer:
            raise GGUFError(f"{g.path}: metadata {key} has {len(v)} entries, the model has {per_layer} blocks")
        if len(set(v.tolist())) != 1:
            raise unsupported(g, f"metadata {key} differs between blocks ({sorted(set(v.tolist()))})")
        v = int(v[0])
    if not lo <= v <= hi:
        raise GGUFError(f"{g.path}: metadata {key} is {v}, expected {lo}..{hi}")
    return v


def _float(g: GGUFFile, key: str, default: Any = _REQUIRED, *, positive: bool = True) -> Any:
    """A finite float key (> 0 with ``positive``, else >= 0), or ``default``."""
    v = g.meta(key, "float") if default is _REQUIRED else g.meta(key, "float", default)
    if v is not default and (not math.isfinite(v) or v < 0 or (positive and v == 0)):
        raise GGUFError(f"{g.path}: metadata {key} is {v}, expected a finite number {'> 0' if positive else '>= 0'}")
    return v


def architecture(g: GGUFFile) -> str:
    """``general.architecture`` (a GGUFError when absent or not a string)."""
    return g.meta("general.architecture", "str")


def read_rope(g: GGUFFile, arch: str) -> tuple[str, float]:
    """The rope scaling the file declares: (llama.cpp's type name, the factor
    positions are divided by), refused by name where the engine does not
    run it (module notes)."""
    kind, factor, attn = rope_keys(g, arch)
    if kind not in ROPE_SCALING_TYPES:
        raise unsupported(g, f"rope scaling type {kind!r} (llama.cpp writes {', '.join(ROPE_SCALING_TYPES)})")
    if not ROPE_SCALING_TYPES[kind]:
        raise unsupported(g, f"rope scaling type {kind!r} (the engine runs 'none' and 'linear', and rope_freqs factors)")
    if attn not in (None, 1.0):
        raise unsupported(g, f"rope scaling attn_factor {attn} (the engine runs 1)")
    return kind, (1.0 if kind == "none" else factor)


def rope_keys(g: GGUFFile, arch: str) -> tuple[str, float, float]:
    """(scaling type, factor, attn_factor) as llama.cpp reads them: the type
    defaults to ``"linear"``, the factor to ``rope.scale_linear`` and then
    1 (0 reads as 1), the attention factor to 1."""
    kind = g.meta(f"{arch}.rope.scaling.type", "str", "linear")
    factor = _float(g, f"{arch}.rope.scaling.factor", None, positive=False)
    if factor is None:
        factor = _float(g, f"{arch}.rope.scale_linear", None, positive=False)
    return kind, factor or 1.0, _float(g, f"{arch}.rope.scaling.attn_factor", 1.0)


def read_hparams(g: GGUFFile) -> HParams:
    """The model's sizes, checked against each other and against the tensors
    the file holds (block count), before anything is allocated.

    Raises
    ------
    UnsupportedModel
        An architecture or setting the engine does not run.
    GGUFError
        A missing, mistyped or impossible size.
    """
    arch = architecture(g)
    if arch not in ARCHITECTURES:
        raise unsupported(g, f"architecture {arch!r} (supported: {sorted(ARCHITECTURES)})")
    n_layer = _int(g, f"{arch}.block_count", 1, 1 << 62)
    problem = blocks_problem(g, arch, n_layer)
    if problem:
        raise GGUFError(f"{g.path}: {problem}")
    if not 1 <= n_layer <= MAX_LAYERS:
        raise unsupported(g, f"{n_layer} blocks (the engine runs 1..{MAX_LAYERS})")
    n_embd = _int(g, f"{arch}.embedding_length", 1, _INT32)
    n_head = _int(g, f"{arch}.attention.head_count", 1, _INT32, per_layer=n_layer)
    n_head_kv = _int(g, f"{arch}.attention.head_count_kv", 1, n_head, default=n_head, per_layer=n_layer)
    if n_head % n_head_kv:
        raise GGUFError(f"{g.path}: {n_head} attention heads do not share {n_head_kv} key/value heads evenly")
    if n_head // n_head_kv > MAX_GROUP:
        raise unsupported(g, f"{n_head // n_head_kv} query heads per key/value head (at most {MAX_GROUP})")
    if f"{arch}.attention.key_length" not in g and n_embd % n_head:
        raise GGUFError(f"{g.path}: embedding_length {n_embd} is not a multiple of head_count {n_head}")
    head_dim = _int(g, f"{arch}.attention.key_length", 1, _INT32, default=n_embd // n_head)
    if _int(g, f"{arch}.attention.value_length", 1, _INT32, default=head_dim) != head_dim:
        raise unsupported(g, "keys and values of different lengths")
    if head_dim > MAX_HEAD_DIM:
        raise unsupported(g, f"heads of {head_dim} dimensions (at most {MAX_HEAD_DIM})")
    rope_dim = _int(g, f"{arch}.rope.dimension_count", 0, head_dim, default=head_dim)
    if rope_dim % 2:
        raise GGUFError(f"{g.path}: {arch}.rope.dimension_count {rope_dim} is odd")
    tokens = g.array_length("tokenizer.ggml.tokens", "str[]")
    if f"{arch}.vocab_size" not in g and not tokens:
        raise GGUFError(f"{g.path}: neither {arch}.vocab_size nor a token list gives the vocabulary's size")
    n_vocab = _int(g, f"{arch}.vocab_size", 1, _INT32, default=tokens)
    for name, v in (("head_count x key_length", n_head * head_dim), ("head_count_kv x key_length", n_head_kv * head_dim)):
        if v > _INT32:
            raise GGUFError(f"{g.path}: {name} is {v}, more than a tensor dimension holds")
    _, scale = read_rope(g, arch)
    ctx = _int(g, f"{arch}.context_length", 0, 1 << 62, default=0)
    return HParams(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=_int(g, f"{arch}.feed_forward_length", 1, _INT32, per_layer=n_layer), n_vocab=n_vocab, rope_dim=rope_dim,
        eps=_float(g, f"{arch}.attention.layer_norm_rms_epsilon"), rope_base=_float(g, f"{arch}.rope.freq_base", 10000.0),
        rope_neox=ARCHITECTURES[arch], rope_scale=scale, context_length=ctx or None,
    )


def expected_tensors(hp: HParams) -> list[tuple[str, tuple[int, ...], bool, bool]]:
    """``(name, shape, is a matrix, required)`` of every tensor a model of
    ``hp`` may hold, as llama.cpp's loader creates them for the
    architecture (``output.weight`` absent: the head is the embedding;
    ``rope_freqs.weight``: Llama only)."""
    H, Q, D, F, V = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.n_ff, hp.n_vocab
    out = [("token_embd.weight", (V, H), True, True), ("output_norm.weight", (H,), False, True),
           ("output.weight", (V, H), True, False)]
    if hp.arch == "llama":
        out.append(("rope_freqs.weight", (hp.rope_dim // 2,), False, False))
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (H,), False, True), (p + "attn_q.weight", (Q, H), True, True),
                (p + "attn_k.weight", (D, H), True, True), (p + "attn_v.weight", (D, H), True, True),
                (p + "attn_q.bias", (Q,), False, False), (p + "attn_k.bias", (D,), False, False),
                (p + "attn_v.bias", (D,), False, False), (p + "attn_output.weight", (H, Q), True, True),
                (p + "ffn_norm.weight", (H,), False, True), (p + "ffn_gate.weight", (F, H), True, True),
                (p + "ffn_up.weight", (F, H), True, True), (p + "ffn_down.weight", (H, F), True, True)]
    return out


def claim_tensors(g: GGUFFile, hp: HParams, *, check_types: bool = True) -> dict[str, TensorInfo | None]:
    """Every tensor of the file claimed by name, shape and type, as
    llama.cpp's ``create_tensor`` / ``check_tensor_dims`` /
    ``done_getting_tensors`` do: name -> its info (None: an optional tensor
    the file does not hold). ``check_types=False``: names and shapes only
    (what any backend requires; the types are the native engine's limits).

    Raises
    ------
    GGUFError
        A required tensor is missing or a tensor has the wrong shape.
    UnsupportedModel
        A tensor the engine would not use ("wrong number of tensors" in
        llama.cpp), or of a type its kernels do not multiply.
    """
    matmul = ggml_types.matmul_types()
    out: dict[str, TensorInfo | None] = {}
    for name, shape, is_mat, required in expected_tensors(hp):
        t = g.tensors.get(name)
        if t is None:
            if required:
                raise GGUFError(f"{g.path}: tensor {name!r} is missing (a {hp.arch} model of {hp.n_layer} blocks "
                                f"needs it)")
            out[name] = None
            continue
        if t.shape != shape:
            raise GGUFError(f"{g.path}: tensor {name!r} has shape {t.shape}, expected {shape} (from the metadata)")
        if check_types and is_mat and t.ggml_type not in matmul.values():
            raise unsupported(g, f"tensor {name!r} is {ggml_types.type_name(t.ggml_type)} (the engine multiplies "
                                 f"{', '.join(matmul)})")
        if check_types and not is_mat and t.ggml_type != 0:
            raise unsupported(g, f"tensor {name!r} is {ggml_types.type_name(t.ggml_type)} (the engine reads it as F32)")
        out[name] = t
    unused = [n for n in g.tensors if n not in out]
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise unsupported(g, f"{len(unused)} tensor(s) a {hp.arch} model run by the engine does not use: "
                             f"{', '.join(repr(n) for n in unused[:3])}{more}")
    return out


def sizes_problem(g: GGUFFile) -> str | None:
    """Declared sizes the tensors do not have (whatever the architecture),
    or None: a block count other than the ``blk.N`` tensors' (10**9 blocks
    are refused before anything builds 10**9 layers), an embedding length
    or vocabulary size other than ``token_embd.weight``'s shape."""
    arch = architecture(g)
    if f"{arch}.block_count" in g:
        problem = blocks_problem(g, arch, g.meta(f"{arch}.block_count", "int"))
        if problem:
            return problem
    emb = g.tensors.get("token_embd.weight")
    for key, want in ((f"{arch}.embedding_length", emb.shape[-1] if emb else None),
                      (f"{arch}.vocab_size", emb.shape[0] if emb and len(emb.shape) == 2 else None)):
        if want is not None and key in g and g.meta(key, "int") != want:
            return f"{key} is {g.meta(key, 'int')} but token_embd.weight has shape {emb.shape}"  # type: ignore[union-attr]
    return None


def transformers_problem(g: GGUFFile) -> str | None:
    """Why transformers' GGUF reader would run this file wrong or exhaust
    memory on it, or None: declared sizes the tensors do not have
    (:func:`sizes_problem`), and rope settings its reader ignores (it reads
    no rope scaling of Llama or Qwen2 files and no ``rope_freqs`` tensor, so
    the model would silently run the default rope)."""
    problem = sizes_problem(g)
    if problem:
        return problem
    arch = architecture(g)
    if arch == "gpt-oss":  # the one architecture whose rope scaling transformers' reader rebuilds
        return None
    if "rope_freqs.weight" in g.tensors:
        return ("it holds rope_freqs.weight (Llama 3.1/3.2 rope scaling), which transformers' GGUF reader ignores: "
                "the model would run the default rope and answer wrong")
    kind, factor, attn = rope_keys(g, arch)
    if kind not in ("none", "linear") or (kind == "linear" and factor != 1.0) or attn != 1.0:
        return (f"it declares rope scaling {kind!r} (factor {factor}, attn_factor {attn}), which transformers' GGUF "
                f"reader ignores: the model would run the default rope and answer wrong")
    return None


def check_for_transformers(path: Any) -> None:
    """The guard before transformers reads a ``.gguf`` (its GGUF reader, or a
    cached conversion of it): the file passes the strict format checks of
    :class:`GGUFFile` and :func:`transformers_problem` finds nothing.

    Raises
    ------
    GGUFError
        A malformed file, declared sizes its tensors do not have, or rope
        settings transformers' reader would ignore (``load_llm`` adds the
        backends that do run the file).
    """
    g = GGUFFile(path)
    problem = transformers_problem(g)
    if problem is not None:
        raise GGUFError(f"{g.path}: cannot run on transformers: {problem}")


__all__ = ["ARCHITECTURES", "ROPE_SCALING_TYPES", "HParams", "UnsupportedModel", "unsupported", "architecture",
           "read_hparams", "read_rope", "rope_keys", "expected_tensors", "claim_tensors", "sizes_problem",
           "transformers_problem", "check_for_transformers",
           "file_blocks", "blocks_problem"]
