"""Helpers of the LLM-layer tests and benchmarks: chat templates, a byte-level
BPE tokenizer trained in code, tiny random-weight Llama/Qwen2 models built with
the real transformers classes, and a multiple-choice chat."""

from __future__ import annotations

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# a template without a system role (raises, as Gemma's does)
NO_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "Question: Where would you put a plate after washing it? A. cupboard B. table C. floor D. oven E. car",
    "Answer: A",
    "Answer: B",
    " A B C D E F G H I J K L",
    "Explanations:\n* plates are kept in a cupboard.\n* a car is not for plates.",
    "The quick brown fox jumps over the lazy dog. Knowledge connects concepts.",
    "What is 2 + 2? 4. Name a colour: blue, red, green.",
]


def build_tokenizer(template: str = CHATML):
    """A byte-level BPE tokenizer trained in code (any text encodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )


def build_model(arch: str, vocab: int, eos: int, pad: int):
    import torch
    import transformers as tf

    common = dict(
        vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
    )
    torch.manual_seed(0)
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(tie_word_embeddings=False, **common))
    elif arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(tie_word_embeddings=True, **common))
    else:
        raise ValueError(arch)
    # random init is near-uniform; sharpen it so outputs depend on the input
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(8.0)
    return model.eval()


def mcq_chat(question: str, prefill: str = "Answer: ", system: bool = True) -> list[dict]:
    turns = []
    if system:
        turns.append({"role": "system", "content": "Pick the best answer."})
    turns.append({"role": "user", "content": question})
    turns.append({"role": "assistant", "content": prefill})
    return turns


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
