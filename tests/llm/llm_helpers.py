"""Helpers of the LLM-layer tests: the tiny models and chats shared with the
benchmarks (rcn_fast/testing/tiny_llm.py, re-exported), a GGUF writer and
the call-cache writer process."""

from __future__ import annotations

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
    import json

    import gguf

    cfg = model.config
    tj = json.loads(tok.backend_tokenizer.to_str())
    tokens = [None] * len(tok)
    for t, i in tj["model"]["vocab"].items():
        tokens[i] = t
    special = {a["id"] for a in tj["added_tokens"]}
    for a in tj["added_tokens"]:
        tokens[a["id"]] = a["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
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
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)

    def permute(x, n_head, n_kv):
        n = n_kv if n_kv != n_head else n_head
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {
        "attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], nh, nh))
        w.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], nh, nkv))
        for g, h in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[p + h + ".weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
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
