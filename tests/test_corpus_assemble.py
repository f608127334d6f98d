"""``python -m rcn_fast.corpus assemble``: sources in their public layouts, dedup, exclusion, leakage, resume.

The fixtures are written here in the documented layouts: RACo's DPR-style
TSV files (``id<TAB>text<TAB>title``) in a folder with a ``cbd`` part, and
ZEBRA-KB explanation records with the hub dataset's fields (``id``,
``positives``, ``negatives``; ``explanation`` in the ECQA configs) as
Parquet and JSON lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rcn_fast.corpus import assemble as asm
from rcn_fast.corpus.assemble import AssembleConfig, assemble_corpus
from rcn_fast.corpus.leakage import LeakChecker, normalise_text
from rcn_fast.corpus.sources import SourceSpec, iter_source, record_texts
from rcn_fast.data import MCQuestion


def _write_tsv(path: Path, rows: list[tuple[str, str, str]], header: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["id\ttext\ttitle"] if header else []) + ["\t".join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def raco(tmp_path: Path) -> Path:
    root = tmp_path / "raco"
    _write_tsv(root / "facts" / "omcs.tsv", [
        ("1", "Ice is frozen water.", "omcs"),
        ("2", "A dog is a pet.", "omcs"),
        ("3", "Ice is frozen water.", "omcs"),  # exact duplicate
        ("4", "ice is FROZEN water", "omcs"),  # near duplicate only
    ])
    _write_tsv(root / "cbd" / "anli.tsv", [
        ("1", "The sun is responsible for plants sprouting, blooming and wilting.", "anli"),
        ("2", "Birds can fly south in winter.", "anli"),
    ], header=False)
    return root


@pytest.fixture
def zebra_parquet(tmp_path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({
        "id": ["csqa-1", "csqa-2"],
        "positives": [["Rivers flow downhill.", "Water flows from high to low."], ["A dog is a pet."]],
        "negatives": [None, None],
    })
    path = tmp_path / "zebra-all.parquet"
    pq.write_table(table, path)
    return path


@pytest.fixture
def ecqa_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "csqa-train-ecqa.jsonl"
    recs = [{"id": "e1", "positives": ["People sleep at night."], "negatives": ["Cats bark."],
             "explanation": "Most people sleep when it is dark."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def _obqa_question() -> MCQuestion:
    return MCQuestion(id="7-980", question="The sun is responsible for",
                      choices=["puppies learning new tricks", "children growing up and getting old",
                               "flowers wilting in a vase", "plants sprouting, blooming and wilting"], answer=3)


def _read(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_record_texts_zebra_fields():
    assert record_texts({"id": "x", "positives": ["a", " b "], "negatives": None}) == [("#0", "a"), ("#1", "b")]
    got = record_texts({"id": "x", "positives": ["a"], "negatives": ["n"], "explanation": "e"})
    assert got == [("#0", "a"), ("#1", "e")]  # negatives are never documents
    assert record_texts({"id": "x", "contents": "flash"}) == [("", "flash")]
    assert record_texts({"fact1": "f"}, text_field="fact1") == [("", "f")]
    with pytest.raises(ValueError, match="JSON object"):
        record_texts(["not", "an", "object"])


def test_raco_folder_labels_and_header(raco):
    docs = list(iter_source(SourceSpec("raco", str(raco))))
    assert [d.source for d in docs] == ["raco/cbd/anli"] * 2 + ["raco/facts/omcs"] * 4
    assert docs[0].orig_id == "1" and docs[0].text.startswith("The sun")  # header-less file: first row kept
    assert not any(d.orig_id == "id" for d in docs)  # header row skipped


def test_assemble_dedup_exclude_and_source_field(tmp_path, raco, zebra_parquet, ecqa_jsonl):
    out = tmp_path / "corpus.jsonl"
    res = assemble_corpus(AssembleConfig(
        sources=[f"raco={raco}", f"zebra={zebra_parquet}", f"ecqa={ecqa_jsonl}"], out=str(out), exclude=["cbd"]))
    recs = _read(out)
    texts = [r["text"] for r in recs]
    assert texts == ["Ice is frozen water.", "A dog is a pet.", "ice is FROZEN water",
                     "Rivers flow downhill.", "Water flows from high to low.",
                     "People sleep at night.", "Most people sleep when it is dark."]
    assert [r["id"] for r in recs] == [str(i) for i in range(len(recs))]
    assert {r["source"] for r in recs} == {"raco/facts/omcs", "zebra", "ecqa"}
    assert recs[3]["orig_id"] == "csqa-1#0"
    assert not any("sun" in t for t in texts)  # cbd excluded
    assert res.duplicates == {"raco/facts/omcs": 1, "zebra": 1}  # "A dog is a pet." twice across sources
    assert res.documents == 7

    near = tmp_path / "near.jsonl"
    assemble_corpus(AssembleConfig(sources=[f"raco={raco}"], out=str(near), exclude=["cbd"], dedup="near"))
    assert [r["text"] for r in _read(near)] == ["Ice is frozen water.", "A dog is a pet."]
    keep = tmp_path / "keep.jsonl"
    assemble_corpus(AssembleConfig(sources=[f"raco={raco}"], out=str(keep), dedup="none"))
    assert len(_read(keep)) == 6


def test_leak_check_counts_and_drops(tmp_path, raco):
    q = _obqa_question()
    wg = MCQuestion(id="wg-1", question="Sarah was a much better surgeon than Maria so _ always got the easier cases.",
                    choices=["Sarah", "Maria"], answer=1)
    leaky = tmp_path / "leaky.jsonl"
    leaky.write_text(json.dumps({"id": "s1", "text": "Maria was worse, so Sarah was a much better surgeon than "
                                 "Maria so Maria always got the easier cases."}) + "\n"
                     + json.dumps({"id": "s2", "text": "THE SUN is responsible for -- many things."}) + "\n",
                     encoding="utf-8")
    out = tmp_path / "c.jsonl"
    res = assemble_corpus(AssembleConfig(sources=[f"raco={raco}", f"stmts={leaky}"], out=str(out)),
                          tasks={"obqa": [q], "wg": [wg]})
    tasks = res.leaks["tasks"]
    assert tasks["obqa"]["by_source"] == {"raco/cbd/anli": {"question+answer": 1}, "stmts": {"question": 1}}
    assert tasks["wg"]["by_source"] == {"stmts": {"question+answer": 1}}
    assert tasks["obqa"]["questions_leaked"] == 1
    assert json.loads((tmp_path / "c.jsonl.leaks.json").read_text())["documents"] == 3  # distinct documents
    assert len(_read(out)) == 7  # report only: nothing dropped

    out2 = tmp_path / "c2.jsonl"
    res2 = assemble_corpus(AssembleConfig(sources=[f"raco={raco}", f"stmts={leaky}"], out=str(out2), drop_leaks=True),
                           tasks={"obqa": [q], "wg": [wg]})
    assert sum(res2.leaks_dropped.values()) == 3
    assert not any("responsible" in r["text"] or "surgeon" in r["text"] for r in _read(out2))


def test_leak_checker_whole_words_and_short_questions():
    q = MCQuestion(id="q", question="What is ice made of", choices=["water", "fire"], answer=0)
    chk = LeakChecker({"t": [q]})
    assert [p.kind for p in chk.match("So: what is ice made of? Water!")] == ["question+answer"]
    assert chk.match("somewhat is ice made offline") == []  # whole words only
    assert LeakChecker({"t": [MCQuestion(id="s", question="Why ice", choices=["a", "b"], answer=0)]}).n_patterns == 0
    assert normalise_text("  Ice-cream, IS  cold!") == "ice cream is cold"


def test_resume_after_interrupt_loses_nothing(tmp_path, raco, zebra_parquet, monkeypatch):
    out = tmp_path / "r.jsonl"
    cfg = AssembleConfig(sources=[f"raco={raco}", f"zebra={zebra_parquet}"], out=str(out), chunk_size=2)
    full = tmp_path / "full.jsonl"
    assemble_corpus(AssembleConfig(sources=cfg.sources, out=str(full)))

    real = asm.iter_source
    calls = {"n": 0}

    def flaky(spec, **kw):
        for doc in real(spec, **kw):
            calls["n"] += 1
            if calls["n"] == 6:
                raise KeyboardInterrupt
            yield doc

    monkeypatch.setattr(asm, "iter_source", flaky)
    with pytest.raises(KeyboardInterrupt):
        assemble_corpus(cfg)
    monkeypatch.setattr(asm, "iter_source", real)
    state = json.loads((tmp_path / "r.jsonl.assemble.json").read_text())
    assert not state["done"] and state["documents"] >= 1
    res = assemble_corpus(cfg)
    assert _read(out) == _read(full)
    assert res.documents == len(_read(full))
    assert sum(res.duplicates.values()) == 2  # counted once across the interrupt

    again = assemble_corpus(cfg)  # finished: nothing redone
    assert again.documents == res.documents and _read(out) == _read(full)
    with pytest.raises(ValueError, match="other sources, options or tasks"):
        assemble_corpus(AssembleConfig(sources=cfg.sources, out=str(out), dedup="near"))


def test_bad_arguments_are_named(tmp_path, raco):
    with pytest.raises(ValueError, match="--source: expected NAME=PATH_OR_HUB_ID"):
        assemble_corpus(AssembleConfig(sources=["nope"], out=str(tmp_path / "o.jsonl")))
    with pytest.raises(FileNotFoundError, match="--source x"):
        assemble_corpus(AssembleConfig(sources=[f"x={tmp_path / 'missing.tsv'}"], out=str(tmp_path / "o.jsonl")))
    existing = tmp_path / "exists.jsonl"
    existing.write_text("{}\n")
    with pytest.raises(ValueError, match="--overwrite"):
        assemble_corpus(AssembleConfig(sources=[f"raco={raco}"], out=str(existing)))
    bad = tmp_path / "bad.tsv"
    bad.write_text("only-one-column\n")
    with pytest.raises(ValueError, match=r"bad.tsv:1: expected id<TAB>text"):
        assemble_corpus(AssembleConfig(sources=[f"b={bad}"], out=str(tmp_path / "o2.jsonl")))


def test_cli_assemble_with_task_file(tmp_path, raco):
    task = tmp_path / "obqa-test.jsonl"
    q = _obqa_question()
    task.write_text(json.dumps({"id": q.id, "question": {"stem": q.question, "choices": [
        {"label": lab, "text": c} for lab, c in zip("ABCD", q.choices)]}, "answerKey": "D"}) + "\n")
    out = tmp_path / "cli.jsonl"
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.corpus", "assemble", "--source", f"raco={raco}",
                           "--out", str(out), "--task", f"obqa={task}", "--drop-leaks", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["leaks_dropped"] == {"raco/cbd/anli": 1}
    assert "leakage check: 1 document(s)" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.corpus", "assemble", "--source", "bad",
                           "--out", str(tmp_path / "x.jsonl")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--source: expected NAME=PATH_OR_HUB_ID" in proc.stderr


def test_real_obqa_facts_leak_into_obqa_test(tmp_path, shared_data):
    """OBQA's training facts against its own test questions (the real files)."""
    from rcn_fast.data import load_questions

    test_q = load_questions(shared_data / "obqa" / "obqa-test.jsonl")
    out = tmp_path / "facts.jsonl"
    res = assemble_corpus(AssembleConfig(sources=[f"obqa_train={shared_data / 'obqa' / 'obqa-train.jsonl'}"],
                                         out=str(out), text_field="fact1"), tasks={"obqa-test": test_q})
    assert res.documents == len(_read(out)) < sum(res.read.values())  # duplicates of fact1 dropped
    assert res.leaks is not None and res.leaks["documents"] >= 0


