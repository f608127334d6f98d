"""Tiny random models converted to GGUF by llama.cpp's own converter: the
cases of tests/llm/test_engine_converter.py and the script that made the
committed files in tests/llm/data/converter/.

Each case is a Hugging Face model folder (config.json, model.safetensors
and the tokenizer files) whose weights come from a counter-based generator
(splitmix64 in integer arithmetic: the same bits on every machine and
numpy version), so a test rebuilds the very folder that was converted and
checks it against the recorded weights digest. The folder was converted
with ``convert_hf_to_gguf.py --outtype f32`` of the llama-cpp-python
0.3.36 sdist (``vendor/llama.cpp``); the GGUF files are committed, with
their digests, in ``manifest.json``.

One change to the converter, and why: it names the BPE pre-tokenizer by
hashing how the tokenizer splits a probe text, and refuses a tokenizer it
does not know; the tokenizer here is trained in code (GPT-2's byte-level
split), so ``get_vocab_base_pre`` is made to answer ``"gpt-2"`` (the
name llama.cpp gives GPT-2's split; rcn_fast/testing/llamacpp_tools.py
runs the converter). Nothing else is touched.

Regenerate (needs torch, transformers, safetensors and the sdist; name
cases to convert only those)::

    python -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
    python tests/llm/converter_cases.py /tmp/sdist/llama_cpp_python-0.3.36.tar.gz [llama31_k256 ...]
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "converter"
SDIST = "llama-cpp-python==0.3.36"

_COMMON = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=512,
               rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=None, initializer_range=0.02)
#: name -> (transformers config class, config fields, weights seed)
CASES: dict[str, tuple[str, dict, int]] = {
    # Llama, default rope, untied head, as many key/value heads as query heads
    "llama_default": ("LlamaConfig", dict(num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False), 1),
    # Llama 3.1/3.2 rope (type llama3, factor 8; a short original context so every branch of the rule is taken),
    # tied embeddings, grouped-query attention
    "llama31_rope": ("LlamaConfig", dict(num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 64}), 2),
    # Qwen2 (q/k/v biases, NEOX rope), tied embeddings (as the small Qwen2 models ship), grouped-query attention
    "qwen2": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True), 3),
    # Llama 3.1-shaped (llama3 rope, tied, GQA) with rows of 256: llama.cpp's K-quants (Q4_K_M, Q6_K ...) apply
    # to every matrix of it (rows of 32, as above, fall back to other types)
    "llama31_k256": ("LlamaConfig", dict(hidden_size=256, intermediate_size=256, num_attention_heads=4,
                                         num_key_value_heads=2, tie_word_embeddings=True,
                                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 64}), 12),
}
#: cases whose matrices are scaled by width (weights_for)
WIDTH_SCALED = frozenset({"llama31_k256"})
#: the converter's --outtype per case (default f32)
OUTTYPE: dict[str, str] = {}
_ARCH = {"LlamaConfig": "LlamaForCausalLM", "Qwen2Config": "Qwen2ForCausalLM"}

_CORPUS = [
    "Question: Where would you put a plate after washing it? A. cupboard B. table C. floor",
    "Answer: A", "Answer: B", " A B C D E",
    "The quick brown fox jumps over the lazy dog. Knowledge connects concepts.",
]


def _uniform(seed: int, n: int) -> np.ndarray:
    """``n`` float32 values in [-1, 1) from splitmix64 of (seed, index)."""
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0).astype(np.float32)


def config(name: str) -> dict:
    """The config.json of case ``name`` (vocabulary and special ids from the committed tokenizer)."""
    cls, fields, _ = CASES[name]
    tok = json.loads((DATA / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    vocab = len(tok["model"]["vocab"])
    return {"architectures": [_ARCH[cls]], "model_type": cls[: -len("Config")].lower(), "vocab_size": vocab,
            "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"], "torch_dtype": "float32",
            "hidden_act": "silu", **{**_COMMON, **fields}}


def weights(name: str) -> dict[str, np.ndarray]:
    """The float32 weights of case ``name``, named as transformers names them."""
    return weights_for(config(name), CASES[name][2], width_scaled=name in WIDTH_SCALED)


def weights_for(cfg: dict, seed: int, width_scaled: bool = False) -> dict[str, np.ndarray]:
    """The float32 weights of a model of config ``cfg`` from generator
    ``seed``; ``width_scaled``: the matrices' scale falls with the square
    root of the width (the cases of :data:`WIDTH_SCALED`; the committed
    files of the other cases and of tests/llm/kquant_cases.py were made
    without it)."""
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or H // cfg["num_attention_heads"]
    Q, D = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (Q, H), p + "self_attn.k_proj.weight": (D, H),
                       p + "self_attn.v_proj.weight": (D, H), p + "self_attn.o_proj.weight": (H, Q),
                       p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                       p + "mlp.down_proj.weight": (H, F)})
        if cfg["model_type"] == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (Q,), p + "self_attn.k_proj.bias": (D,),
                           p + "self_attn.v_proj.bias": (D,)})
    out = {}
    for j, (key, shape) in enumerate(sorted(shapes.items())):
        u = _uniform(seed * 1000 + j, int(np.prod(shape))).reshape(shape)
        # norms near 1, biases small, matrices wide enough that outputs depend on the input (their scale falls
        # with the square root of the width: each layer's gain is that of the 32-wide cases)
        wide = 0.4 * (32 / H) ** 0.5 if width_scaled else 0.4
        out[key] = (1.0 + 0.2 * u) if key.endswith("norm.weight") else (0.1 * u if key.endswith("bias") else wide * u)
    return {k: v.astype(np.float32) for k, v in out.items()}


def weights_digest(name: str) -> str:
    return digest_of(weights(name))


def digest_of(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key, w in sorted(weights.items()):
        h.update(f"{key}:{w.shape};".encode())
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()


def write_folder(name: str, folder: Path) -> Path:
    """The Hugging Face folder of case ``name`` at ``folder``."""
    return write_folder_for(config(name), weights(name), folder)


def write_folder_for(cfg: dict, weights: dict[str, np.ndarray], folder: Path) -> Path:
    """A Hugging Face folder of config ``cfg``, ``weights`` and the committed tokenizer at ``folder``."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for f in (DATA / "tokenizer").iterdir():
        shutil.copy(f, folder / f.name)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _train_tokenizer(folder: Path) -> None:
    """The committed tokenizer (run once; training is not promised to be stable across tokenizers versions)."""
    from rcn_fast.testing.tiny_llm import build_tokenizer

    build_tokenizer(vocab_size=300, corpus=_CORPUS).save_pretrained(folder)


