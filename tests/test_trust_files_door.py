"""Issue 53 item 2: the files door by handle (rcn_fast/_files.py over
rcn_fast/_beneath.py), on its class of inputs: every link layout resolves
the same through ``openat2`` and through the portable walk (links inside
followed, none out, ``..`` never above the root, loops bounded), writes
follow no link, walks never follow one and refuse past their limit, and
arrays are mapped from the descriptor (no pickles, no truncated file)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

import rcn_fast._beneath as B
import rcn_fast._file_data as D
import rcn_fast._files as F

OUT = b"outside the root"


@pytest.fixture
def tree(tmp_path):
    """A root holding files, folders and links of every kind, and a file outside it."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "sub" / "deep").mkdir(parents=True)
    out.mkdir()
    (out / "secret").write_bytes(OUT)
    (root / "a.txt").write_bytes(b"a")
    (root / "sub" / "deep" / "b.txt").write_bytes(b"b")
    links = {
        "rel": "a.txt", "up": "../a.txt", "abs_in": str(root / "a.txt"), "dirlink": "sub",
        "chain": "rel", "self": ".", "loop1": "loop2", "loop2": "loop1", "abs_out": str(out / "secret"),
        "rel_out": "../out/secret", "dir_out": str(out), "dangling": "nope",
    }
    for name, target in links.items():
        (root / ("sub/" + name if name == "up" else name)).symlink_to(target)
    (root / "sub" / "esc").symlink_to("../../out/secret")
    return root, out


CASES = [  # (path under the root, what a read gives: bytes, or the error)
    ("a.txt", b"a"), ("sub/deep/b.txt", b"b"), ("rel", b"a"), ("sub/up", b"a"), ("abs_in", b"a"),
    ("chain", b"a"), ("self/self/a.txt", b"a"), ("dirlink/deep/b.txt", b"b"), ("sub/../a.txt", b"a"),
    ("sub/deep/../../a.txt", b"a"), ("abs_out", "leads out of"), ("rel_out", "leads out of"),
    ("dir_out/secret", "leads out of"), ("sub/esc", "leads out of"), ("../out/secret", "climbs above"),
    ("sub/../../out/secret", "climbs above"), ("loop1", "too many symbolic links"), ("dangling", FileNotFoundError),
    ("nope", FileNotFoundError), ("sub", IsADirectoryError), ("a.txt/x", NotADirectoryError),
]


@pytest.mark.parametrize("mechanism", ["openat2", "walk"])
@pytest.mark.parametrize("path, want", CASES)
def test_reads_resolve_every_link_layout_the_same_way_in_both_mechanisms(tree, monkeypatch, mechanism, path, want):
    root, _ = tree
    if mechanism == "walk":
        monkeypatch.setenv("RCN_FAST_NO_OPENAT2", "1")
    elif not B.openat2_available():
        pytest.skip("no openat2 here")
    if isinstance(want, bytes):
        assert F.read_bytes(root, path) == want
    elif isinstance(want, str):
        with pytest.raises(F.LinkError, match=want) as err:
            F.read_bytes(root, path, what="what")
        assert str(err.value).startswith("what: ") and OUT.decode() not in str(err.value)
    else:
        with pytest.raises(want):
            F.read_bytes(root, path)


@pytest.mark.parametrize("mechanism", ["openat2", "walk"])
def test_writes_follow_no_link_at_all(tree, monkeypatch, mechanism):
    root, out = tree
    if mechanism == "walk":
        monkeypatch.setenv("RCN_FAST_NO_OPENAT2", "1")
    for path in ("rel", "abs_in", "dirlink/x", "self/x", "abs_out", "dir_out/x", "sub/up", "dangling"):
        with pytest.raises(F.LinkError, match="is a symbolic link .* planted in"):
            F.write_text(root, path, "x")
        with pytest.raises(F.LinkError):
            F.make_dirs(root, path + "/d")
    with pytest.raises(F.LinkError, match="climbs above"):
        F.write_text(root, "../out/new", "x")
    F.write_atomic(root, "sub/n.txt", "n")
    F.make_dirs(root, "made/a/b")
    F.write_atomic(root, "made/a/b/c.json", b"{}")
    F.replace(root, "made/a/b/c.json", "made/c.json")
    assert (root / "made" / "c.json").read_bytes() == b"{}" and (root / "sub" / "n.txt").read_text() == "n"
    assert sorted(p.name for p in out.iterdir()) == ["secret"] and (out / "secret").read_bytes() == OUT
    with pytest.raises(ValueError, match="mode"):
        F.open_write(root, "x", "rb")