def test_eval_warns_when_the_corpus_holds_evaluated_questions(tmp_path, capsys):
    """python -m rcn_fast.eval with --corpus and a task: a warning with the counts (report only), cached."""
    from rcn_fast.corpus.leakage import cached_corpus_leak_summary, leak_warning

    q = _obqa_question()
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "contents": "the sun is responsible for plants sprouting, blooming "
                                  "and wilting"}) + "\n" + json.dumps({"id": "b", "contents": "Dogs bark."}) + "\n")
    summary = cached_corpus_leak_summary(str(corpus), {"obqa": [q]}, tmp_path / "cache")
    assert summary["documents"] == 1 and summary["tasks"]["obqa"]["by_source"] == {"corpus": {"question+answer": 1}}
    msg = leak_warning(str(corpus), summary)
    assert "obqa: 1 question(s) in 1 document(s)" in msg and "--drop-leaks" in msg
    assert len(list((tmp_path / "cache").glob("leaks-*.json"))) == 1
    assert leak_warning(str(corpus), {"documents": 0, "tasks": {}}) is None

    from rcn_fast.eval import EvalConfig
    from rcn_fast.eval.run.plan import plan, warn_corpus_leaks as _warn_corpus_leaks

    task = tmp_path / "obqa-test.jsonl"
    task.write_text(json.dumps({"id": q.id, "question": {"stem": q.question, "choices": [
        {"label": lab, "text": c} for lab, c in zip("ABCD", q.choices)]}, "answerKey": "D"}) + "\n")
    out = tmp_path / "out"
    cfg = EvalConfig(pipelines=["single_retrieval"], tasks=[str(task)], corpus=str(corpus), output_path=str(out))
    _, questions, units = plan(cfg, out)
    _warn_corpus_leaks(cfg, out, questions, units)
    assert "holds evaluated questions (obqa-test: 1 question(s) in 1 document(s))" in capsys.readouterr().err
    cfg.leak_check = False
    _warn_corpus_leaks(cfg, out, questions, units)
    assert capsys.readouterr().err == ""


