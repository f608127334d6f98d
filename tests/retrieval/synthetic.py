"""A small synthetic retrieval task for the trainer test: each topic owns a
few keywords; its explanations and questions mix one or two keywords with
many filler words shared by all topics, so an untrained encoder is misled
by the filler and a trained one learns to look at the keywords."""

from __future__ import annotations

import json
import random
from pathlib import Path

FILLER = ("often usually because might could where every some many other about around during before after "
          "between under over through across against along among behind beyond inside outside near").split()


def topic_words(n_topics: int, per_topic: int = 3) -> list[list[str]]:
    syll = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "tu", "vo", "ze", "bi", "do"]
    words, out = set(), []
    rnd = random.Random(7)
    for _ in range(n_topics):
        ws = []
        while len(ws) < per_topic:
            w = "".join(rnd.choice(syll) for _ in range(3))
            if w not in words:
                words.add(w)
                ws.append(w)
        out.append(ws)
    return out


def sentence(rnd: random.Random, keys: list[str], n_key: int, n_fill: int) -> str:
    toks = rnd.sample(keys, n_key) + [rnd.choice(FILLER) for _ in range(n_fill)]
    rnd.shuffle(toks)
    return " ".join(toks)


def make_task(path: Path, n_topics: int = 24, n_expl: int = 4, seed: int = 0, n_key: int = 2, n_fill: int = 6):
    """Writes the training file; returns (all words, corpus [(id, text, topic)],
    held-out queries [(text, topic)])."""
    rnd = random.Random(seed)
    topics = topic_words(n_topics)
    train, corpus, held = [], [], []
    for t, keys in enumerate(topics):
        expl = [sentence(rnd, keys, n_key, n_fill) for _ in range(n_expl)]
        train.append({"question": sentence(rnd, keys, n_key, n_fill), "explanations": expl})
        corpus += [(f"t{t}-{i}", sentence(rnd, keys, n_key, n_fill), t) for i in range(3)]
        held += [(sentence(rnd, keys, n_key, n_fill), t) for _ in range(2)]
    with open(path, "w") as f:
        for r in train:
            f.write(json.dumps(r) + "\n")
    words = FILLER + [w for ks in topics for w in ks]
    return words, corpus, held


def recall_at_k(encoder, corpus, held, k: int = 3) -> float:
    import numpy as np

    p = encoder.encode_passages([c[1] for c in corpus])
    q = encoder.encode_queries([h[0] for h in held])
    top = np.argsort(-(q @ p.T), axis=1)[:, :k]
    topics = np.array([c[2] for c in corpus])
    return float(np.mean([(topics[row] == h[1]).sum() / min(k, 3) for row, h in zip(top, held)]))
