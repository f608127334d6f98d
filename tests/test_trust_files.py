"""Issue 44, files: what rcn_fast reads from a folder the user names (a
store, a model folder, a task folder) is opened by its real path only when
that path is inside the folder, and nothing is written under
``--output-path`` (or a store being built) through a symbolic link planted
there (rcn_fast._files). On 7491bb5 a store whose ``texts.bin`` linked to a
file outside it (manifest size and offsets set to match) served that file
as passage ``p0``, and links planted as ``llm_cache.sqlite`` and
``checkpoints/`` made the eval write outside its output folder. Tiny
random-weight models built in code."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

#: the door's LinkError is an OSError (and a ValueError): the reproductions below match on it alone, so that
#: they fail for the right reason on code without the door
LinkError = OSError

SECRET = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key, but outside the store\n"


# ------------------------------------------------------------------ the door itself
def test_reads_follow_links_only_inside_the_folder(tmp_path):
    from rcn_fast._files import Folder, check_links, read_text
    root, out = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    out.mkdir()
    (root / "real.txt").write_text("in")
    (out / "secret").write_text(SECRET)
    (root / "ok").symlink_to(root / "real.txt")
    (root / "sub" / "up").symlink_to("../real.txt")
    (root / "evil").symlink_to(out / "secret")
    (root / "evildir").symlink_to(out)
    assert read_text(root, "ok") == "in" == read_text(root, "sub/up")
    with pytest.raises(LinkError, match=r"names a file outside .*climbs above"):  # issue 53: never above the root
        read_text(root, "../outside/secret")
    for name in ("evil", "evildir/secret"):
        with pytest.raises(LinkError, match=rf"what: {root / name} leads out of {root} \(a symbolic link to "):
            read_text(root, name, what="what")
    with pytest.raises(LinkError, match="evil"):
        check_links(root)
    with pytest.raises(LinkError):  # its one link stays inside root, but leads out of sub
        check_links(root / "sub", root=root / "sub")
    check_links(root / "sub", root=root)
    assert Folder(root).full("sub/up") == root / "sub" / "up"


def test_writes_refuse_a_link_planted_at_the_file_or_a_folder_on_the_way(tmp_path, monkeypatch):
    from rcn_fast._files import Folder, make_dirs, open_write, refuse_links
    root, out = tmp_path / "out", tmp_path / "elsewhere"
    root.mkdir()
    out.mkdir()
    (root / "dir").symlink_to(out)
    (root / "file").symlink_to(out / "x")
    for path in ("dir/a.json", "dir", "file"):
        with pytest.raises(LinkError, match=rf"what: {root / path.split('/')[0]} is a symbolic link \(to {out}"):
            refuse_links(root, path, what="what")
    with pytest.raises(LinkError, match="is a symbolic link"):
        open_write(root, "file", "ab")
    with pytest.raises(LinkError, match="is a symbolic link"):
        make_dirs(root, "dir/sub")
    with pytest.raises(LinkError, match="is a symbolic link"):  # no check to step around: the open itself refuses
        open_write(root, "file", "w")
    with pytest.raises(LinkError, match="dir is a symbolic link"):
        open_write(root, "dir/new.json", "w")
    assert list(out.iterdir()) == []
    with open_write(root, "new.txt", "w") as f:
        f.write("ok")
    with open_write(root, "new.txt", "a+") as f:
        f.write("!")
        f.seek(0)
        assert f.read() == "ok!"
    assert (root / "new.txt").read_text() == "ok!"
    with pytest.raises(ValueError, match="mode"):
        open_write(root, "new.txt", "r")
    monkeypatch.chdir(tmp_path)  # a root written relative to the working folder, a path written from it or a name
    rel = Path("out")
    assert Folder(rel).full(rel / "new.txt") == Folder(rel).full("new.txt") == root / "new.txt"
    with open_write(rel, rel / "sub.txt", "w") as f:
        f.write("x")
    assert (root / "sub.txt").read_text() == "x" and not (root / "out").exists()
    with pytest.raises(LinkError, match="dir is a symbolic link"):
        make_dirs(rel, rel / "dir" / "x")


# ------------------------------------------------------------------ stores
@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from rcn_fast.retrieval import BuildConfig, Encoder, build_corpus
    from tests.retrieval.fixtures import write_jsonl
    from tests.retrieval.tiny import make_tiny_bert, real_sentences

    enc = Encoder.from_pretrained(make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert"))
    recs = [{"id": f"p{i}", "text": t} for i, t in enumerate(real_sentences(20))]
    src = write_jsonl(tmp_path_factory.mktemp("in") / "c.jsonl", recs)
    out = tmp_path_factory.mktemp("store") / "s"
    build_corpus(BuildConfig(input=str(src), out=str(out), chunk_size=8), enc, show_progress=False)
    return out


def test_a_store_whose_texts_link_out_of_it_is_refused_naming_the_link(store_dir, tmp_path, monkeypatch):
    from rcn_fast.retrieval import CorpusStore

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    s = Path(shutil.copytree(store_dir, tmp_path / "s"))
    secret = tmp_path / "id_rsa"
    secret.write_text(SECRET)
    (s / "texts.bin").unlink()
    (s / "texts.bin").symlink_to(secret)
    size = secret.stat().st_size
    off = np.load(s / "text_offsets.npy")
    off[1:] = size  # passage p0 is the whole file, the others empty: offsets consistent with the linked file
    np.save(s / "text_offsets.npy", off)
    man = json.loads((s / "manifest.json").read_text())
    man["files"]["texts.bin"]["bytes"] = size
    (s / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(LinkError, match=rf"path: {s / 'texts.bin'} leads out of {s} \(a symbolic link to {secret}\)"):
        CorpusStore.open(s)
    # a link that stays inside the store is followed
    (s / "texts.bin").unlink()
    shutil.copy(store_dir / "texts.bin", s / "texts.real")
    (s / "texts.bin").symlink_to("texts.real")
    shutil.copy(store_dir / "text_offsets.npy", s / "text_offsets.npy")
    shutil.copy(store_dir / "manifest.json", s / "manifest.json")
    assert CorpusStore.open(s, verify=True).text(0) == CorpusStore.open(store_dir).text(0)


def test_a_store_manifest_linked_out_of_the_store_is_refused(store_dir, tmp_path, monkeypatch):
    from rcn_fast.retrieval import CorpusStore

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    s = Path(shutil.copytree(store_dir, tmp_path / "s"))
    shutil.move(s / "manifest.json", tmp_path / "m.json")
    (s / "manifest.json").symlink_to(tmp_path / "m.json")
    with pytest.raises(LinkError, match="manifest.json leads out of"):
        CorpusStore.open(s)


# ------------------------------------------------------------------ model and task folders
def test_a_model_folder_whose_file_links_out_of_it_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from rcn_fast.model_files import refuse_remote_code, resolve_model_path
    from rcn_fast.testing.tiny_llm import make_tiny_llama

    d = make_tiny_llama(tmp_path / "m")
    assert resolve_model_path(str(d)) == d.resolve()
    outside = tmp_path / "tok.json"
    shutil.move(d / "tokenizer.json", outside)
    (d / "tokenizer.json").symlink_to(outside)
    with pytest.raises(LinkError, match=rf"model: {d / 'tokenizer.json'} leads out of {d}"):
        resolve_model_path(str(d))
    # a Hugging Face cache snapshot: links into the repository's blobs/ are its own
    repo = tmp_path / "models--o--n"
    snap, blobs = repo / "snapshots" / "abc", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in d.iterdir():
        if f.is_file() and not f.is_symlink():
            shutil.copy(f, blobs / f.name)
            (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    refuse_remote_code(snap)
    (snap / "evil.json").symlink_to(outside)
    with pytest.raises(LinkError, match="evil.json leads out of"):
        refuse_remote_code(snap)


def test_a_task_files_question_file_linked_out_of_its_folder_is_refused(tmp_path):
    from rcn_fast.eval.tasks.catalog import resolve_task

    inc, other = tmp_path / "tasks", tmp_path / "other"
    inc.mkdir()
    other.mkdir()
    (other / "q.jsonl").write_text('{"id": "1", "question": "Q?", "choices": ["a", "b"], "answer": 0}\n')
    (inc / "q.jsonl").symlink_to(other / "q.jsonl")
    (inc / "t.yaml").write_text("name: linked\nlocal: q.jsonl\n")
    with pytest.raises(LinkError, match=rf"task file {inc / 't.yaml'}: local: {inc / 'q.jsonl'} leads out of"):
        resolve_task("linked", include_paths=[str(inc)])
    (inc / "t.yaml").write_text("name: linked\nlocal: ../other/q.jsonl\n")  # issue 53: its data lies in its folder
    with pytest.raises(ValueError, match=r"local: '../other/q.jsonl' climbs out of the task file's folder"):
        resolve_task("linked", include_paths=[str(inc)])


# ------------------------------------------------------------------ the eval's output folder
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from rcn_fast.testing.tiny_llm import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("llm") / "m")


@pytest.mark.parametrize("planted", ["llm_cache.sqlite", "checkpoints", "checkpoints/q"])
def test_links_planted_in_the_output_folder_are_refused_and_nothing_is_written_through_them(
        tmp_path, tiny_dir, capsys, planted):
    from rcn_fast.eval.cli import main
    from tests.test_eval import write_questions

    q = write_questions(tmp_path / "q.jsonl", n=2)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / planted).parent.mkdir(parents=True, exist_ok=True)
    target = elsewhere / "x.sqlite" if planted.endswith(".sqlite") else elsewhere
    (out / planted).symlink_to(target)
    rc = main(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(tiny_dir), "--output-path", str(out),
               "--no-progress", "--no-plot", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err[-2000:]
    assert f"{out / planted} is a symbolic link (to {target}) planted in" in err and "remove it" in err
    assert list(elsewhere.iterdir()) == []
    os.unlink(out / planted)
    assert main(["--tasks", str(q), "--pipelines", "vanilla", "--model", str(tiny_dir), "--output-path", str(out),
                 "--no-progress", "--no-plot", "--device", "cpu"]) == 0  # the link removed: the run goes on


def test_a_checkpoint_file_that_is_a_link_is_refused(tmp_path):
    from rcn_fast.eval.run.checkpoint import Checkpoint

    (tmp_path / "ck").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me: a line cut short")
    (tmp_path / "ck" / "a.jsonl").symlink_to(victim)
    with pytest.raises(LinkError, match="a.jsonl is a symbolic link"):
        Checkpoint(tmp_path / "ck" / "a.jsonl", {}, root=tmp_path)
    assert victim.read_text() == "keep me: a line cut short"  # the read-repair truncated it on 7491bb5
