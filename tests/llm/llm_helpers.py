"""Helpers of the LLM-layer tests: the tiny models and chats shared with the
benchmarks (rcn_fast/testing/tiny_llm.py, re-exported), a GGUF writer and
the call-cache writer process."""

from __future__ import annotations

import numpy as np

from rcn_fast.testing.tiny_llm import (  # noqa: F401  (shared with bench/; re-exported for the tests)
    CHATML,
    NO_SYSTEM,
    build_model,
    build_tokenizer,
    mcq_chat,
)


def write_llama_gguf(model, tok, path) -> None:
    """Write a tiny Llama model and its byte-level BPE tokenizer as a GGUF
    file, the way llama.cpp's converter lays them out (q/k rows permuted for
    its rope layout, which transformers' GGUF reader undoes)."""
    write_gguf(model, tok, path)


def write_tiny_gguf(folder, arch: str, *, build=build_model, qtype: str = "F32", pre: str | None = "gpt-2"):
    """``folder/tiny.gguf``: a tiny random-weight ``arch`` model made by
    ``build(arch, vocab, eos, pad)`` with :func:`build_tokenizer`'s
    vocabulary, written by :func:`write_gguf`; returns its path."""
    tok = build_tokenizer()
    model = build(arch, len(tok), tok.eos_token_id, tok.pad_token_id)
    path = folder / "tiny.gguf"
    write_gguf(model, tok, path, qtype=qtype, arch=arch, pre=pre)
    return path


def write_gguf(model, tok, path, *, qtype: str = "F32", arch: str = "llama", pre: str | None = "gpt-2") -> None:
    """Write a tiny Llama (``arch="llama"``: q/k rows permuted as llama.cpp's
    converter does) or Qwen2 model (``"qwen2"``: q/k/v biases, tied head)
    and its byte-level BPE tokenizer as a GGUF file, the matrices in GGML
    format ``qtype`` (``F32``, ``F16``, ``Q4_0``, ``Q4_1``, ``Q8_0``; norms
    and biases stay F32).

    ``pre`` is the file's ``tokenizer.ggml.pre``: ``"gpt-2"`` (the split
    the tokenizers of :func:`build_tokenizer` learned their merges with) as
    llama.cpp's converter labels a GPT-2-split vocabulary; another name
    (``"qwen2"``...) makes every reader split with that one; None writes no
    key (a file llama.cpp reads with its degraded "default" split)."""
    import json

    import gguf
    from gguf import quants

    cfg = model.config
    tj = json.loads(tok.backend_tokenizer.to_str())
    tokens = [None] * len(tok)
    for t, i in tj["model"]["vocab"].items():
        tokens[i] = t
    special = {a["id"] for a in tj["added_tokens"]}
    for a in tj["added_tokens"]:
        tokens[a["id"]] = a["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = getattr(cfg, "rope_parameters", None) or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_vocab_size(len(tok))
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    gtype = gguf.GGMLQuantizationType[qtype]

    def put(name, x):
        if x.ndim == 2 and qtype != "F32":
            w.add_tensor(name, quants.quantize(x.astype(np.float32), gtype), raw_dtype=gtype)
        else:
            w.add_tensor(name, x.astype(np.float32))

    def permute(x, n_head, n_kv):
        if arch != "llama":
            return x
        n = n_kv if n_kv != n_head else n_head
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    put("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {
        "attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], nh, nh))
        put(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], nh, nkv))
        for g, h in names.items():
            put(f"blk.{i}.{g}.weight", sd[p + h + ".weight"])
        for g in ("q", "k", "v"):
            if p + f"self_attn.{g}_proj.bias" in sd:
                put(f"blk.{i}.attn_{g}.bias", sd[p + f"self_attn.{g}_proj.bias"])
    put("output_norm.weight", sd["model.norm.weight"])
    if not getattr(cfg, "tie_word_embeddings", False):
        put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cache_writer(path: str, writer: int, n_keys: int, barrier, out_path: str) -> None:
    """One process of the concurrent-writers test: after the barrier, write
    ``n_keys`` entries (its own value for each, starting at another key than
    the other writers) and read each back at once; the values it saw go to
    ``out_path`` as JSON."""
    import json

    from rcn_fast.llm.cache import CallCache

    cache = CallCache(path)
    barrier.wait(timeout=120)
    seen = {}
    for j in range(n_keys):
        i = (j + 7 * writer) % n_keys
        key = CallCache.key("m", "k", {"i": i})
        cache.put_many([(key, "m", "k", {"i": i}, {"v": i, "writer": writer})])
        seen[i] = cache.get_many([key])[key]
    cache.close()
    with open(out_path, "w") as f:
        json.dump(seen, f)
