"""Issue 44, caches: a cache or memo is trusted only when it and the
folders above it (up to its cache's root) are owned by the current user
(or root) and writable by nobody else (rcn_fast._cache_dirs.trusted_cache,
ssh's StrictModes); otherwise it is neither read nor written, one warning
names the folder, and the work is recomputed. On 7491bb5, with a cache
folder writable by another user, a content-hash memo holding a file's
current stats and its old hash was accepted (the eval reused answers to
questions whose text had changed), and a GGUF tokenizer cache rewritten
with a recomputed manifest was accepted (``encode(" Paris")`` gave another
id). The tests run as root here: another owner is made for real with
``chown`` (as root) or by a different ``os.geteuid`` (otherwise); the
group/other-writable cases use ``chmod`` for real."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

import rcn_fast._cache_dirs as C
from rcn_fast._hashing import check_once, content_fingerprint, sha256_file

OTHER_UID = 4242


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    import rcn_fast._hashing as h

    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(C, "_WARNED", set(), raising=False)
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    monkeypatch.setattr(h, "_PASSED", set())
    monkeypatch.setattr(h, "RACY_SECONDS", 0.0)


def foreign(path: Path, monkeypatch) -> None:
    """Make ``path`` another user's: chown it (as root), else make this process another user."""
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, -1)
    else:
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 1)


def _warned(got, folder: Path, why: str) -> None:
    msgs = [str(w.message) for w in got if w.category.__name__ == "UntrustedCacheWarning"]
    assert len(msgs) == 1 and f" {folder} " in msgs[0], msgs
    assert why in msgs[0] and "ignored and its work recomputed" in msgs[0]


# ------------------------------------------------------------------ the door
def test_the_door_judges_owner_and_modes_of_the_entry_and_the_folders_above_it(tmp_path, monkeypatch):
    from rcn_fast._cache_dirs import UntrustedCacheWarning, trusted_cache
    root = tmp_path / "cache"
    entry = root / "sub" / "e.json"
    entry.parent.mkdir(parents=True)
    entry.write_text("{}")
    os.chmod(root, 0o755)
    os.chmod(entry.parent, 0o755)
    os.chmod(entry, 0o644)
    assert trusted_cache(entry) and trusted_cache(root / "sub" / "not-yet")
    os.chmod(entry.parent, 0o757)
    with pytest.warns(UntrustedCacheWarning, match=rf"cache: {entry.parent} is writable by others \(mode 757\)"):
        assert not trusted_cache(entry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not trusted_cache(entry) and not trusted_cache(root / "sub" / "other")  # one warning per folder
    os.chmod(entry.parent, 0o755)
    if os.geteuid() == 0:  # a group that is not the user's own private group
        os.chown(entry, -1, OTHER_UID)
        os.chmod(entry, 0o664)
        with pytest.warns(UntrustedCacheWarning, match=rf"{entry} is writable by group \(mode 664\)"):
            assert not trusted_cache(entry)
        os.chown(entry, -1, 0)
        os.chmod(entry, 0o644)
    monkeypatch.setattr(C, "_WARNED", set())  # (the entry was warned about above: once per process)
    foreign(entry, monkeypatch)
    with pytest.warns(UntrustedCacheWarning, match="is owned by another user"):
        assert not trusted_cache(entry)
    link = root / "sub" / "link.json"  # a link is judged by its target
    monkeypatch.undo()
    os.symlink(tmp_path / "elsewhere.json", link)
    (tmp_path / "elsewhere.json").write_text("{}")
    foreign(tmp_path / "elsewhere.json", monkeypatch)
    monkeypatch.setattr(C, "_WARNED", set())
    with pytest.warns(UntrustedCacheWarning):
        assert not trusted_cache(link)


def test_a_users_private_group_may_write(tmp_path, monkeypatch):
    """umask 002 systems give each user a private group: writable by it is writable by the user alone."""
    import grp
    import pwd

    from rcn_fast._cache_dirs import trusted_cache

    f = tmp_path / "cache" / "x"
    f.parent.mkdir()
    f.write_text("x")
    os.chmod(f, 0o664)
    user = pwd.getpwuid(os.geteuid())
    group = grp.getgrgid(os.stat(f).st_gid)
    assert trusted_cache(f) == (group.gr_name == user.pw_name and not group.gr_mem and group.gr_gid == user.pw_gid)


# ------------------------------------------------------------------ the content-hash memo and check memo
def _forge_memo(data: Path, old_sha: str) -> Path:
    """Rewrite every memo so that it holds the file's *current* stats with ``old_sha`` (the issue's forgery)."""
    from rcn_fast._hashing import _stat_key  # noqa: PLC2701 -- the memo's own key, to forge it exactly

    memos = list((data.parent / "cache" / "content_hashes").glob("*.json"))
    assert memos
    for m in memos:
        rec = json.loads(m.read_text())
        rec["files"] = {k: [list(_stat_key(os.stat(data))), old_sha] for k in rec["files"]}
        m.write_text(json.dumps(rec))
    return memos[0].parent


@pytest.mark.parametrize("how", ["others-writable", "foreign-owner"])
def test_a_forged_content_hash_memo_in_an_untrusted_cache_is_ignored(tmp_path, monkeypatch, how):
    import rcn_fast._hashing as h

    data = tmp_path / "q.jsonl"
    data.write_text('{"id": 1, "question": "old text"}\n')
    old = content_fingerprint(data)
    data.write_text('{"id": 1, "question": "NEW text"}\n')
    new_sha = sha256_file(data)
    folder = _forge_memo(data, old)
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    assert content_fingerprint(data) == old  # the forgery works on a trusted cache: the stats match
    monkeypatch.setattr(h, "_PROCESS_MEMO", {})
    if how == "others-writable":
        os.chmod(folder, 0o777)
        why, named = "writable by others", folder
    else:
        named = next(folder.glob("*.json"))
        foreign(named, monkeypatch)
        why = "owned by another user"
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        value = content_fingerprint(data)
    assert value == new_sha != old  # 7491bb5: the forged memo's old hash
    _warned(got, named, why)


def test_a_check_memo_in_an_untrusted_cache_does_not_skip_the_check(tmp_path, monkeypatch):
    import rcn_fast._hashing as h

    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 10)
    runs = []
    check_once(f, "tag", lambda: runs.append(1))
    monkeypatch.setattr(h, "_PASSED", set())
    check_once(f, "tag", lambda: runs.append(1))
    assert len(runs) == 1  # remembered in the (trusted) memo folder
    os.chmod(tmp_path / "cache" / "content_hashes", 0o777)
    monkeypatch.setattr(h, "_PASSED", set())
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        check_once(f, "tag", lambda: runs.append(1))
    assert len(runs) == 2
    _warned(got, tmp_path / "cache" / "content_hashes", "writable by others")


