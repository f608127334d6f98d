"""The packaged tasks: each hub task read from a small fixture in its
dataset's schema and repository layout (the hub call itself redirected to
the fixture folder, and the same folder given as ``name=DIR``); the
authors' files behind NumerSense, Story Cloze and WSC; the pinned-URL
source against a real HTTP server on 127.0.0.1; the loader fixes and the
command-line habits (``name:split``, ``--split``, underscores, comma lists,
fractional ``--limit``, ``--include_path``, ``--list-tasks``); non-UTF-8
files named with their line."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import json
import os
import re
import threading
import warnings
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import pytest  # noqa: E402

from rcn_fast.eval import EvalConfig, EvalError  # noqa: E402
from rcn_fast.eval.cli import main  # noqa: E402
from rcn_fast.eval.tasks.catalog import (  # noqa: E402
    TaskCountWarning,
    TaskError,
    get_task,
    hub_load_args,
    load_task_questions,
    resolve_task,
    split_inline_choices,
)

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

AUTHORS = "https://raw.githubusercontent.com/JunhoKim94/ReConnect/6d8ec2c9d6af8270e179cb88fe9f86a66e8d0e44/data/OOD/"


# ------------------------------------------------------------ hub fixtures
def _card(configs: dict[str, dict[str, str]]) -> str:
    """A dataset card whose YAML lists the configs and their split files, as the hub's do."""
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        for split, path in splits.items():
            lines += [f"  - split: {split}", f"    path: {path}"]
    return "\n".join(lines + ["---", ""])


def _write(folder: Path, rel: str, rows: list[dict[str, Any]]) -> None:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif rel.endswith(".tsv"):
        keys = list(rows[0])
        body = ["\t".join(keys)] + ["\t".join(str(r[k]) for k in keys) for r in rows]
        path.write_text("\n".join(body) + "\n", encoding="utf-8")
    else:  # JSON lines
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _mc(labels, texts):
    return {"text": list(texts), "label": list(labels)}


# task -> (files: {path in the repository: rows}, card configs or None, expected per row:
#          (question, choices, answer index[, labels]))
# The rows carry every column of the dataset's current files (parquet on the main branch, or the
# refs/convert/parquet conversion for script-only repositories), so a renamed column fails here.
_ARC_ROW = [{"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a "
             "meteorite impact. Which is the most likely effect of this increase in rotation?",
             "choices": _mc("ABCD", ["Planetary density will decrease.", "Planetary years will become longer.",
                                     "Planetary days will become shorter.", "Planetary gravity will become stronger."]),
             "answerKey": "C"},
            {"id": "MCAS_2000_4_6", "question": "Which technology was developed most recently?",
             "choices": _mc("1234", ["cellular telephone", "television", "refrigerator", "airplane"]),
             "answerKey": "1"}]
_ARC_WANT = [(_ARC_ROW[0]["question"], _ARC_ROW[0]["choices"]["text"], 2, list("ABCD")),
             ("Which technology was developed most recently?", _ARC_ROW[1]["choices"]["text"], 0, list("1234"))]


def _arc(config):
    splits = {s: f"{config}/{s}-*" for s in ("train", "test", "validation")}
    return ({f"{config}/{s}-00000-of-00001.parquet": _ARC_ROW for s in splits}, {config: splits}, _ARC_WANT)


def _default(split, rows, want, *, ext="parquet", folder="data"):
    files = {f"{folder}/{split}-00000-of-00001.{ext}": rows, f"{folder}/train-00000-of-00001.{ext}": rows}
    return files, {"default": {split: f"{folder}/{split}-*", "train": f"{folder}/train-*"}}, want