def test_a_fifo_or_device_is_not_a_file_and_never_blocks(tree):
    root, _ = tree
    os.mkfifo(root / "fifo")
    with pytest.raises(OSError) as err:
        F.read_bytes(root, "fifo")
    assert err.value.errno == errno.EINVAL
    with pytest.raises(OSError):
        F.write_text(root, "fifo", "x")  # O_NONBLOCK: no reader, refused at once (never blocks)


def test_walks_never_follow_links_and_refuse_past_their_limits(tree):
    root, _ = tree
    f = F.Folder(root)
    entries = {e.rel: e for e in f.walk()}
    assert entries["self"].kind == "link" and entries["self"].target == "." and "self/a.txt" not in entries
    assert entries["sub/deep/b.txt"].kind == "file" and entries["sub"].kind == "dir"
    assert [e.rel for e in f.walk("sub/deep")] == ["sub/deep/b.txt"]
    with pytest.raises(F.WalkLimitError, match="more than 5 entries"):
        list(f.walk(limit=5))
    with pytest.raises(F.WalkLimitError, match="nests folders more than"):
        list(f.walk(depth=1))
    with pytest.raises(F.WalkLimitError):
        f.listdir(limit=3)
    assert "a.txt" in f.listdir() and all(not e.rel.startswith(".") for e in f.walk(hidden=False))


def test_glob_matches_inside_the_folder_only(tree):
    root, _ = tree
    (root / "sub" / "deep" / "c.jsonl").write_text("{}")
    (root / "sub" / ".hidden.jsonl").write_text("{}")
    assert F.glob(root, "**/*.jsonl") == ["sub/deep/c.jsonl"]
    assert F.glob(root, "sub/.*.jsonl") == ["sub/.hidden.jsonl"]
    assert F.glob(root, "*.txt") == ["a.txt"] and F.glob(root, "missing/*.txt") == []
    assert "rel" in F.glob(root, "re?")  # a link is matched (and resolved beneath the root when opened)
    for bad in ("../*", "/etc/*", "sub/../../*"):
        with pytest.raises(F.LinkError, match="not a relative path inside"):
            F.glob(root, bad)
    with pytest.raises(F.WalkLimitError):
        F.glob(root, "**/*", limit=4)


def test_check_links_names_the_link_and_follows_none(tree):
    root, _ = tree
    with pytest.raises(F.LinkError, match="leads out of") as err:
        F.check_links(root)
    assert OUT.decode() not in str(err.value)
    F.check_links(root / "sub" / "deep", root=root)
    with pytest.raises(F.LinkError, match="sub/esc leads out of"):
        F.check_links(root / "sub", root=root)


def test_refuse_links_and_folders(tree):
    root, _ = tree
    F.refuse_links(root, "sub/deep/b.txt")
    F.refuse_links(root, "no/such/file")
    F.refuse_links(root, "")
    with pytest.raises(F.LinkError, match="dirlink is a symbolic link"):
        F.refuse_links(root, "dirlink/deep/b.txt")
    sub = F.Folder(root).sub("sub/deep")
    assert sub.read_bytes("b.txt") == b"b" and sub.path == root / "sub" / "deep"
    with pytest.raises(F.LinkError):
        F.Folder(root).sub("dirlink", create=True)
    F.Folder(root).sub("new/one", create=True).close()
    assert (root / "new" / "one").is_dir()
    assert F.Folder(root).is_file("rel") and not F.Folder(root).is_file("sub") and F.Folder(root).is_dir("dirlink")
    assert not F.Folder(root).exists("dangling")
    assert F.stat(root, "abs_out", links=False).st_size == len(str(root.parent / "out" / "secret"))


