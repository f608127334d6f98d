"""ZEBRA's silver example KB: an LLM sees a training question, its options
and the correct answer, and writes one explanation per option (backing the
correct one, ruling out the others). Resumable: examples are appended to
the output file batch by batch, and a rerun skips the ids already there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rcn_fast.kb import Example
from rcn_fast.prompts import PromptSet, load_prompts, parse_bullets, parse_labelled
from rcn_fast._validate import is_int


@dataclass
class SilverResult:
    """What a build did: examples written now, skipped (already in the file),
    skipped for lacking a gold answer, and the file's total."""

    written: int
    resumed: int
    no_answer: int
    total: int
    path: str


def silver_chat(prompts: PromptSet, question: Any) -> list[dict[str, str]]:
    """The silver-knowledge chat of a question with a known answer."""
    if question.answer is None:
        raise ValueError(f"question: {question.id!r} has no gold answer; the silver recipe needs one")
    fmt = "\n".join(f"{lab}. ..." for lab in question.labels)
    return prompts.chat("silver_explanations", question, answer_label=question.labels[question.answer],
                        answer_format=fmt)


def parse_silver(text: str, labels: Sequence[str]) -> list[str]:
    """Per-option explanations in label order (lines without a label are
    used when the model ignored the format)."""
    got = [x for x in parse_labelled(text, labels) if x]
    return got if got else parse_bullets(text)


def _read_done(path: Path, identity: str) -> set[str]:
    """Ids already in ``path``; drops a torn last line left by a crash and
    refuses a file written by another model."""
    done: set[str] = set()
    if not path.is_file():
        return done
    raw = path.read_bytes()
    keep = len(raw)
    if raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
    for lineno, line in enumerate(raw[:keep].decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"out: {path} line {lineno} is not valid JSON; fix or delete the file") from None
        made_by = rec.get("meta", {}).get("llm")
        if made_by is not None and made_by != identity:
            raise ValueError(f"out: {path} was written by another model ({made_by!r:.120}); "
                             "use another --out file to build with this one")
        done.add(str(rec["id"]))
    if keep != len(raw):
        with open(path, "r+b") as f:
            f.truncate(keep)
    return done


def build_silver(questions: Sequence[Any], llm: Any, out: str | os.PathLike[str], *, prompts: Any = None,
                 batch_size: int = 16, max_new_tokens: int = 256, show_progress: bool = True) -> SilverResult:
    """Write a silver example KB for ``questions`` to ``out`` (JSON lines).

    Parameters
    ----------
    questions : sequence of MCQuestion
        Training questions; those without a gold answer are skipped.
    llm : LLM
        Greedy generation, one row per question.
    out : path
        Output KB file; examples already in it (by id) are skipped, so an
        interrupted build resumes where it stopped.
    prompts : path, mapping or PromptSet, optional
        Overrides of the ``silver_explanations`` template.
    batch_size : int
        Questions per LLM call (and per append to ``out``).
    max_new_tokens : int
    show_progress : bool
        tqdm bar on stderr.

    Returns
    -------
    SilverResult
    """
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    P = load_prompts(prompts)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    identity = str(getattr(llm, "identity", type(llm).__name__))
    done = _read_done(path, identity)
    with_answer = [q for q in questions if q.answer is not None]
    no_answer = len(questions) - len(with_answer)
    todo = [q for q in with_answer if q.id not in done]
    resumed = len(with_answer) - len(todo)
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(with_answer), initial=resumed, desc="silver KB", unit="q")
    written = 0
    try:
        with open(path, "a", encoding="utf-8") as f:
            for s in range(0, len(todo), batch_size):
                batch = todo[s : s + batch_size]
                chats = [silver_chat(P, q) for q in batch]
                res = llm.generate(chats, max_new_tokens=max_new_tokens, temperature=0.0,
                                   tags=[q.id for q in batch])
                lines = []
                for q, gens in zip(batch, res):
                    ex = Example.from_question(q, parse_silver(gens[0].text, q.labels))
                    ex.meta = {"source": "silver", "llm": identity, "finish_reason": gens[0].finish_reason}
                    lines.append(json.dumps(ex.to_dict(), ensure_ascii=False) + "\n")
                f.write("".join(lines))
                f.flush()
                os.fsync(f.fileno())
                written += len(batch)
                if bar is not None:
                    bar.update(len(batch))
    finally:
        if bar is not None:
            bar.close()
    return SilverResult(written=written, resumed=resumed, no_answer=no_answer, total=len(done) + written,
                        path=str(path))


__all__ = ["build_silver", "silver_chat", "parse_silver", "SilverResult"]
