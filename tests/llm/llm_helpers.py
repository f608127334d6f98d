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