def test_npy_is_mapped_from_the_descriptor_never_unpickled(tmp_path):
    for arr in (np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.ones((2, 3))),
                np.zeros((0, 5), dtype=np.int64), np.arange(5, dtype=np.uint8)):
        np.save(tmp_path / "a.npy", arr)
        for mmap in (True, False):
            got = D.load_npy(tmp_path, "a.npy", mmap=mmap)
            np.testing.assert_array_equal(got, arr)
            assert got.dtype == arr.dtype and (not mmap or got.size == 0 or not got.flags.writeable)
    np.save(tmp_path / "o.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="a pickle"):
        D.load_npy(tmp_path, "o.npy")
    np.save(tmp_path / "t.npy", np.arange(100))
    (tmp_path / "t.npy").write_bytes((tmp_path / "t.npy").read_bytes()[:-8])
    with pytest.raises(ValueError, match="truncated"):
        D.load_npy(tmp_path, "t.npy")
    (tmp_path / "h.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': SECRET_HEADER_TEXT}" + b" " * 100)
    with pytest.raises(ValueError, match="cannot be read") as err:
        D.load_npy(tmp_path, "h.npy")
    assert "SECRET_HEADER_TEXT" not in str(err.value)
    arr, m = D.create_npy(tmp_path, "c.npy", (3, 2), "float16")
    arr[:] = 7
    m.flush()
    del arr, m
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), np.full((3, 2), 7, dtype=np.float16))
    D.save_npy(tmp_path, "s.npy", np.arange(4))
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), np.arange(4))


def test_a_mapped_file_is_the_file_opened_whatever_its_name_points_at_later(tmp_path):
    (tmp_path / "f").write_bytes(b"first")
    fd = F.open_fd(tmp_path, "f")
    try:
        m = D.map_fd(fd)
        os.replace(tmp_path / "f", tmp_path / "g")
        (tmp_path / "f").write_bytes(b"other")
        assert bytes(m) == b"first" and D.read_fd(fd) == b"first"
    finally:
        os.close(fd)


def test_a_reader_given_a_file_opens_it_beneath_a_confined_folder(tmp_path):
    root = tmp_path / "task"
    root.mkdir()
    (tmp_path / "secret").write_text("x")
    (root / "q.jsonl").symlink_to(tmp_path / "secret")
    (tmp_path / "mine.jsonl").symlink_to(tmp_path / "secret")
    with D.confined(root):
        with pytest.raises(F.LinkError, match="q.jsonl leads out of"):
            D.open_named(root / "q.jsonl")
        assert D.open_named(tmp_path / "mine.jsonl").read() == b"x"  # outside the folder: as named (the user's)
    assert D.open_named(root / "q.jsonl").read() == b"x"  # no confinement: a file the user names
    with D.confined(None):
        assert D.open_named(root / "q.jsonl").read() == b"x"


def test_paths_are_taken_relative_to_where_the_root_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    f = F.Folder("out")
    assert f.rel("out/x/y") == "x/y" == f.rel(tmp_path / "out" / "x" / "y") and f.rel("x") == "x"
    with pytest.raises(F.LinkError, match="is not inside"):
        f.rel(tmp_path / "elsewhere")
    assert f.full("x") == tmp_path / "out" / "x" and f.anchors[0] == str(tmp_path / "out")


def test_openat2_is_probed_once_and_the_walk_is_its_fallback(monkeypatch, tmp_path):
    (tmp_path / "a").write_text("a")
    monkeypatch.setattr(B, "_openat2_ok", None)
    monkeypatch.setattr(B.platform, "machine", lambda: "alpha")  # a machine whose openat2 number differs
    assert not B.openat2_available() and F.read_text(tmp_path, "a") == "a"
    monkeypatch.setattr(B, "_openat2_ok", False)
    assert F.read_text(tmp_path, "a") == "a"
    assert Path(B.__file__).name == "_beneath.py" and B.SUPPORTED