# ------------------------------------------------ sources without a text (issue 37)
def _arc_layout(path: Path, n: int = 3) -> Path:
    """Questions in the commonsense layout (ARC's train file): no statement field at all."""
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": {"stem": f"Why {i}?", "choices": [
        {"label": "A", "text": "yes"}, {"label": "B", "text": "no"}]}, "answerKey": "A"}) + "\n"
        for i in range(n)), encoding="utf-8")
    return path


def test_obqa_fact1_is_a_statement_field():
    """The commonsense layout's facts (OpenBookQA's fact1) are found without --text-field."""
    rec = {"id": "7-980", "question": {"stem": "The sun is responsible for"}, "fact1": "the sun is a star",
           "answerKey": "D"}
    assert record_texts(rec) == [("", "the sun is a star")]
    assert record_texts({"text": "t", "fact1": "f"}) == [("", "t")]  # text still comes first


def test_source_without_text_says_what_it_saw_and_exits_2(tmp_path):
    """A source whose records hold no text field: the fields seen and --text-field, exit 2 when nothing
    at all was read; the next run with --text-field needs no --overwrite."""
    from rcn_fast.corpus.__main__ import main

    arc = _arc_layout(tmp_path / "arc-train.jsonl")
    out = tmp_path / "id.jsonl"
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.corpus", "assemble", "--source", f"arc={arc}",
                           "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no document was read from any source" in proc.stderr
    assert "--source arc" in proc.stderr and "the fields of those records: id, question, answerKey" in proc.stderr
    assert "--text-field" in proc.stderr
    with pytest.raises(ValueError, match="no record held a text"):
        assemble_corpus(AssembleConfig(sources=[f"arc={arc}"], out=str(out)))
    res = assemble_corpus(AssembleConfig(sources=[f"arc={arc}"], out=str(out), text_field="answerKey",
                                         dedup="none"))  # another field, no --overwrite needed
    assert res.documents == 3 and [r["text"] for r in _read(out)] == ["A", "A", "A"]
    assert main(["assemble", "--source", f"arc={arc}", "--out", str(tmp_path / "again.jsonl"), "--no-progress",
                 "--text-field", "nope"]) == 2


