"""Test doubles of the RR / self-consistency tests (also used by
bench/bench_rr.py): a scripted LLM that returns given reasoning paths for
each question (``num_samples`` of them, rotated by the seed), a keyword NLI
model, and a tiny random-weight NLI classifier saved as a real model
directory."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from rcn_fast.llm.base import Cost, CostTracker, Generation, check_tags, normalise_labels, pad_rows
from rcn_fast.llm.chat import validate_chats
from rcn_fast.nli import NLIScores


def question_of(chat: list[dict]) -> str:
    """The question text of a chat (the first line of its last user turn)."""
    user = [t for t in chat if t["role"] == "user"][-1]["content"]
    return user.split("\n", 1)[0].removeprefix("Question: ").strip()


class PathsLLM:
    """Scripted sampling LLM: ``script(question_text) -> list of path texts``
    (or a dict). Sample ``j`` of a chat is ``paths[(j + seed) % len(paths)]``.
    Label scoring (the fallback pass): ``PICK=<label>`` in the question
    text wins, else hash-derived log-probabilities. Every call is recorded
    in ``calls`` as ``(kind, rows, num_samples, temperature, seed)``."""

    def __init__(self, script: dict[str, list[str]] | Callable[[str], list[str]], name: str = "paths") -> None:
        self.script = script
        self.identity = name
        self.cost = CostTracker()
        self.calls: list[tuple] = []
        self.chats: list[list[dict]] = []

    def paths(self, question: str) -> list[str]:
        if callable(self.script):
            return list(self.script(question))
        return list(self.script.get(question, ["I am not sure."]))

    def generate(self, chats: Sequence[Any], *, max_new_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, num_samples: int = 1, seed: int = 0, stop: Sequence[str] | None = None,
                 tags: Sequence[str] | None = None) -> list[list[Generation]]:
        valid = validate_chats(chats)
        tags = check_tags(tags, len(valid))
        self.calls.append(("generate", len(valid), num_samples, temperature, seed))
        out, costs = [], []
        for c in valid:
            self.chats.append(c)
            options = self.paths(question_of(c)) or [""]
            n_prompt = sum(len(t["content"].split()) for t in c)
            gens = []
            for j in range(num_samples):
                text = options[(j + seed) % len(options)]
                words = text.split()
                reason = "stop"
                if len(words) > max_new_tokens:
                    text, reason = " ".join(words[:max_new_tokens]), "length"
                gens.append(Generation(text=text, prompt_tokens=n_prompt, generated_tokens=len(text.split()),
                                       finish_reason=reason))
            out.append(gens)
            costs.append(Cost(1, n_prompt, sum(g.generated_tokens for g in gens)))
        self.cost.record_rows(costs, tags)
        return out

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        valid = validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        self.calls.append(("score", len(valid), 1, 0.0, 0))
        res, costs = [], []
        for c, labs in zip(valid, rows):
            text = "\n".join(t["content"] for t in c)
            m = re.search(r"PICK=(\w+)", text)
            s = np.array([int.from_bytes(hashlib.sha256(f"{text}|{lab}".encode()).digest()[:4], "little") % 1000 / 250.0
                          for lab in labs])
            if m and m.group(1) in labs:
                s[labs.index(m.group(1))] += 100.0
            res.append((s - s.max() - np.log(np.exp(s - s.max()).sum())).tolist())
            costs.append(Cost(1, sum(len(t["content"].split()) for t in c), 0))
        self.cost.record_rows(costs, tags)
        return pad_rows(res)


class KeywordNLI:
    """NLI double: a hypothesis containing ``TRUE`` is entailed (E=0.9,
    C=0.01), ``FALSE`` contradicted (E=0.001, C=0.995), anything else
    neutral (E=0.3, C=0.2). Records every call's size in ``calls``."""

    labels = ["entailment", "neutral", "contradiction"]

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.pairs: list[tuple[str, str]] = []

    def predict(self, premises: Sequence[str], hypotheses: Sequence[str]) -> NLIScores:
        self.calls.append(len(premises))
        self.pairs.extend(zip(premises, hypotheses))
        rows = []
        for h in hypotheses:
            if "TRUE" in h:
                rows.append((0.9, 0.09, 0.01))
            elif "FALSE" in h:
                rows.append((0.001, 0.004, 0.995))
            else:
                rows.append((0.3, 0.5, 0.2))
        p = np.asarray(rows, np.float32).reshape(-1, 3)
        return NLIScores(entailment=p[:, 0].copy(), contradiction=p[:, 2].copy(), probs=p, labels=list(self.labels))


def make_tiny_nli(path: Path, *, id2label: dict[int, str] | None = None, seed: int = 0) -> Path:
    """A random-weight BertForSequenceClassification (3 labels) with the
    tiny BERT tokenizer, saved to ``path`` as a real model directory."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from rcn_fast.testing.tiny_retrieval import make_tiny_bert

    path = Path(path)
    base = make_tiny_bert(path.parent / f"{path.name}-base")
    id2label = id2label or {0: "entailment", 1: "neutral", 2: "contradiction"}
    cfg = BertConfig.from_pretrained(str(base), num_labels=len(id2label), id2label=dict(id2label),
                                     label2id={v: k for k, v in id2label.items()}, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(str(base), trust_remote_code=False)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        # At init the [CLS] state barely depends on the other tokens; make it
        # depend on them: no constant [CLS]/position/type embeddings, large
        # word embeddings, a sharper classifier.
        emb = model.bert.embeddings
        emb.word_embeddings.weight.mul_(50.0)
        emb.word_embeddings.weight[tok.cls_token_id] = 0.0
        emb.position_embeddings.weight.zero_()
        emb.token_type_embeddings.weight.zero_()
        model.classifier.weight.mul_(20.0)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path