HUB_FIXTURES: dict[str, tuple[dict[str, list[dict[str, Any]]], dict | None, list[tuple]]] = {
    "arc-easy": _arc("ARC-Easy"),
    "arc-challenge": _arc("ARC-Challenge"),
    "csqa": _default("validation", [
        {"id": "1afa02df02c908a558b4036e80242fac", "question": "A revolving door is convenient for two direction "
         "travel, but it also serves as a security measure at a what?", "question_concept": "revolving door",
         "choices": _mc("ABCDE", ["bank", "library", "department store", "mall", "new york"]), "answerKey": "A"}],
        [(None, ["bank", "library", "department store", "mall", "new york"], 0, list("ABCDE"))]),
    # tasksource/commonsense_qa_2.0 keeps the authors' JSON-lines files (unsure of their names on the hub)
    "csqa2": ({"CSQA2_dev.json": [
        {"id": "0039e2343eb0368b5dfe4261e603a7d5", "question": "Cotton candy is sometimes made out of cotton?",
         "answer": "no", "confidence": 0.7, "relational_prompt": "made of", "relational_prompt_used": True,
         "topic_prompt": "cotton", "topic_prompt_used": False, "validations": ["disagree", "disagree"]}],
        "CSQA2_train.json": [{"id": "t", "question": "Is water wet?", "answer": "yes", "confidence": 1.0,
                              "relational_prompt": "", "relational_prompt_used": False, "topic_prompt": "",
                              "topic_prompt_used": False, "validations": ["agree"]}]},
        None, [("Cotton candy is sometimes made out of cotton?", ["yes", "no"], 1, ["A", "B"])]),
    "hellaswag": _default("validation", [
        {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
         "ctx": "A man is sitting on a roof. he", "endings": ["is using wrap to wrap a pair of skis.",
                                                              "is ripping level tiles off.",
                                                              "is holding a rubik's cube.",
                                                              "starts pulling up roofing on a roof."],
         "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"}],
        [("A man is sitting on a roof. he", None, 3, list("ABCD"))]),
    "obqa": ({"main/test-00000-of-00001.parquet": [
        {"id": "8-343", "question_stem": "A person wants to start saving money so that they can afford a nice "
         "vacation at the end of the year. After looking over their budget and expenses, they decide the best way "
         "to save money is to", "choices": _mc("ABCD", ["make more phone calls", "quit eating lunch out",
                                                        "buy less with monopoly money",
                                                        "have lunch with friends"]), "answerKey": "B"}]},
        {"main": {"test": "main/test-*"}}, [(None, None, 1, list("ABCD"))]),
    "piqa": ({"plain_text/validation/0000.parquet": [
        {"goal": "How do I ready a guinea pig cage for it's new occupants?",
         "sol1": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped paper strips.",
         "sol2": "Provide the guinea pig with a cage full of a few inches of bedding made of ripped jeans material.",
         "label": 0}], "plain_text/train/0000.parquet": [{"goal": "g", "sol1": "a", "sol2": "b", "label": 1}]},
        None, [("How do I ready a guinea pig cage for it's new occupants?", None, 0, ["A", "B"])]),
    "qasc": _default("validation", [
        {"id": "3NGI5ARFTT4HNGVWXAMLNBMFA0U1PG", "question": "Climate is generally described in terms of what?",
         "choices": _mc("ABCDEFGH", ["sand", "occurs over a wide range", "forests", "Global warming",
                                     "rapid changes occur", "local weather conditions", "measure of motion",
                                     "city life"]),
         "answerKey": "F", "fact1": "Climate is generally described in terms of temperature and moisture.",
         "fact2": "Fire behavior is driven by local weather conditions such as winds, temperature and moisture.",
         "combinedfact": "Climate is generally described in terms of local weather conditions",
         "formatted_question": "Climate is generally described in terms of what? (A) sand ..."}],
        [("Climate is generally described in terms of what?", None, 5, list("ABCDEFGH"))]),
    "quarel": _default("validation", [
        {"id": "QuaRel_V1_Fr_0223", "answer_index": 1,
         "logical_forms": ["(infer (speed higher world1) (smoothness higher world2) (smoothness higher world1))"],
         "logical_form_pretty": "qrel(speed, higher, world1) -> qrel(smoothness, higher, world2) ; ...",
         "world_literals": {"world1": ["carpet"], "world2": ["ice"]},
         "question": "Mike was snowboarding on the snow and hit a piece of ice. He went much faster on the ice "
                     "because _____ is smoother. (A) snow (B) ice"}],
        [("Mike was snowboarding on the snow and hit a piece of ice. He went much faster on the ice because _____ "
          "is smoother.", ["snow", "ice"], 1, ["A", "B"])]),
    "quartz": _default("validation", [
        {"id": "QRQA-10116-3", "question": "John was looking at the sky. The bigger the star, the _____ it is. "
         "Big stars are", "choices": _mc("AB", ["brighter", "dimmer"]), "answerKey": "A",
         "para": "The more massive a star is, the brighter it shines.", "para_id": "QRSent-10116",
         "para_anno": {"effect_prop": "brightness", "cause_dir_str": "more", "effect_dir_str": "brighter",
                       "cause_dir_sign": "MORE", "effect_dir_sign": "MORE", "cause_prop": "mass"},
         "question_anno": {"effect_prop": "brightness", "cause_dir_str": "bigger", "effect_dir_str": "",
                           "cause_dir_sign": "MORE", "effect_dir_sign": "MORE", "cause_prop": "size"}}],
        [(None, ["brighter", "dimmer"], 0, ["A", "B"])]),
    "riddlesense": ({"default/validation/0000.parquet": [
        {"answerKey": "E", "question": "I have keys but no locks. I have space but no room. What am I?",
         "choices": _mc("ABCDE", ["piano", "map", "car", "book", "keyboard"])}],
        "default/train/0000.parquet": [{"answerKey": "A", "question": "q", "choices": _mc("AB", ["x", "y"])}]},
        None, [(None, ["piano", "map", "car", "book", "keyboard"], 4, list("ABCDE"))]),
    "sciq": _default("validation", [
        {"question": "Who proposed the theory of evolution by natural selection?", "distractor3": "Scopes",
         "distractor1": "Linnaeus", "distractor2": "shaw", "correct_answer": "darwin", "support": ""}],
        [("Who proposed the theory of evolution by natural selection?", "shuffled", "darwin", list("ABCD"))]),
    "winogrande": ({"winogrande_xl/validation-00000-of-00001.parquet": [
        {"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.",
         "option1": "Sarah", "option2": "Maria", "answer": "1"}]},
        {"winogrande_xl": {"validation": "winogrande_xl/validation-*"}},
        [(None, ["Sarah", "Maria"], 0, ["A", "B"])]),
}