def test_partly_textless_source_warns_with_counts(tmp_path, raco, caplog):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"id": "1", "text": "Water boils at 100 C."}) + "\n"
                     + json.dumps({"id": "2", "sentence": "No text field here."}) + "\n", encoding="utf-8")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with caplog.at_level("WARNING", logger="rcn_fast.corpus.assemble"):
        res = assemble_corpus(AssembleConfig(sources=[f"m={mixed}", f"e={empty}", f"raco={raco}"],
                                             out=str(tmp_path / "o.jsonl")))
    assert res.documents > 1
    text = caplog.text
    assert "--source m" in text and "1 of its 2 records" in text and "id, sentence" in text
    assert "--source e" in text and "holds no record" in text
    assert "--source raco" not in text


def test_build_of_an_empty_assembled_file_says_why(tmp_path):
    """`corpus build` of the empty file an assemble left: how it came to be empty and what to do."""
    pytest.importorskip("torch")
    from tests.retrieval.tiny import make_tiny_bert

    arc = _arc_layout(tmp_path / "arc-train.jsonl")
    out = tmp_path / "id.jsonl"
    with pytest.raises(ValueError):
        assemble_corpus(AssembleConfig(sources=[f"arc={arc}"], out=str(out)))
    assert out.is_file() and out.stat().st_size == 0
    model = make_tiny_bert(tmp_path / "bert")
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.corpus", "build", "--input", str(out), "--encoder",
                           str(model), "--out", str(tmp_path / "store"), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "holds no records" in proc.stderr and "written by `python -m rcn_fast.corpus assemble`" in proc.stderr
    assert "--source arc" in proc.stderr and "--text-field" in proc.stderr
    plain = tmp_path / "plain.jsonl"  # any other empty file: a store of nothing is refused, whatever --text-field
    plain.write_text("\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "rcn_fast.corpus", "build", "--input", str(plain), "--encoder",
                           str(model), "--out", str(tmp_path / "store2"), "--text-field", "text", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "holds no records" in proc.stderr and "--text-field" in proc.stderr
