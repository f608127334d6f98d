"""Tiny random-weight models built in code for the end-to-end pipeline tests:
a Llama causal LM with a byte-level BPE tokenizer and a ChatML template
(saved as a real model directory), and the retrieval tests' tiny BERT."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TEXT = [
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
    tok.train_from_iterator(_TEXT * 10, trainer)
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