OPEN_FIXTURES = {
    "nq": ({"nq_open/validation-00000-of-00001.parquet": [
        {"question": "when was the last time anyone was on the moon", "answer": ["14 December 1972 UTC",
                                                                                  "December 1972"]}]},
        {"nq_open": {"validation": "nq_open/validation-*"}},
        ["when was the last time anyone was on the moon", ["14 December 1972 UTC", "December 1972"], None]),
    "triviaqa": ({"rc.nocontext/validation-00000-of-00001.parquet": [
        {"question": "Which Lloyd Webber musical premiered in the US on 10th December 1993?",
         "question_id": "tc_33", "question_source": "http://www.triviacountry.com/",
         "entity_pages": {"doc_source": [], "filename": [], "title": [], "wiki_context": []},
         "search_results": {"description": [], "filename": [], "rank": [], "title": [], "url": [],
                            "search_context": []},
         "answer": {"aliases": ["Sunset Blvd", "Sunset Boulevard"], "normalized_aliases": ["sunset blvd"],
                    "matched_wiki_entity_name": "", "normalized_matched_wiki_entity_name": "",
                    "normalized_value": "sunset boulevard", "type": "WikipediaEntity", "value": "Sunset Boulevard"}}]},
        {"rc.nocontext": {"validation": "rc.nocontext/validation-*"}},
        ["Which Lloyd Webber musical premiered in the US on 10th December 1993?",
         ["Sunset Boulevard", "Sunset Blvd"], "tc_33"]),
    # akariasai/PopQA: one TSV file (unsure whether the hub has converted it); possible_answers is a JSON string
    "popqa": ({"test.tsv": [
        {"id": 4222362, "subj": "George Rankin", "prop": "occupation", "obj": "politician", "subj_id": 1850297,
         "prop_id": 22, "obj_id": 2834605, "s_aliases": "[\"George James Rankin\"]",
         "o_aliases": "[\"political leader\"]", "s_uri": "http://www.wikidata.org/entity/Q5543720",
         "o_uri": "http://www.wikidata.org/entity/Q82955", "s_wiki_title": "George Rankin",
         "o_wiki_title": "Politician", "s_pop": 142, "o_pop": 25692,
         "question": "What is George Rankin's occupation?",
         "possible_answers": "[\"politician\", \"political leader\"]"}]}, None,
        ["What is George Rankin's occupation?", ["politician", "political leader"], "4222362"]),
    "webq": _default("test", [
        {"url": "http://www.freebase.com/view/en/justin_bieber", "question": "what is the name of justin bieber "
         "brother?", "answers": ["Jazmyn Bieber", "Jaxon Bieber"]}],
        ["what is the name of justin bieber brother?", ["Jazmyn Bieber", "Jaxon Bieber"], None]),
}

YES_NO_FIXTURES = {
    "strategyqa": _default("test", [
        {"qid": "4fd64bb6ce5b78ab20b6", "term": "Mixed martial arts", "description": "full contact combat sport",
         "question": "Is Mixed martial arts totally original from Roman Colosseum games?", "answer": False,
         "facts": ["Mixed Martial arts in the UFC takes place in an enclosed structure called The Octagon."],
         "decomposition": ["What was the arena for Roman Colosseum games?"]}],
        [("Is Mixed martial arts totally original from Roman Colosseum games?", ["yes", "no"], 1)]),
}


