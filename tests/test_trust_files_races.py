"""Issue 53 item 5, files: a race test per file entry point of the door
(rcn_fast/_files.py). A thread swaps a name between a regular file (or
folder) and a symbolic link leading out of the root -- ``os.replace`` of a
link over the file and back, in a loop -- while 1,000 opens (or writes) go
through the entry point; none may escape: no byte of the outside file is
read, nothing is written outside the root.

The tests run as root here, so "a file only root may read" (the issue's
``id_ed25519`` stand-in) and "a folder the attacker cannot write" are
emulated by a file and a folder *outside the root folder*: what the door
promises is that nothing outside the folder it was given is reached,
whoever owns it. Each test runs with ``openat2`` (where the kernel has it)
and with the portable walk (``RCN_FAST_NO_OPENAT2=1``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

N = 1000
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- outside the root -----"
FILLER = b"F" * len(SECRET)


@pytest.fixture(params=["openat2", "walk"])
def mechanism(request, monkeypatch):
    from rcn_fast import _beneath

    if request.param == "walk":
        monkeypatch.setenv("RCN_FAST_NO_OPENAT2", "1")
    elif not _beneath.openat2_available():
        pytest.skip("this kernel (or its seccomp filter) has no openat2")
    return request.param


class Swapper:
    """A thread that swaps ``name`` between a regular file (``data``) -- or
    a folder, kept aside while the link stands in its place -- and a
    symbolic link to ``target`` (an ``os.replace`` each way), until stopped."""

    def __init__(self, name: Path, target: Path, data: bytes | None = None) -> None:
        self.name, self.target, self.data = name, target, data
        self.swaps = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        link, aside = self.name.with_name(".swap-link"), self.name.with_name(".swap-aside")
        while not self._stop.is_set():
            os.symlink(self.target, link)
            if self.data is not None:
                os.replace(link, self.name)  # the link renamed over the file
                time.sleep(0)  # (lets the other thread run in each state)
                aside.write_bytes(self.data)
                os.replace(aside, self.name)  # and a file renamed back over the link
            else:
                os.replace(self.name, aside)  # the folder aside, the link in its place
                self._place(link)
                time.sleep(0)
                os.unlink(self.name)
                self._place(aside)  # the folder back
            self.swaps += 1
            time.sleep(0)

    def _place(self, src: Path) -> None:
        """``os.replace(src, name)``; a folder the code under test made at ``name`` meanwhile is removed."""
        while True:
            try:
                os.replace(src, self.name)
                return
            except OSError:
                shutil.rmtree(self.name, ignore_errors=True)

    def __enter__(self) -> "Swapper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _outside(tmp_path: Path) -> tuple[Path, Path]:
    root, out = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    out.mkdir()
    (out / "secret").write_bytes(SECRET)
    (out / "texts.bin").write_bytes(SECRET)
    return root, out


def _reads(read: Callable[[], bytes]) -> tuple[int, int]:
    """(reads that returned the filler, reads refused) of N; an escape fails the test."""
    from rcn_fast._files import LinkError

    ok = refused = 0
    for _ in range(N):
        try:
            got = read()
        except (LinkError, FileNotFoundError, NotADirectoryError):
            refused += 1
            continue
        assert SECRET not in got, "read the outside file"
        ok += 1
    return ok, refused


# ------------------------------------------------------------------ reads
@pytest.mark.parametrize("entry", ["read_bytes", "open_read", "open_fd+mmap", "load_npy", "read_stamped_json",
                                   "open_named", "read_trusted", "Folder.read_text"])
def test_a_read_never_reaches_the_file_a_swapped_link_leads_to(tmp_path, mechanism, entry):
    import rcn_fast._file_data as D
    import rcn_fast._files as F
    from rcn_fast._cache_dirs import read_trusted
    from rcn_fast._stamped_json import read_stamped_json

    root, out = _outside(tmp_path)
    filler = FILLER
    if entry == "load_npy":
        filler = _npy(np.zeros(len(SECRET), dtype=np.uint8))
        (out / "secret").write_bytes(_npy(np.frombuffer(SECRET, dtype=np.uint8)))
    elif entry == "read_stamped_json":
        filler = json.dumps({"format": "x/1", "v": FILLER.decode()}).encode()
        (out / "secret").write_bytes(json.dumps({"format": "x/1", "v": SECRET.decode()}).encode())
    (root / "f").write_bytes(filler)
    folder = F.Folder(root)
    read: Callable[[], bytes] = {
        "read_bytes": lambda: F.read_bytes(root, "f"),
        "open_read": lambda: folder.open_read("f").read(),
        "open_fd+mmap": lambda: _mapped(folder, "f"),
        "load_npy": lambda: D.load_npy(folder, "f").tobytes(),  # mapped from the descriptor
        "read_stamped_json": lambda: json.dumps(read_stamped_json(root / "f", "x/1", what="x", root=folder)).encode(),
        "open_named": lambda: _named(root),
        "read_trusted": lambda: read_trusted(folder, "f") or b"",
        "Folder.read_text": lambda: folder.read_text("f").encode(),
    }[entry]
    with Swapper(root / "f", out / "secret", filler) as sw:
        ok, refused = _reads(read)
    assert ok + refused == N and sw.swaps > 0


def _mapped(folder, name: str) -> bytes:
    from rcn_fast._file_data import map_fd

    fd = folder.open_fd(name)
    try:
        m = map_fd(fd)
        return bytes(m) if m is not None else b""
    finally:
        os.close(fd)


def _named(root: Path) -> bytes:
    from rcn_fast._file_data import confined
    from rcn_fast.data.loaders import read_text

    with confined(root):  # a task file's question file: beneath its folder
        return read_text(root / "f").encode()


def test_a_read_through_a_folder_swapped_for_a_link_never_leaves_the_root(tmp_path, mechanism):
    """An intermediate component (``sub/``) swapped between a folder and a link to an outside folder."""
    from rcn_fast._files import Folder

    root, out = _outside(tmp_path)
    (root / "sub").mkdir()
    (root / "sub" / "texts.bin").write_bytes(FILLER)
    folder = Folder(root)
    with Swapper(root / "sub", out) as sw:
        ok, refused = _reads(lambda: folder.read_bytes("sub/texts.bin"))
    assert ok + refused == N and sw.swaps > 0


def test_a_fingerprint_never_hashes_the_file_a_swapped_link_leads_to(tmp_path, mechanism, monkeypatch):
    import rcn_fast._hashing as h

    root, out = _outside(tmp_path)
    (root / "f.jsonl").write_bytes(FILLER)
    read: list[bytes] = []
    real = h.sha256_fd
    monkeypatch.setattr(h, "sha256_fd", lambda fd: read.append(os.pread(fd, 1 << 16, 0)) or real(fd))
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    with Swapper(root / "f.jsonl", out / "secret", FILLER) as sw:
        for _ in range(N // 4):
            try:
                h.content_fingerprint(root)
            except (OSError, ValueError):
                pass  # the file vanished between the walk and its open: refused, not followed
    assert read and not any(SECRET in r for r in read) and sw.swaps > 0


# ------------------------------------------------------------------ writes
@pytest.mark.parametrize("entry", ["open_write", "write_atomic", "write_text", "save_npy", "append"])
def test_a_write_never_lands_where_a_swapped_link_leads(tmp_path, mechanism, entry):
    import rcn_fast._file_data as D
    import rcn_fast._files as F

    root, out = _outside(tmp_path)
    (root / "f").write_bytes(FILLER)
    folder = F.Folder(root)
    write: Callable[[int], None] = {
        "open_write": lambda i: _write(folder.open_write("f", "wb"), b"w%d" % i),
        "append": lambda i: _write(F.open_write(root, "f", "ab"), b"a%d" % i),
        "write_atomic": lambda i: F.write_atomic(folder, "f", b"r%d" % i),
        "write_text": lambda i: F.write_text(root, "f", "t%d" % i),
        "save_npy": lambda i: D.save_npy(folder, "f", np.arange(i % 7)),
    }[entry]
    with Swapper(root / "f", out / "secret", FILLER) as sw:
        refused = _writes(write)
    assert (out / "secret").read_bytes() == SECRET and sorted(p.name for p in out.iterdir()) == ["secret",
                                                                                                 "texts.bin"]
    assert refused < N and sw.swaps > 0


def _write(f, data: bytes) -> None:
    with f:
        f.write(data)


def _writes(write: Callable[[int], None]) -> int:
    from rcn_fast._files import LinkError

    refused = 0
    for i in range(N):
        try:
            write(i)
        except (LinkError, FileNotFoundError, NotADirectoryError):
            refused += 1
    return refused


@pytest.mark.parametrize("entry", ["open_write", "make_dirs", "write_atomic", "replace"])
def test_a_write_through_a_folder_swapped_for_a_link_lands_in_the_root_or_nowhere(tmp_path, mechanism, entry):
    """N3's second half: ``open_write`` checked each component, then opened by name (3 of 200 writes
    landed in a folder the attacker cannot write); now every component is opened from a descriptor."""
    import rcn_fast._files as F

    root, out = _outside(tmp_path)
    (root / "sub").mkdir()
    folder = F.Folder(root)
    write: Callable[[int], None] = {
        "open_write": lambda i: _write(F.open_write(root, f"sub/w{i}", "wb"), b"x"),
        "make_dirs": lambda i: F.make_dirs(folder, f"sub/d{i}/e"),
        "write_atomic": lambda i: F.write_atomic(folder, f"sub/a{i}", b"x"),
        "replace": lambda i: _replace(folder, i),
    }[entry]
    with Swapper(root / "sub", out) as sw:
        refused = _writes(write)
    assert sorted(p.name for p in out.iterdir()) == ["secret", "texts.bin"], "wrote outside the root"
    assert refused < N and sw.swaps > 0


def _replace(folder, i: int) -> None:
    folder.write_atomic(f"t{i}", b"x")
    folder.replace(f"t{i}", f"sub/r{i}")


def test_checkpoint_appends_never_land_outside_the_output_folder(tmp_path, mechanism):
    """The eval's hot write path: appends to ``checkpoints/<task>/...`` while ``checkpoints`` is swapped
    for a link to an outside folder."""
    from rcn_fast._files import LinkError
    from rcn_fast.eval.run.checkpoint import Checkpoint

    out_root, out = _outside(tmp_path)
    (out_root / "checkpoints" / "t").mkdir(parents=True)
    ck = Checkpoint(out_root / "checkpoints" / "t" / "seed0.jsonl", {}, root=out_root)
    refused = 0
    with Swapper(out_root / "checkpoints", out) as sw:
        for i in range(N):
            try:
                ck.append([{"id": f"q{i}"}])
            except (LinkError, FileNotFoundError, NotADirectoryError):
                refused += 1
    assert sorted(p.name for p in out.iterdir()) == ["secret", "texts.bin"] and refused < N and sw.swaps > 0
