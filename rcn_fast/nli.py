"""Natural language inference with any Hugging Face sequence-classification
model: entailment and contradiction probabilities of (premise, hypothesis)
pairs, batched.

* :class:`NLIModel` -- ``NLIModel.from_pretrained(path_or_id)``;
  ``predict(premises, hypotheses) -> NLIScores``.
* :class:`NLILike` -- the protocol pipelines use (RR): anything with that
  ``predict``.

Which output is "entailment" and which "contradiction" is read from the
model config (``id2label`` / ``label2id``: a label whose lower-cased name
contains ``entail`` / ``contradict``). Models whose config only has generic
names (``LABEL_0`` ...) need ``label_names=`` (e.g. Nie et al.'s
``ynie/roberta-large-snli_mnli_fever_anli_R1_R2_R3-nli``, the NLI model of
the RR paper, orders its outputs entailment, neutral, contradiction).

Models that work: ``cross-encoder/nli-deberta-v3-base`` (or ``-large``,
``-small``), ``FacebookAI/roberta-large-mnli``,
``microsoft/deberta-large-mnli``, ``ynie/roberta-large-snli_mnli_fever_anli_R1_R2_R3-nli``
(with ``label_names``). None ships offline here: download one first
(``huggingface-cli download cross-encoder/nli-deberta-v3-base``) and pass
its id or directory.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from rcn_fast._arrays import require
from rcn_fast._validate import check_texts, is_int

logger = logging.getLogger("rcn_fast.nli")
HINT = 'pip install "rcn_fast[llm]"  (torch, transformers)'


@dataclass
class NLIScores:
    """NLI outputs of ``n`` pairs.

    Attributes
    ----------
    entailment : float32 [n]
        P(entailment | premise, hypothesis).
    contradiction : float32 [n]
        P(contradiction | premise, hypothesis).
    probs : float32 [n, L]
        Softmax over all of the model's L labels (config order).
    labels : list of str
        The model's label names in output order.
    """

    entailment: np.ndarray
    contradiction: np.ndarray
    probs: np.ndarray
    labels: list[str]

    def __len__(self) -> int:
        return int(self.entailment.shape[0])


@runtime_checkable
class NLILike(Protocol):
    """What RR needs from an NLI model."""

    def predict(self, premises: Sequence[str], hypotheses: Sequence[str]) -> NLIScores:
        """Scores of the pairs ``(premises[i], hypotheses[i])``."""
        ...


def label_indices(config: Any, label_names: Sequence[str] | None = None) -> tuple[int, int, list[str]]:
    """(entailment index, contradiction index, label names) of a model config.

    Parameters
    ----------
    config : transformers.PretrainedConfig (``id2label``, ``label2id``, ``num_labels``)
    label_names : sequence of str, optional
        Names of the outputs in order, overriding the config's.

    Raises
    ------
    ValueError
        When no label name contains "entail" or none contains "contradict".
    """
    n = int(getattr(config, "num_labels", 0) or len(getattr(config, "id2label", {}) or {}))
    if label_names is not None:
        names = [str(x) for x in label_names]
        if len(names) != n:
            raise ValueError(f"label_names: the model has {n} outputs, got {len(names)} names {names}")
    else:
        id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
        label2id = {str(k): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
        names = [id2label.get(i, "") for i in range(n)]
        for lab, i in label2id.items():  # fill gaps from label2id
            if 0 <= i < n and not names[i]:
                names[i] = lab
    low = [x.lower() for x in names]
    ent = [i for i, x in enumerate(low) if "entail" in x and "not" not in x]
    con = [i for i, x in enumerate(low) if "contradict" in x]
    if len(ent) != 1 or len(con) != 1:
        raise ValueError(
            f"config: cannot tell which output is entailment and which contradiction from the labels {names} "
            f"(id2label/label2id); pass label_names=[...] in output order, e.g. "
            f"['entailment', 'neutral', 'contradiction']"
        )
    return ent[0], con[0], names


class NLIModel:
    """A Hugging Face ``AutoModelForSequenceClassification`` NLI model.

    Parameters
    ----------
    model, tokenizer : the transformers model and its tokenizer
    label_names : sequence of str, optional
        Output names in order, when the config's are generic.
    batch_size : int
        Pairs per forward pass (pairs are sorted by length first).
    max_length : int
        Token limit of a pair. A longer pair loses premise tokens only
        (``truncation="only_first"``): the hypothesis -- RR's sentence
        under test -- is kept whole. A pair whose hypothesis alone does not
        fit (with the special tokens and one premise token) is truncated
        longest-first instead, so it is still scored.
    device : str, optional
        Default: CUDA when available, else CPU.

    Examples
    --------
    >>> nli = NLIModel.from_pretrained("cross-encoder/nli-deberta-v3-base")    # doctest: +SKIP
    >>> s = nli.predict(["Aristotle died in 322 BC."], ["Aristotle lived in ancient Greece."])
    >>> s.entailment.shape, s.contradiction.dtype                              # doctest: +SKIP
    ((1,), dtype('float32'))
    """

    def __init__(self, model: Any, tokenizer: Any, *, label_names: Sequence[str] | None = None,
                 batch_size: int = 32, max_length: int = 512, device: str | None = None, name: str = "") -> None:
        torch = require("torch", HINT)
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
        if not is_int(max_length) or max_length < 8:
            raise ValueError(f"max_length: expected an int >= 8, got {max_length!r}")
        self.entailment_index, self.contradiction_index, self.labels = label_indices(model.config, label_names)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        limit = getattr(tokenizer, "model_max_length", None)
        self.max_length = min(max_length, limit) if isinstance(limit, int) and limit > 0 else max_length
        pos = getattr(model.config, "max_position_embeddings", None)
        if isinstance(pos, int) and pos > 0:  # RoBERTa-style position ids start at padding_idx + 1
            pos -= 2 if getattr(model.config, "model_type", "") in ("roberta", "xlm-roberta") else 0
            self.max_length = min(self.max_length, pos)
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.calls = 0  # predict() calls that ran the model

    @classmethod
    def from_pretrained(cls, path_or_id: str | os.PathLike[str], *, label_names: Sequence[str] | None = None,
                        batch_size: int = 32, max_length: int = 512, device: str | None = None,
                        dtype: str = "auto") -> "NLIModel":
        """Load a model directory, an installed model package, or a Hugging
        Face id already in the local cache.

        Parameters
        ----------
        path_or_id : str or path
        label_names, batch_size, max_length, device : see :class:`NLIModel`
        dtype : {"auto", "float32", "float16", "bfloat16"}
            ``"auto"``: float32 on CPU, float16 on CUDA.
        """
        torch = require("torch", HINT)
        tf = require("transformers", HINT)
        from rcn_fast.model_files import resolve_model_dir

        if dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype: expected 'auto', 'float32', 'float16' or 'bfloat16', got {dtype!r}")
        model_dir = resolve_model_dir(str(path_or_id))
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "float16" if str(device).startswith("cuda") else "float32"
        tok = tf.AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
        model = tf.AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                                      trust_remote_code=False)
        return cls(model, tok, label_names=label_names, batch_size=batch_size, max_length=max_length,
                   device=device, name=str(path_or_id))

    @property
    def identity(self) -> str:
        return f"nli:{self.name}"

    def predict(self, premises: Sequence[str], hypotheses: Sequence[str]) -> NLIScores:
        """Entailment and contradiction probabilities of every pair.

        Parameters
        ----------
        premises, hypotheses : sequences of str, same length n

        Returns
        -------
        NLIScores (``entailment`` / ``contradiction`` float32 [n],
        ``probs`` float32 [n, L])
        """
        torch = require("torch", HINT)
        premises, hypotheses = check_texts(premises, "premises"), check_texts(hypotheses, "hypotheses")
        if len(premises) != len(hypotheses):
            raise ValueError(f"hypotheses: expected {len(premises)} items (one per premise), got {len(hypotheses)}")
        n, L = len(premises), len(self.labels)
        probs = np.zeros((n, L), np.float32)
        if n:
            self.calls += 1
            # premise-only truncation for every pair whose hypothesis fits; the others longest-first.
            # Each group is batched on its own, so a pair's strategy never depends on its batch.
            long_h = self._hypothesis_too_long(hypotheses)
            with torch.inference_mode():
                for strategy, group in (("only_first", [i for i in range(n) if not long_h[i]]),
                                        ("longest_first", [i for i in range(n) if long_h[i]])):
                    order = sorted(group, key=lambda i: -(len(premises[i]) + len(hypotheses[i])))
                    for s in range(0, len(order), self.batch_size):
                        idx = order[s : s + self.batch_size]
                        enc = self.tokenizer([premises[i] for i in idx], [hypotheses[i] for i in idx],
                                             padding=True, truncation=strategy, max_length=self.max_length,
                                             return_tensors="pt")
                        enc = {k: v.to(self.device) for k, v in enc.items()}
                        logits = self.model(**enc).logits.float()
                        probs[idx] = torch.softmax(logits, dim=-1).cpu().numpy()
        return NLIScores(entailment=probs[:, self.entailment_index].copy(),
                         contradiction=probs[:, self.contradiction_index].copy(), probs=probs,
                         labels=list(self.labels))

    def _hypothesis_too_long(self, hypotheses: list[str]) -> list[bool]:
        """Per hypothesis: True when it cannot stay whole within
        ``max_length`` (its tokens + the pair's special tokens + one
        premise token exceed it)."""
        special = self.tokenizer.num_special_tokens_to_add(pair=True)
        budget = self.max_length - special - 1
        lens = [len(x) for x in self.tokenizer(hypotheses, add_special_tokens=False)["input_ids"]]
        return [k > budget for k in lens]

    def __repr__(self) -> str:
        return (f"NLIModel({self.name!r}, labels={self.labels}, entailment={self.entailment_index}, "
                f"contradiction={self.contradiction_index}, device={self.device!r})")


def load_nli(spec: Any, **kwargs: Any) -> NLILike:
    """An NLI model from a spec: an object with ``predict`` is returned as
    is; a path / package / cached hub id is loaded with
    :meth:`NLIModel.from_pretrained` (``**kwargs`` passed on)."""
    if spec is None:
        raise TypeError("nli: expected an NLI model or a model path/id, got None")
    if hasattr(spec, "predict") and not isinstance(spec, (str, os.PathLike)):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return NLIModel.from_pretrained(Path(spec) if isinstance(spec, os.PathLike) else spec, **kwargs)
    raise TypeError(f"nli: expected an object with predict(premises, hypotheses) or a model path/id, "
                    f"got {type(spec).__name__}")


__all__ = ["NLIModel", "NLILike", "NLIScores", "label_indices", "load_nli"]