# ------------------------------------------------------------------ the GGUF tokenizer cache
@pytest.fixture
def gguf_path(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "llm"))
    from llm_helpers import build_model, build_tokenizer, write_gguf

    tok = build_tokenizer()
    path = tmp_path / "m.gguf"
    write_gguf(build_model("llama", len(tok), tok.eos_token_id, tok.pad_token_id), tok, path)
    return path


def _forge_tokenizer_entry(entry: Path) -> None:
    """Swap two vocabulary ids in the cached tokenizer.json and recompute its manifest (the issue's forgery)."""
    f = entry / "tokenizer.json"
    tj = json.loads(f.read_text())
    vocab = tj["model"]["vocab"]
    a, b = "Ġthe", "Ġa"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    f.write_text(json.dumps(tj))
    man = json.loads((entry / "manifest.json").read_text())
    man.update(size=f.stat().st_size, sha256=sha256_file(f))
    (entry / "manifest.json").write_text(json.dumps(man))


@pytest.mark.parametrize("how", ["others-writable", "foreign-owner"])
def test_a_forged_gguf_tokenizer_cache_entry_in_an_untrusted_cache_is_ignored(gguf_path, tmp_path, monkeypatch, how):
    from rcn_fast.llm.backends.engine.gguf_file import GGUFFile
    from rcn_fast.llm.backends.engine.tokenizer import GGUFTokenizer

    want = GGUFTokenizer(GGUFFile(gguf_path), background=False).encode(" the")
    [entry] = list((tmp_path / "cache" / "gguf-tokenizers").iterdir())
    _forge_tokenizer_entry(entry)
    forged_sha = sha256_file(entry / "tokenizer.json")
    forged = GGUFTokenizer(GGUFFile(gguf_path), background=False).encode(" the")
    assert forged != want  # what a trusted cache would serve: the forgery is consistent
    if how == "others-writable":
        os.chmod(entry.parent, 0o777)
        named, why = entry.parent, "writable by others"
    else:
        foreign(entry, monkeypatch)
        named, why = entry, "owned by another user"
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        ids = GGUFTokenizer(GGUFFile(gguf_path), background=False).encode(" the")
    assert ids == want  # 7491bb5: the forged entry's ids
    _warned(got, named, why)
    assert sha256_file(entry / "tokenizer.json") == forged_sha  # the untrusted entry is left as it was, not rewritten


def test_an_untrusted_gguf_weights_cache_is_neither_read_nor_written(gguf_path, tmp_path, monkeypatch):
    from rcn_fast.llm.backends import gguf_cache

    monkeypatch.delenv(gguf_cache.ENV, raising=False)
    root = tmp_path / "cache"
    (root / "gguf").mkdir(parents=True)
    os.chmod(root / "gguf", 0o777)
    from rcn_fast._cache_dirs import UntrustedCacheWarning

    calls = []
    monkeypatch.setattr(gguf_cache, "verify_entry", lambda *a: calls.append("verify"))
    monkeypatch.setattr(gguf_cache, "_write_entry", lambda *a: calls.append("write"))
    with pytest.warns(UntrustedCacheWarning, match="GGUF cache: .*gguf is writable by others"):
        assert gguf_cache.load_gguf_cached(gguf_path, object(), lambda p, cfg: ("model", "tok")) == ("model", "tok")
    sha = str(__import__("rcn_fast.model_files", fromlist=["x"]).file_fingerprint(gguf_path)["sha256"])
    (root / "gguf" / sha).mkdir()
    assert gguf_cache.cached_tokenizer(gguf_path) is None and calls == []


# ------------------------------------------------------------------ the LLM call cache
def test_an_untrusted_llm_call_cache_is_neither_read_nor_written(tmp_path):
    from rcn_fast._cache_dirs import UntrustedCacheWarning
    from rcn_fast.llm.cache import CallCache

    out = tmp_path / "out"
    c = CallCache(out)
    key = CallCache.key("m", "k", {"q": 1})
    c.put_many([(key, "m", "k", {"q": 1}, {"forged": True})])
    assert c.get_many([key]) == {key: {"forged": True}}
    c.close()
    os.chmod(out, 0o777)
    with pytest.warns(UntrustedCacheWarning, match=rf"llm cache: {out} is writable by others"):
        c = CallCache(out)
    assert not c.trusted and c.get_many([key]) == {} and len(c) == 0 and c.misses == 1
    c.put_many([(CallCache.key("m", "k", {"q": 2}), "m", "k", {"q": 2}, {"v": 2})])
    os.chmod(out, 0o755)
    assert len(CallCache(out)) == 1  # nothing was written while it was untrusted