def _materialise(folder: Path, files: dict[str, list[dict[str, Any]]], card: dict | None) -> Path:
    for rel, rows in files.items():
        _write(folder, rel, rows)
    if card:
        (folder / "README.md").write_text(_card(card), encoding="utf-8")
    return folder


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """Redirect ``datasets.load_dataset`` of a hub id to a local fixture
    folder, checking the call is the one the task makes on the hub (same
    id, config, split, revision and kwargs); returns the recorded calls.
    Every load caches under the test's folder, not the user's cache."""
    real = datasets.load_dataset
    calls: list[tuple[str, dict[str, Any]]] = []
    folders: dict[str, Path] = {}
    cache = str(tmp_path / "hf-datasets-cache")

    def fake(path, *args, **kwargs):
        if path not in folders:
            return real(path, *args, cache_dir=cache, **kwargs)
        assert not args, "the task passes everything by keyword"
        calls.append((path, dict(kwargs)))
        kwargs.pop("revision", None)  # a local folder has no revisions
        return real(str(folders[path]), cache_dir=cache, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    return folders, calls


def _check_mc(qs, want):
    assert len(qs) == len(want)
    for q, (question, choices, answer, labels) in zip(qs, want):
        if question is not None:
            assert q.question == question
        if choices == "shuffled":  # sciq: the answer is "darwin" wherever it lands
            assert sorted(q.choices) == sorted(["darwin", "Linnaeus", "shaw", "Scopes"])
            assert q.choices[q.answer] == answer
        else:
            if choices is not None:
                assert q.choices == choices
            assert q.answer == answer
        assert q.labels == labels


def _no_count_warning_but(name):
    """Loads of a one-row fixture warn about the count: check the message has both numbers."""
    def check(record):
        msgs = [str(w.message) for w in record if issubclass(w.category, TaskCountWarning)]
        spec = get_task(name)
        assert msgs and all(f"the paper's set has {spec.expected_count}" in m for m in msgs), msgs
    return check


@pytest.mark.parametrize("name", sorted(HUB_FIXTURES))
def test_hub_multiple_choice_tasks_read_their_schema(tmp_path, hub, name):
    files, card, want = HUB_FIXTURES[name]
    spec = get_task(name)
    folder = _materialise(tmp_path / name, files, card)
    folders, calls = hub
    folders[spec.dataset] = folder
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        qs = load_task_questions(spec)  # the hub call, answered from the fixture
    _no_count_warning_but(name)(rec)
    _check_mc(qs, want)
    path, kwargs = hub_load_args(spec)
    assert calls == [(path, kwargs)] and kwargs["split"] == spec.split
    # the same folder given on the command line: the same questions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        again = load_task_questions(resolve_task(f"{name}={folder}"))
    assert [q.to_dict() for q in again] == [q.to_dict() for q in qs]


@pytest.mark.parametrize("name", sorted(OPEN_FIXTURES))
def test_hub_open_domain_tasks_read_their_schema(tmp_path, hub, name):
    files, card, (question, answers, qid) = OPEN_FIXTURES[name]
    spec = get_task(name)
    folder = _materialise(tmp_path / name, files, card)
    hub[0][spec.dataset] = folder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        qs = load_task_questions(spec)
        again = load_task_questions(resolve_task(f"{name}={folder}"))
    assert len(qs) == 1 and qs[0].question == question and qs[0].answers == answers
    if qid is not None:
        assert qs[0].id == qid
    assert [q.to_dict() for q in again] == [q.to_dict() for q in qs]
    assert hub[1] == [hub_load_args(spec)]


def test_hub_yes_no_task_reads_its_schema(tmp_path, hub):
    files, card, want = YES_NO_FIXTURES["strategyqa"]
    spec = get_task("strategyqa")
    hub[0][spec.dataset] = _materialise(tmp_path / "sqa", files, card)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        qs = load_task_questions(spec)
    assert [(q.question, q.choices, q.answer) for q in qs] == want and qs[0].id == "4fd64bb6ce5b78ab20b6"
    assert hub[1] == [hub_load_args(spec)]


def test_every_packaged_task_names_a_loadable_source_and_the_papers_split():
    from rcn_fast.eval.tasks.catalog import PARQUET_REVISION, available_tasks

    script_only = {"ybisk/piqa", "INK-USC/riddle_sense", "INK-USC/numer_sense", "winograd_wsc",
                   "LSDSem/story_cloze"}
    for name in available_tasks():
        spec = get_task(name)
        if name == "demo":
            continue
        assert spec.expected_count and spec.paper_table, name
        assert spec.dataset not in script_only or spec.revision == PARQUET_REVISION, name
        assert spec.dataset not in ("allenai/quarel", "nq_open", "commonsense_qa", "winogrande", "hellaswag")
        covered = name in HUB_FIXTURES or name in OPEN_FIXTURES or name in YES_NO_FIXTURES or spec.url
        assert covered, f"{name}: no offline fixture"
    assert (get_task("arc-easy").split, get_task("arc-easy").expected_count) == ("test", 2376)
    assert (get_task("arc-challenge").split, get_task("arc-challenge").expected_count) == ("test", 1172)
    assert get_task("quarel").dataset == "community-datasets/quarel" and get_task("quarel").expected_count == 278
    piqa = hub_load_args(get_task("piqa"))
    assert piqa == ("ybisk/piqa", {"split": "validation", "revision": PARQUET_REVISION})
    wsc = dataclasses.replace(get_task("piqa"), dataset="ErnestSDavis/winograd_wsc", config="wsc273", split="test")
    assert hub_load_args(wsc)[1] == {"split": "test", "revision": PARQUET_REVISION, "data_dir": "wsc273"}
    for name, file, sha, n in (
            ("numersense", "numersense-dev.jsonl", "d5201b4cc36dfa10ca74ff14b59d19d0444c857fbc8d706cb841e75a684c44a1",
             200),
            ("storycloze", "sct-dev.jsonl", "16cc55afc3ef765315f179e48a0f68d989b5c82e268ee3d49010dea3f9de9652", 1571),
            ("wsc", "wsc-dev.jsonl", "b28673a6959d4523cfd0e86a2a1364bacd867c188cb1c2b50d4f24e761ac67d3", 273)):
        spec = get_task(name)
        assert (spec.url, spec.sha256, spec.expected_count) == (AUTHORS + file, sha, n)


# ------------------------------------------------------------ the authors' files
def _authors_file(path: Path, n: int, n_choices: int, *, kind: str) -> Path:
    """A file in the layout of the ReConnect authors' releases (CommonsenseQA JSON lines)."""
    words = ["no", "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            if kind == "numersense":
                stem, texts = f"a kid can count up to <mask> on one hand typically ({i}).", words
            elif kind == "sct":
                stem = f"Story {i}: Tom bought a bike. He rode it to school. It rained. He got wet."
                texts = ["He dried off in class.", "He flew to the moon."]
            else:
                stem = f"The trophy doesn't fit into the brown suitcase because ({i})"
                texts = ["the trophy is too large.", "the suitcase is too large."]
            choices = [{"label": chr(65 + j), "text": t} for j, t in enumerate(texts[:n_choices])]
            f.write(json.dumps({"id": f"{kind}-{i}", "question": {"stem": stem, "choices": choices},
                                "answerKey": chr(65 + i % n_choices)}) + "\n")
    return path


@pytest.mark.parametrize("name,kind,n,k", [("numersense", "numersense", 200, 12), ("storycloze", "sct", 1571, 2),
                                          ("wsc", "wsc", 273, 2)])
def test_authors_files_load_through_their_tasks(tmp_path, name, kind, n, k):
    f = _authors_file(tmp_path / f"{kind}-dev.jsonl", n, k, kind=kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskCountWarning)  # the paper's count: no warning
        qs = load_task_questions(resolve_task(f"{name}={f}"))
        by_dir = load_task_questions(resolve_task(f"{name}={tmp_path}"))  # a folder of *dev*.jsonl
    assert len(qs) == n and all(len(q.choices) == k for q in qs) and by_dir == qs
    assert [q.answer for q in qs[:3]] == [0, 1 % k, 2 % k]
    short = _authors_file(tmp_path / "short.jsonl", n - 1, k, kind=kind)
    with pytest.warns(TaskCountWarning, match=f"has {n - 1} questions, the paper's set has {n}"):
        load_task_questions(resolve_task(f"{name}={short}"))


# ------------------------------------------------------------ the pinned URL source
class _Server:
    """A real HTTP server on 127.0.0.1 serving a folder, counting requests."""

    def __init__(self, folder: Path):
        self.hits: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.hits.append(self.path)
                super().do_GET()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler,
                                                                                          directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def server(tmp_path):
    (tmp_path / "www").mkdir()
    s = _Server(tmp_path / "www")
    yield s
    s.close()


def test_url_source_downloads_once_verifies_and_works_offline(tmp_path, server, monkeypatch):
    from rcn_fast.data.fetch import FetchError, cache_dir, cached_path

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    f = _authors_file(tmp_path / "www" / "numersense-dev.jsonl", 200, 12, kind="numersense")
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    spec = dataclasses.replace(get_task("numersense"), url=f"{server.url}/numersense-dev.jsonl", sha256=sha)

    qs = load_task_questions(spec)  # download
    assert len(qs) == 200 and all(len(q.choices) == 12 for q in qs) and len(server.hits) == 1
    assert cached_path(spec.url, sha).read_bytes() == f.read_bytes()
    assert cached_path(spec.url, sha).parent.parent == cache_dir() == tmp_path / "cache" / "tasks"
    assert load_task_questions(spec, limit=5) == qs[:5] and len(server.hits) == 1  # cache hit

    bad = dataclasses.replace(spec, sha256="0" * 64)
    with pytest.raises(FetchError, match=f"checksum mismatch.*has sha256 {sha}, the task pins 0000"):
        load_task_questions(bad)
    assert not cached_path(bad.url, bad.sha256).exists() and len(server.hits) == 2
    assert not [p for p in cached_path(bad.url, bad.sha256).parent.iterdir() if p.name.startswith(".part")]

    server.close()  # offline after the first download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_task_questions(spec) == qs
    with pytest.raises(FetchError, match="offline mode is on"):
        load_task_questions(dataclasses.replace(spec, url=spec.url + "?v=2", sha256="1" * 64))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(FetchError, match="cannot download"):  # the server is gone, nothing cached
        load_task_questions(dataclasses.replace(spec, sha256="2" * 64))


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    from rcn_fast.data.fetch import cache_dir

    monkeypatch.delenv("RCN_FAST_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_dir() == tmp_path / "hf" / "rcn_fast" / "tasks"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "huggingface" / "rcn_fast" / "tasks"
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine" / "tasks"


def test_task_yaml_url_needs_a_checksum(tmp_path):
    from rcn_fast.eval.tasks.catalog import spec_from_dict

    with pytest.raises(TaskError, match="sha256: expected the 64 hexadecimal digits"):
        spec_from_dict({"name": "t", "url": "https://example.org/x.jsonl"}, "t.yaml")
    with pytest.raises(TaskError, match="exactly one source"):
        spec_from_dict({"name": "t", "url": "https://example.org/x.jsonl", "sha256": "a" * 64, "local": "x"}, "t")
    with pytest.raises(TaskError, match="expected_count must be a positive integer"):
        spec_from_dict({"name": "t", "local": "x.jsonl", "expected_count": 0}, "t.yaml")


# ------------------------------------------------------------ loader fixes
def _csqa_file(path: Path, n: int, n_choices: int = 4, first_is_answer: bool = False) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            choices = [{"label": chr(65 + j), "text": f"option {j} of {i}"} for j in range(n_choices)]
            key = "A" if first_is_answer else chr(65 + i % n_choices)
            f.write(json.dumps({"id": f"q{i}", "question": {"stem": f"Question {i}?", "choices": choices},
                                "answerKey": key}) + "\n")
    return path


def test_name_dir_reads_csqa_layout_split_files_for_multiple_choice_tasks(tmp_path):
    d = tmp_path / "arc"
    d.mkdir()
    _csqa_file(d / "arc-easy-test.jsonl", 7)
    _csqa_file(d / "arc-easy-dev.jsonl", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        qs = load_task_questions(resolve_task(f"arc-easy={d}"))  # the task's split: test
        dev = load_task_questions(resolve_task(f"arc_easy:validation={d}"))
        csqa = load_task_questions(resolve_task(f"csqa={d}", split="test"))
    assert len(qs) == 7 and len(dev) == 3 and len(csqa) == 7 and qs[0].choices[0] == "option 0 of 0"


@pytest.mark.parametrize("task,folder,n_choices", [
    ("arc-easy", "arc-easy", None), ("arc_challenge", "arc-challenge", None), ("csqa", "csqa", 5),
    ("csqa2", "csqa2", 2), ("obqa", "obqa", 4), ("piqa", "piqa", 2), ("qasc", "qasc", 8), ("winogrande", "wg", 2)])
def test_shared_benchmark_folders_give_the_papers_sets(shared_data, task, folder, n_choices):
    """The real benchmark files, as folders of split files: each task picks
    the paper's split, and its size is the task's expected count."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskCountWarning)
        qs = load_task_questions(resolve_task(f"{task}={shared_data / folder}"))
    assert len(qs) == get_task(task).expected_count and all(q.answer is not None for q in qs)
    if n_choices:
        assert {len(q.choices) for q in qs} == {n_choices}


def test_open_domain_save_to_disk_folder_uses_the_tasks_fields(tmp_path):
    d = tmp_path / "nq_saved"
    rows = [{"question": "who wrote hamlet", "answer": ["William Shakespeare", "Shakespeare"]}]
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)}).save_to_disk(str(d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        qs = load_task_questions(resolve_task(f"nq={d}"))
    assert qs[0].question == "who wrote hamlet" and qs[0].answers == ["William Shakespeare", "Shakespeare"]
    with pytest.raises(TaskError, match=r"has the splits \['validation'\], not 'test'"):
        load_task_questions(resolve_task(f"nq:test={d}"))


@pytest.mark.parametrize("name", ["csqa", "strategyqa", "webq"])
def test_dataset_kwargs_reach_every_loader(tmp_path, hub, name):
    spec = get_task(name)
    files, card, _ = {**HUB_FIXTURES, **OPEN_FIXTURES, **YES_NO_FIXTURES}[name]
    hub[0][spec.dataset] = _materialise(tmp_path / name, files, card)
    spec.dataset_kwargs = {"keep_in_memory": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        load_task_questions(spec)
    assert hub[1][0][1]["keep_in_memory"] is True


def test_local_file_of_a_shuffle_choices_task_keeps_its_order(tmp_path):
    f = _csqa_file(tmp_path / "sciq-dev.jsonl", 6, first_is_answer=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TaskCountWarning)
        qs = load_task_questions(resolve_task(f"sciq={f}"))
    assert all(q.answer == 0 and q.choices[0] == f"option 0 of {i}" for i, q in enumerate(qs))


@pytest.mark.parametrize("text,stem,choices", [
    ("Which is slower? (A) a snail (B) a horse", "Which is slower?", ["a snail", "a horse"]),
    ("The puck slides further on (A) ice (B) carpet. Why is that?", "The puck slides further on Why is that?",
     ["ice", "carpet"]),
    ("A car goes faster on the road than on gravel, so the gravel has (A) more friction (B) less friction.",
     "A car goes faster on the road than on gravel, so the gravel has", ["more friction", "less friction"]),
    ("Pick one (A) St. Louis (B) Mr. Smith's house", "Pick one", ["St. Louis", "Mr. Smith's house"]),
])
def test_quarel_inline_options(text, stem, choices):
    got = split_inline_choices(text)
    assert got == (stem, choices, ["A", "B"])


def test_quarel_inline_options_need_two():
    with pytest.raises(ValueError, match=r"\(A\) \.\.\. \(B\)"):
        split_inline_choices("no options here")


# ------------------------------------------------------------ command-line habits
def test_names_splits_commas_and_fractional_limits(tmp_path):
    assert resolve_task("arc_easy").name == "arc-easy" and resolve_task("ARC_Challenge").name == "arc-challenge"
    spec = resolve_task("arc_easy:validation")
    assert spec.split == "validation" and spec.expected_count is None  # the count is the test split's
    assert resolve_task("arc-easy", split="train").split == "train"
    assert resolve_task("arc-easy:test", split="train").split == "test"  # name:split wins
    with pytest.raises(TaskError, match="reads one file .* no split 'test'"):
        resolve_task("numersense:test")
    assert resolve_task("numersense", split="test").split == "dev"  # --split leaves one-file tasks be
    assert resolve_task("numersense", split="test").expected_count == 200
    with pytest.raises(TaskError, match="unknown task 'arc_eazy'"):
        resolve_task("arc_eazy")
    cfg = EvalConfig(tasks=["csqa,arc_easy", "piqa"], limit=0.25, split="validation")
    assert cfg.tasks == ["csqa", "arc_easy", "piqa"] and cfg.limit == 0.25
    assert EvalConfig(limit=3.0).limit == 3
    for bad in (0, 1.5, -0.2, "3", True):
        with pytest.raises(EvalError, match="limit"):
            EvalConfig(limit=bad)
    f = _csqa_file(tmp_path / "q.jsonl", 25)
    spec = resolve_task(str(f))
    assert len(load_task_questions(spec, limit=0.1)) == 3 and len(load_task_questions(spec, limit=4)) == 4
    assert len(load_task_questions(spec, limit=0.999)) == 25


def test_cli_flags_reach_the_config(tmp_path):
    from rcn_fast.eval.cli import build_parser, config_from_args

    (tmp_path / "mine").mkdir()
    ns = build_parser().parse_args(["--tasks", "csqa,piqa", "obqa", "--limit", "0.1", "--split", "test",
                                    "--include_path", str(tmp_path / "mine")])
    cfg = config_from_args(ns)
    assert cfg.tasks == ["csqa", "piqa", "obqa"] and cfg.limit == 0.1 and cfg.split == "test"
    assert cfg.include_path == [str(tmp_path / "mine")]
    assert config_from_args(build_parser().parse_args(["--limit", "5", "--include-path", str(tmp_path)])).limit == 5


def _cli(args, capsys):
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return code, cap.out, cap.err


def test_include_path_tasks_and_list_tasks(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    _csqa_file(mine / "mine_q.jsonl", 5)
    (mine / "my_task.yaml").write_text("name: my_task\nkind: multiple_choice\nlocal: mine_q.jsonl\n"
                                       "expected_count: 5\npaper_table: my table\n", encoding="utf-8")
    (mine / "_fragment.yaml").write_text("kind: multiple_choice\n", encoding="utf-8")  # an include fragment
    spec = resolve_task("my-task", include_paths=[str(mine)])
    assert spec.local == str((mine / "mine_q.jsonl").resolve())  # relative to the task file
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskCountWarning)
        assert len(load_task_questions(spec)) == 5
    code, out, _ = _cli(["--list-tasks", "--include_path", str(mine)], capsys)
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert "my_task" in lines and "my table" in lines["my_task"]
    assert re.search(r"arc-easy\s+in-domain\s+multiple_choice\s+test\s+2,376\s+ReConnect Table 1", lines["arc-easy"])
    assert "refs/convert/parquet" in lines["piqa"] and "1,838" in lines["piqa"]
    assert AUTHORS + "wsc-dev.jsonl" in lines["wsc"] and "273" in lines["wsc"]
    assert "ActiveRAG Table 2" in lines["nq"] and "RR Table 1" in lines["strategyqa"]
    assert {ln.split()[0] for ln in out.splitlines()[1:]} >= set(get_task.__globals__["available_tasks"]())


# ------------------------------------------------------------ non-UTF-8 files
def test_non_utf8_files_name_the_file_and_line(tmp_path, capsys):
    out = ["--output-path", str(tmp_path / "out"), "--no-progress", "--no-plot", "--model", str(tmp_path / "none"),
           "--pipelines", "vanilla"]
    data = _csqa_file(tmp_path / "latin1.jsonl", 4)
    lines = data.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"Question 2?", b"Qu\xe9stion 2?")
    data.write_bytes(b"".join(lines))
    code, _, err = _cli(["--tasks", str(data), *out], capsys)
    assert code == 2 and f"{data}:3: not UTF-8 text (byte(s) e9 at column" in err and err.count("error:") == 1

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "t.yaml").write_bytes(b"name: t\nkind: multiple_choice\ndescription: caf\xe9\nlocal: x.jsonl\n")
    code, _, err = _cli(["--tasks", "t", "--include_path", str(mine), *out], capsys)
    assert code == 2 and f"task file {mine / 't.yaml'}:3: not UTF-8 text" in err
    code, _, err = _cli(["--list-tasks", "--include_path", str(mine)], capsys)
    assert code == 2 and f"{mine / 't.yaml'}:3: not UTF-8" in err

    for loader, rec in (("yes_no", {"qid": "a", "question": "Is it?", "answer": True}),
                        ("open", {"id": "a", "question": "Who?", "answers": ["me"]})):
        f = tmp_path / f"{loader}.jsonl"
        f.write_bytes(json.dumps(rec).encode() + b"\n" + json.dumps(rec).encode()[:-2] + b"\xff\"}\n")
        pipe = ["--pipelines", "cot"] if loader == "open" else []
        code, _, err = _cli(["--tasks", str(f), *out, *pipe], capsys)
        assert code == 2 and f"{f}:2: not UTF-8 text (byte(s) ff" in err


def test_cli_prints_a_count_mismatch_as_one_warning_line(tmp_path, capsys):
    short = _authors_file(tmp_path / "numersense-dev.jsonl", 199, 12, kind="numersense")
    code, _, err = _cli(["--tasks", f"numersense={short}", "--pipelines", "vanilla", "--model",
                         str(tmp_path / "no-model"), "--output-path", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 2 and "model: cannot load" in err
    warned = [ln for ln in err.splitlines() if ln.startswith("rcn_fast.eval: warning: ")]
    assert len(warned) == 1 and "has 199 questions, the paper's set has 200" in warned[0]
    assert "TaskCountWarning" not in err


def test_cli_names_the_hub_source_it_cannot_reach(tmp_path, monkeypatch, capsys):
    def unreachable(path, *args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    code, _, err = _cli(["--tasks", "piqa", "--pipelines", "vanilla", "--model", str(tmp_path / "m"),
                         "--output-path", str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 2 and "task 'piqa': cannot load hf:ybisk/piqa@refs/convert/parquet: ConnectionError" in err


def test_relative_local_is_relative_to_the_yaml_that_writes_it(tmp_path, monkeypatch):
    """Issue 37: a task YAML's relative ``local:`` is read from the YAML's own folder, an
    ``include:``d file's from that file's folder (not the including file's, not the package,
    not the working directory); issue 53: and never from outside that folder."""
    from rcn_fast.eval import load_task_questions

    common = tmp_path / "common"
    common.mkdir()
    (common / "qs.jsonl").write_text(json.dumps({"id": "a", "question": {"stem": "Why?", "choices": [
        {"label": "A", "text": "x"}, {"label": "B", "text": "y"}]}, "answerKey": "A"}) + "\n", encoding="utf-8")
    (common / "base.yaml").write_text("kind: multiple_choice\nlocal: qs.jsonl\n", encoding="utf-8")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "t.yaml").write_text("name: t\ninclude: ../common/base.yaml\n", encoding="utf-8")
    other = tmp_path / "other"
    other.mkdir()
    (other / "u.yaml").write_text("name: u\nlocal: ../common/qs.jsonl\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path / "common")  # the working directory plays no part
    spec = resolve_task("t", include_paths=[str(mine)])
    assert spec.local == str((common / "qs.jsonl").resolve())
    assert [q.id for q in load_task_questions(spec)] == ["a"]
    # issue 53: a task file's data lies in its own folder: a local: climbing out of it is refused, naming it
    with pytest.raises(TaskError, match=r"u.yaml: local: '../common/qs.jsonl' climbs out of the task file's folder"):
        resolve_task("u", include_paths=[str(other)])