def main(sdist: str, names: list[str]) -> None:
    from rcn_fast.testing import llamacpp_tools as lt

    DATA.mkdir(parents=True, exist_ok=True)
    if not (DATA / "tokenizer" / "tokenizer.json").is_file():
        _train_tokenizer(DATA / "tokenizer")
    old = json.loads((DATA / "manifest.json").read_text(encoding="utf-8")) if (DATA / "manifest.json").is_file() else {}
    manifest = {"converter": f"{SDIST} (sdist sha256 {hashlib.sha256(Path(sdist).read_bytes()).hexdigest()}): "
                             "vendor/llama.cpp/convert_hf_to_gguf.py --outtype f32",
                "cases": dict(old.get("cases", {}))}
    with tempfile.TemporaryDirectory() as tmp:
        vendor = lt.vendor(Path(sdist), Path(tmp))
        for name in names or CASES:
            folder = write_folder(name, Path(tmp) / name)
            out = DATA / f"{name}.gguf"
            # a tokenizer trained in code: GPT-2's split
            lt.convert(vendor, folder, out, OUTTYPE.get(name, "f32"), pre="gpt-2")
            manifest["cases"][name] = {"gguf_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
                                       "weights_sha256": weights_digest(name)}
    (DATA / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: python {sys.argv[0]} llama_cpp_python-0.3.36.tar.gz [case ...] (default: every case)")
    main(sys.argv[1], sys.argv[2:])
