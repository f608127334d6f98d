"""Test doubles of the pipeline tests: a deterministic scripted LLM that
implements the rcn_fast.llm.LLM protocol (its outputs depend only on the
chat it is given), and a hashed bag-of-words encoder (numpy only)."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Sequence

import numpy as np

from rcn_fast.llm.base import Cost, CostTracker, Generation, check_tags, normalise_labels, pad_rows
from rcn_fast.llm.chat import validate_chats


def _h(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def stage_of(chat: list[dict]) -> str:
    """Which pipeline stage wrote a chat (read from its default-prompt wording)."""
    system = chat[0]["content"]
    if system.startswith(("Reference passages", "External knowledge references")):
        return "knowledge_extraction"
    if system.startswith(("Candidate explanations", "A list of explanations")):
        return "knowledge_aggregation"
    if "for the correct option a sentence" in system:
        return "silver_explanations"
    if "15 words at most" in system:
        return "example_generation"
    if "write a list of explanations" in system or "write thorough explanations" in system:
        return "query_expansion"
    if "Reply with the label" in system or "reply with its label" in system or "pick the label" in system:
        return "answer"
    if system.startswith("Explanations:") and "Reply with a short answer" in system:
        return "answer"  # ReConnect's open answer (a generation)
    return "unknown"


def _question_line(chat: list[dict]) -> str:
    user = [t for t in chat if t["role"] == "user"][-1]["content"]
    m = re.match(r"Question:\s*(.*)", user)  # "Question: q" or "Question:\nq"
    return m.group(1).strip() if m else user.split("\n", 1)[0].strip()


def _options_block(user: str) -> str | None:
    """The text after the "Options:" / "Choices:" header (None: an open question)."""
    m = re.search(r"^(?:Options|Choices):\n", user, re.M)
    return user[m.end():] if m else None


def _listed(system: str) -> list[str]:
    head = system.split("\n\n", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\* (.*)$", head, re.M)]


class ScriptedLLM:
    """A deterministic LLM double.

    Generation answers by stage (see :func:`stage_of`):

    * query expansion: ``n_explanations`` bullet lines naming the question,
      then a blank line and a second paragraph (which must be dropped);
      an open question (no options): ``"reason <i> about <question>"``;
    * extraction: one line per listed passage, ``"from: <passage>"``;
    * aggregation: ``"merged <k> items: <first item>"``;
    * open answer (ReConnect on an open question): ``"<first knowledge item>\n(done)"``;
    * example generation: ``"like <first example question>"``;
    * silver: ``"A. ...\\nB. ..."`` with the correct label marked.

    Label scoring: log-softmax of hash-derived scores of (prompt, label),
    except when the prompt's knowledge contains ``PICK=<label>``.
    Records every call in ``calls`` (kind, rows) and ``chats``.
    """

    def __init__(self, n_explanations: int = 6, name: str = "scripted") -> None:
        self.identity = name
        self.cost = CostTracker()
        self.n_explanations = n_explanations
        self.calls: list[tuple[str, int]] = []
        self.chats: list[tuple[str, list[dict]]] = []
        self.gen_kwargs: list[dict] = []

    def respond(self, chat: list[dict]) -> str:
        stage = stage_of(chat)
        q = _question_line(chat)
        if stage == "query_expansion":
            user = [t for t in chat if t["role"] == "user"][-1]["content"]
            block = _options_block(user)
            if block is None:  # an open question
                return "\n* ".join(f"reason {i} about {q}" for i in range(1, self.n_explanations + 1)) + \
                    "\n\nA closing remark that is not an explanation."
            opts = re.findall(r"^\S+\. (.*)$", block.split("\n\n", 1)[0], re.M)
            lines = [f"reason {i} about {opts[(i - 1) % len(opts)]}" for i in range(1, self.n_explanations + 1)]
            return "\n* ".join(lines) + "\n\nA closing remark that is not an explanation."
        if stage == "knowledge_extraction":
            docs = _listed(chat[0]["content"])
            return "\n".join(f"- from: {d}" for d in docs) if docs else "nothing relevant"
        if stage == "knowledge_aggregation":
            items = _listed(chat[0]["content"])
            first = items[0] if items else "none"
            return f"merged {len(items)} items: {first}\nsecond line of the merge\n\nnot kept"
        if stage == "answer" and chat[0]["content"].startswith("Explanations:"):  # open: the first knowledge item
            items = _listed(chat[0]["content"])
            return f"{items[0] if items else 'no knowledge'}\n(done)"
        if stage == "example_generation":
            ex = [t for t in chat if t["role"] == "user"]
            first = ex[0]["content"].split("\n", 1)[0] if len(ex) > 1 else "no examples"
            return f"like {first}\n* {len(ex) - 1} examples seen"
        if stage == "silver_explanations":
            user = chat[-1]["content"] if chat[-1]["role"] == "user" else chat[-2]["content"]
            correct = re.search(r"Correct option: (\S+)", user).group(1)
            labels = re.findall(r"^(\S+)\. ", user.split("Options:\n", 1)[1], re.M)
            return "\n".join(f"{lab}. {'supports' if lab == correct else 'rules out'} {lab} for {q}" for lab in labels)
        return f"generic output for {q}"

    def generate(self, chats: Sequence[Any], *, max_new_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, num_samples: int = 1, seed: int = 0, stop: Sequence[str] | None = None,
                 tags: Sequence[str] | None = None) -> list[list[Generation]]:
        valid = validate_chats(chats)
        tags = check_tags(tags, len(valid))
        self.calls.append(("generate", len(valid)))
        self.gen_kwargs.append(dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed))
        out, costs = [], []
        for c in valid:
            self.chats.append(("generate", c))
            text = self.respond(c)
            words = text.split()
            if len(words) > max_new_tokens:
                text, reason = " ".join(words[:max_new_tokens]), "length"
            else:
                reason = "stop"
            n_prompt = sum(len(t["content"].split()) for t in c)
            g = Generation(text=text, prompt_tokens=n_prompt, generated_tokens=len(text.split()), finish_reason=reason)
            out.append([g])
            costs.append(Cost(1, n_prompt, g.generated_tokens))
        self.cost.record_rows(costs, tags)
        return out

    def label_logprobs(self, chats: Sequence[Any], labels: Any, *, tags: Sequence[str] | None = None) -> np.ndarray:
        valid = validate_chats(chats)
        rows = normalise_labels(labels, len(valid))
        tags = check_tags(tags, len(valid))
        self.calls.append(("score", len(valid)))
        res, costs = [], []
        for c, labs in zip(valid, rows):
            self.chats.append(("score", c))
            text = "\n".join(t["content"] for t in c)
            m = re.search(r"PICK=(\w+)", text)
            s = np.array([(_h(text + "|" + lab) % 1000) / 250.0 for lab in labs], dtype=np.float64)
            if m and m.group(1) in labs:
                s[labs.index(m.group(1))] += 100.0
            lp = s - np.log(np.exp(s - s.max()).sum()) - s.max()
            res.append(lp.astype(np.float32).tolist())
            costs.append(Cost(1, sum(len(t["content"].split()) for t in c), 0))
        self.cost.record_rows(costs, tags)
        return pad_rows(res)


class HashEncoder:
    """Hashed bag-of-words embeddings (numpy; deterministic; L2-normalised)."""

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim

    def _enc(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9]+", t.lower()):
                h = _h(w)
                out[i, h % self.dim] += 1.0 if (h >> 20) & 1 else -1.0
                out[i, (h >> 8) % self.dim] += 0.5
            n = np.linalg.norm(out[i])
            if n > 0:
                out[i] /= n
        return out

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        return self._enc(list(texts))

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        return self._enc(list(texts))

    def describe(self) -> dict:
        return {"model": "hash-bow", "model_dir": None, "fingerprint": f"hash-{self.dim}", "backend": "numpy",
                "quantize": None, "pooling": "sum", "normalize": True, "query_prefix": "", "passage_prefix": "",
                "max_length": 512, "dim": self.dim}


FACTS = [
    "plants need sunlight to make food", "a magnet attracts iron objects", "water freezes below zero degrees",
    "bees carry pollen between flowers", "the moon reflects light from the sun", "sound travels through air",
    "a thermometer measures temperature", "rain falls when clouds condense", "animals eat food for energy",
    "friction between surfaces makes heat", "metal conducts electricity well", "wood conducts heat poorly",
    "seeds grow into new plants", "the heart pumps blood", "fish breathe with gills", "ice melts when heated",
    "salt dissolves in water", "mirrors reflect light", "a lever helps lift heavy loads", "owls hunt at night",
    "plants need water to grow", "sunlight gives plants energy", "iron is attracted by a magnet",
    "heat makes ice melt into water", "clouds are made of water drops", "the sun is a star",
]
