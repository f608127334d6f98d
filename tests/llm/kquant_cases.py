"""The K-quant case: a tiny random Llama whose every matrix row is a whole
number of 256-element super-blocks (hidden 256, FFN 256, 4 heads of 64, one
key/value head, one block, tied embeddings, the committed 300-token
tokenizer), converted by llama.cpp's own converter
(``convert_hf_to_gguf.py --outtype q8_0`` of the llama-cpp-python 0.3.36
sdist, as tests/llm/converter_cases.py runs it) into the committed
tests/llm/data/kquant/llama_kq.gguf (Q8_0: the smallest output the
converter writes, 0.46 MB). The tests quantize it with llama.cpp's own
quantizer (``llama_cpp.llama_model_quantize``, ``allow_requantize``, as
``llama-quantize --allow-requantize`` does) into the files llama.cpp's
users have: Q4_K_M, Q5_K_M, Q6_K and a plain (non-pure) Q4_0, whose tied
``token_embd`` llama.cpp writes as Q6_K.

Regenerate (needs torch, transformers, safetensors and the sdist)::

    python -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
    python tests/llm/kquant_cases.py /tmp/sdist/llama_cpp_python-0.3.36.tar.gz
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import converter_cases as cc

DATA = Path(__file__).resolve().parent / "data" / "kquant"
GGUF = DATA / "llama_kq.gguf"
SEED = 52
#: the quantisations the tests make, and the GGML types llama.cpp's quantizer gives each tensor kind
#: (tied token_embd: the output's type; attn_v and ffn_down: more bits in the one block)
MIXES = {
    "Q4_K_M": {"token_embd": "Q6_K", "attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
               "ffn_gate": "Q4_K", "ffn_up": "Q4_K", "ffn_down": "Q6_K"},
    "Q5_K_M": {"token_embd": "Q6_K", "attn_q": "Q5_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q5_K",
               "ffn_gate": "Q5_K", "ffn_up": "Q5_K", "ffn_down": "Q6_K"},
    "Q6_K": {k: "Q6_K" for k in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                 "ffn_down")},
    "Q4_0": {"token_embd": "Q6_K", **{k: "Q4_0" for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                          "ffn_up", "ffn_down")}},
}


def config() -> dict:
    cfg = cc.config("llama_default")
    cfg.update(hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=1, head_dim=64, tie_word_embeddings=True)
    return cfg


def weights() -> dict:
    return cc.weights_for(config(), SEED)


def write_folder(folder: Path) -> Path:
    """The Hugging Face folder that was converted."""
    return cc.write_folder_for(config(), weights(), folder)


def quantize(quant: str, out: Path) -> Path:
    """The committed file quantized to ``quant`` (a key of :data:`MIXES`) by llama.cpp's quantizer."""
    from rcn_fast.testing import llamacpp_tools as lt

    lt.quantize(GGUF, out, quant, threads=2, allow_requantize=True)
    return out


def main(sdist: str) -> None:
    from rcn_fast.testing import llamacpp_tools as lt

    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        vendor = lt.vendor(Path(sdist), Path(tmp))
        lt.convert(vendor, write_folder(Path(tmp) / "hf"), GGUF, "q8_0", pre="gpt-2")
    manifest = {"converter": f"{cc.SDIST} (sdist sha256 {lt.sdist_digest(Path(sdist))}): "
                             "vendor/llama.cpp/convert_hf_to_gguf.py --outtype q8_0",
                "gguf_sha256": hashlib.sha256(GGUF.read_bytes()).hexdigest(),
                "weights_sha256": cc.digest_of(weights())}
    (DATA / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python {sys.argv[0]} llama_cpp_python-0.3.36.tar.gz")
    main(sys.argv[1])
