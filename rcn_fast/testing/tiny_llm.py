"""Tiny language models built in code for the tests and benchmarks: a
byte-level BPE tokenizer trained in code with a ChatML template (or one
without a system role), tiny random-weight Llama / Qwen2 models built with
the real transformers classes, a multiple-choice chat, and a tiny Llama
saved as a real model directory (the pipeline tests' model)."""

from __future__ import annotations

from pathlib import Path

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


def build_tokenizer(template: str = CHATML, *, vocab_size: int = 400, corpus: list[str] | None = None):
    """A byte-level BPE tokenizer trained in code on ``corpus`` (default: a
    few multiple-choice lines) up to ``vocab_size`` tokens (any text encodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((_CORPUS if corpus is None else corpus) * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )


def build_model(arch: str, vocab: int, eos: int, pad: int):
    """A tiny random-weight ``LlamaForCausalLM`` (``arch="llama"``) or
    ``Qwen2ForCausalLM`` (``"qwen2"``, tied embeddings) of ``vocab`` tokens,
    its 2-D weights sharpened so outputs depend on the input (eval mode)."""
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
        raise ValueError(f"arch: expected 'llama' or 'qwen2', got {arch!r}")
    # random init is near-uniform; sharpen it so outputs depend on the input
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(8.0)
    return model.eval()


def mcq_chat(question: str, prefill: str = "Answer: ", system: bool = True) -> list[dict]:
    """A multiple-choice chat: optional system turn, the question, an
    assistant turn prefilled with ``prefill``."""
    turns = []
    if system:
        turns.append({"role": "system", "content": "Pick the best answer."})
    turns.append({"role": "user", "content": question})
    turns.append({"role": "assistant", "content": prefill})
    return turns


_PIPELINE_TEXT = [
    "Question: What do plants need to grow? Options: A. sunlight B. darkness C. salt",
    "Explanations:\n* plants need sunlight to make food.\n* darkness stops growth.",
    "Merged explanation: plants use light. Answer: A Answer: B Answer: C Answer: D",
    "Reference passages from an external source: a magnet attracts iron. water freezes.",
    "You will read a question that comes with answer options. Is the task clear? Understood.",
]


def make_tiny_llama(path: Path, *, seed: int = 0) -> Path:
    """Write a random-weight LlamaForCausalLM + tokenizer to ``path``."""
    import torch
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_PIPELINE_TEXT * 10, trainer)
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      chat_template=CHATML)
    cfg = tf.LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharpen the near-uniform init so outputs depend on the input
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(6.0)
    path = Path(path)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


__all__ = ["CHATML", "NO_SYSTEM", "build_tokenizer", "build_model", "mcq_chat", "make_tiny_llama"]
