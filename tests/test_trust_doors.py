"""Issue 44: one guarded door per kind of input, and a walk of the package
(the source, read with :mod:`ast`; nothing imported) that fails when a new
path goes around it -- as tests/test_trust_remote_code.py does for
``from_pretrained(``.

* templates -- rcn_fast/_templates/ (the door, its allowlist, its sandbox
  and its render worker): the only package that imports jinja2, compiles a
  template or renders a chat; nothing calls a tokenizer's own
  ``apply_chat_template``, and a task's ``question_template`` is filled by
  the door's ``fill_fields``, never by ``str.format``;
* files in folders the user names -- rcn_fast/_files.py (its mechanism in
  rcn_fast/_beneath.py): files by handle. Every raw file access of the
  package (``open``, ``Path.read_*`` / ``write_*``, ``np.load`` /
  ``np.save`` ..., ``sqlite3.connect``) either reads or writes a file object
  the door opened (or an in-memory buffer), or is counted here per module
  with the reason it may (a ratchet: a new one fails until it goes through
  the door or is listed); the door returns no path to open again (issue 53:
  nothing is checked by name and used by name), nothing opens by name a
  path it built from a door ``Folder``, and every open of the mechanism
  starts from a folder's descriptor; the eval's output writers take none,
  every reader of a store, model folder, task folder or index calls the
  door, and no task or fingerprint code follows links in a walk or globs
  by name;
* caches and memos -- rcn_fast/_cache_dirs.py: every module that locates a
  cache asks :func:`trusted_cache`, and only that module knows the root;
* request fields -- rcn_fast/llm/server/limits.py: the server parses bodies
  only with :func:`parse_request`, and every field it reads has a budget
  listed here;
* records read back -- rcn_fast/eval/metrics.py: ``Task.check_record`` is
  the one validator, and every checkpoint is opened with it.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

import rcn_fast

PACKAGE = Path(rcn_fast.__file__).resolve().parent


def _sources() -> dict[str, ast.Module]:
    return {py.relative_to(PACKAGE.parent).as_posix(): ast.parse(py.read_text(encoding="utf-8"))
            for py in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()


def _name(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _called(tree: ast.AST) -> set[str]:
    return {_name(c.func) for c in _calls(tree)} - {None}


def test_the_walk_sees_the_package():
    assert len(SOURCES) > 150 and "rcn_fast/_templates/__init__.py" in SOURCES and "rcn_fast/llm/server/app.py" in SOURCES


# ------------------------------------------------------------------ templates
TEMPLATE_DOOR = "rcn_fast/_templates/"


def test_only_the_template_door_imports_jinja2_or_renders_a_chat():
    bad = []
    for rel, tree in SOURCES.items():
        if rel.startswith(TEMPLATE_DOOR):
            continue
        for n in ast.walk(tree):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module or ""] if isinstance(n, ast.ImportFrom) else []
            if any(m == "jinja2" or m.startswith("jinja2.") or "chat_template_utils" in m for m in mods):
                bad.append(f"{rel}:{n.lineno}: imports {mods}")
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(".")[0] == "jinja2":
                bad.append(f"{rel}:{n.lineno}: names the module {n.value!r} (an import by name)")
            if isinstance(n, ast.Call) and _name(n.func) in ("apply_chat_template", "from_string",
                                                             "render_jinja_template", "Template", "Environment",
                                                             "SandboxedEnvironment", "ImmutableSandboxedEnvironment"):
                bad.append(f"{rel}:{n.lineno}: calls {ast.unparse(n.func)}(...)")
    assert not bad, "a template path around rcn_fast/_templates/:\n" + "\n".join(bad)


def test_every_chat_render_goes_through_the_door():
    """The chat renderers call the door; the GGUF tokenizer's own apply_chat_template delegates to it."""
    for rel in ("rcn_fast/llm/chat.py", "rcn_fast/llm/server/routes.py"):
        assert "chat_prompt" in _called(SOURCES[rel]), rel
    tok = SOURCES["rcn_fast/llm/backends/engine/tokenizer.py"]
    [method] = [n for n in ast.walk(tok) if isinstance(n, ast.FunctionDef) and n.name == "apply_chat_template"]
    assert "render_chat_template" in _called(method)
    assert "render_task_template" in _called(SOURCES["rcn_fast/eval/tasks/lm_eval.py"])


def test_a_question_template_is_filled_by_the_door():
    """Issue 53 (N6): ``question_template`` is ``{field}`` substitution by the door, not ``str.format``."""
    loading = SOURCES["rcn_fast/eval/tasks/loading.py"]
    assert "fill_fields" in _called(loading)
    formats = [n for n in _calls(loading) if isinstance(n.func, ast.Attribute) and n.func.attr in ("format", "format_map")
               and "template" in ast.unparse(n.func.value)]
    assert not formats, [ast.unparse(n) for n in formats]


# ------------------------------------------------------------------ files
FILES_DOOR = "rcn_fast/_files.py"
DOOR_MODULES = {FILES_DOOR, "rcn_fast/_beneath.py", "rcn_fast/_file_data.py"}
#: the door's calls (functions and Folder methods): none returns a path to open again
DOOR_FUNCS = {"open_read", "open_fd", "read_bytes", "read_text", "is_file", "open_write", "write_text",
              "write_atomic", "make_dirs", "replace", "listdir", "glob", "check_links", "refuse_links", "load_npy",
              "save_npy", "create_npy", "read_npy", "map_fd", "open_named", "confined", "read_trusted", "Folder",
              "folder", "read_stamped_json", "write_stamped_json", "write_json_atomic"}
#: door calls that return an open file object (a raw call reading or writing it is by handle)
HANDLE_FUNCS = {"open_read", "open_write", "open_named"}
PATH_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "tofile"}
MODULE_FUNCS = {"np": {"load", "save", "savez", "savez_compressed", "memmap", "fromfile"}, "os": {"open"},
                "sqlite3": {"connect"}, "torch": {"save", "load"}, "gzip": {"open"}, "bz2": {"open"},
                "lzma": {"open"}, "io": {"open"}, "format": {"open_memmap"}}

_USER_FILE = "opens a file the user names itself (not a file inside a folder the user names)"
_OWN_FOLDER = "its own save/load of a folder it writes and reads back whole (to move behind rcn_fast._files)"
_CACHE = "cache entries, read only when rcn_fast._cache_dirs.trusted_cache allows"
#: module -> (raw file accesses, why they may): the known ones. A new raw access fails the test.
RAW_FILE_ACCESS: dict[str, tuple[int, str]] = {
    "rcn_fast/_crossovers.py": (1, "the package's own crossover table"),
    "rcn_fast/_cuda_versions.py": (1, "the kernel's /proc/driver/nvidia/version (the driver's release), no user folder"),
    "rcn_fast/_hashing.py": (3, "hashes a file its caller names (sha256_file; content_fingerprint and check_once "
                                "without a root or descriptor); folders and memos through the door"),
    "rcn_fast/corpus/assemble.py": (7, _OWN_FOLDER),
    "rcn_fast/corpus/leakage.py": (2, _OWN_FOLDER),
    "rcn_fast/corpus/sources.py": (2, _USER_FILE),
    "rcn_fast/data/fetch.py": (1, "hashes a downloaded file; cache entries are checked against their pinned sha256"),
    "rcn_fast/eval/config.py": (2, _USER_FILE + " (a run config)"),
    "rcn_fast/eval/run/loading.py": (1, _USER_FILE + " (a corpus file: its first line)"),
    "rcn_fast/eval/tasks/sources.py": (1, "reads a dataset card of the Hugging Face cache"),
    "rcn_fast/kb/__init__.py": (2, _USER_FILE),
    "rcn_fast/kb/__main__.py": (1, _USER_FILE + " (--out)"),
    "rcn_fast/kb/silver.py": (3, _USER_FILE),
    "rcn_fast/kg/graph.py": (3, _OWN_FOLDER),
    "rcn_fast/kg/loaders.py": (3, _USER_FILE),
    "rcn_fast/kg/sampler.py": (2, _USER_FILE),
    "rcn_fast/llm/backends/engine/gguf_file.py": (1, _USER_FILE + " (a .gguf)"),
    "rcn_fast/llm/backends/engine/tokenizer.py": (1, "writes a fresh private temporary entry; " + _CACHE),
    "rcn_fast/llm/backends/gguf_cache.py": (3, "writes (and reads back) a fresh private temporary entry; " + _CACHE),
    "rcn_fast/llm/backends/speeds.py": (1, "/proc/cpuinfo (the CPU class of a speed record)"),
    "rcn_fast/llm/cache.py": (4, "sqlite on the file CallCache checked with refuse_links (and its "
                                 "-wal/-shm/-journal): sqlite opens by name (docs/security.md)"),
    "rcn_fast/model_files.py": (1, _USER_FILE + " (a .gguf's header)"),
    "rcn_fast/paper/report.py": (2, _USER_FILE + " (--report)"),
    "rcn_fast/paper/run.py": (1, _USER_FILE),
    "rcn_fast/pipelines/config.py": (1, _USER_FILE + " (a pipeline config)"),
    "rcn_fast/prompts/__init__.py": (1, _USER_FILE + " (a prompt file)"),
    "rcn_fast/retrieval/bm25.py": (2, "writes a fresh temporary folder (bm25s reads the folder by name after "
                                      "check_links)"),
    "rcn_fast/retrieval/conventions.py": (2, _USER_FILE),
    "rcn_fast/retrieval/corpus_input.py": (6, _USER_FILE + " (the corpus input); its scan memo through the door"),
    "rcn_fast/retrieval/encoders/base.py": (1, "reads an encoder folder's settings"),
    "rcn_fast/retrieval/encoders/onnx.py": (1, "writes a fresh temporary export folder; " + _CACHE),
    "rcn_fast/retrieval/st_folder.py": (1, "reads a sentence-transformers folder's settings"),
    "rcn_fast/retrieval/train.py": (13, _OWN_FOLDER + " (training checkpoints)"),
    "rcn_fast/retrieval/train_data.py": (1, _USER_FILE),
    "rcn_fast/retrieval/zebra_kb.py": (1, _OWN_FOLDER),
    "rcn_fast/search/topn.py": (2, "/proc files"),
    "rcn_fast/septa/checkpoint.py": (2, _USER_FILE + " (weights_only checkpoints)"),
    "rcn_fast/septa/predictor.py": (2, _OWN_FOLDER),
    "rcn_fast/septa/system.py": (11, _OWN_FOLDER),
    "rcn_fast/septa/vectordb.py": (7, _OWN_FOLDER),
    "rcn_fast/testing/tiny_retrieval.py": (2, "writes a test model into a fresh folder"),
}
#: the eval's output-folder writers and the readers of a folder the user names: all through the door
OUTPUT_WRITERS = ("rcn_fast/eval/run/checkpoint.py", "rcn_fast/eval/run/shards.py", "rcn_fast/eval/report/results.py",
                  "rcn_fast/eval/report/plot.py")
FOLDER_READERS = ("rcn_fast/retrieval/store.py", "rcn_fast/search/flat_index.py", "rcn_fast/retrieval/bm25.py",
                  "rcn_fast/model_files.py", "rcn_fast/eval/tasks/catalog.py", "rcn_fast/eval/tasks/lm_eval.py",
                  "rcn_fast/eval/run/loading.py", "rcn_fast/llm/cache.py", "rcn_fast/eval/show.py")


def _through_door(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Call) and _name(node.func) in DOOR_FUNCS


def _bound(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names bound to a file object the door opened or to an in-memory buffer, names bound to a door
    ``Folder``) anywhere in ``tree`` (``with open_write(...) as f``, ``buf = io.BytesIO()``,
    ``with Folder(p) as root``, ``root: Folder`` ...)."""
    handles, folders = set(), {"self.folder"}

    def kind(v: ast.AST | None) -> str | None:
        if isinstance(v, ast.Call):
            n = _name(v.func)
            if n in HANDLE_FUNCS or n == "BytesIO":
                return "handle"
            if n in ("Folder", "folder", "sub", "from_fd"):
                return "folder"
        return None

    for n in ast.walk(tree):
        pairs: list[tuple[ast.AST, ast.AST | None]] = []
        if isinstance(n, ast.With):
            pairs = [(i.optional_vars, i.context_expr) for i in n.items if i.optional_vars is not None]
        elif isinstance(n, ast.Assign):
            pairs = [(t, n.value) for t in n.targets]
        elif isinstance(n, ast.arg) and n.annotation is not None and "Folder" in ast.unparse(n.annotation):
            folders.add(n.arg)
        for target, value in pairs:
            k = kind(value)
            if isinstance(target, ast.Name) and k == "handle":
                handles.add(target.id)
            elif isinstance(target, ast.Name) and k == "folder":
                folders.add(target.id)
    return handles, folders


def raw_file_accesses(tree: ast.AST) -> list[ast.Call]:
    """The calls of ``tree`` that open, read or write a file by name: not a door call, not a read or
    write of a file object the door opened (or of an in-memory buffer)."""
    handles, folders = _bound(tree)

    def by_handle(arg: ast.AST | None) -> bool:
        return (isinstance(arg, ast.Call) and _name(arg.func) in HANDLE_FUNCS | {"BytesIO"}) \
            or (isinstance(arg, ast.Name) and arg.id in handles)

    out = []
    for n in _calls(tree):
        f, arg = n.func, (n.args[0] if n.args else None)
        if isinstance(f, ast.Name) and f.id == "open":
            raw = not by_handle(arg)
        elif isinstance(f, ast.Attribute) and f.attr in PATH_METHODS:
            raw = not _through_door(f.value) and ast.unparse(f.value) not in folders \
                and "resources.files" not in ast.unparse(f.value)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, (ast.Name, ast.Attribute)):
            mod = f.value.id if isinstance(f.value, ast.Name) else f.value.attr
            raw = f.attr in MODULE_FUNCS.get(mod, ()) and not by_handle(arg)
        else:
            raw = False
        if raw:
            out.append(n)
    return out


def names_a_door_path(tree: ast.AST) -> list[ast.Call]:
    """Raw file accesses whose path is built from what a door ``Folder`` holds (``root.path / x``,
    ``root.full(x)``, its ``anchors``): a path the door resolved, opened again by name (issue 53)."""
    _, folders = _bound(tree)
    bad = []
    for c in raw_file_accesses(tree):
        for n in ast.walk(c):
            if isinstance(n, ast.Attribute) and n.attr in ("path", "full", "anchors") \
                    and ast.unparse(n.value) in folders:
                bad.append(c)
                break
    return bad


def test_every_raw_file_access_is_through_the_door_or_accounted_for():
    found = {rel: raw_file_accesses(tree) for rel, tree in SOURCES.items() if rel not in DOOR_MODULES}
    new, fixed = [], []
    for rel, calls in found.items():
        known = RAW_FILE_ACCESS.get(rel, (0, ""))[0]
        if len(calls) > known:
            new.append(f"{rel}: {len(calls)} raw file accesses, {known} known: "
                       + "; ".join(f"line {c.lineno}: {ast.unparse(c)[:60]}" for c in calls))
        elif len(calls) < known:
            fixed.append(f"{rel}: {len(calls)} (listed {known})")
    assert not new, ("a file access around rcn_fast/_files.py (take the path from inside()/no_links(), open with "
                     "open_write(), or list the module with its reason):\n" + "\n".join(new))
    if fixed:
        warnings.warn("fewer raw file accesses than RAW_FILE_ACCESS lists (lower its counts): " + "; ".join(fixed))
    assert all(why for _, why in RAW_FILE_ACCESS.values())


def test_nothing_opens_by_name_a_path_the_door_resolved():
    """Issue 53: the door returns no path (its public calls return file objects, descriptors, maps,
    bytes or nothing), and no module opens by name a path built from a door Folder."""
    import rcn_fast._files as door

    returned = {}
    for node in (n for rel in DOOR_MODULES for n in ast.walk(SOURCES[rel])):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.returns is not None:
            returned[node.name] = ast.unparse(node.returns)
    path_like = {n: r for n, r in returned.items() if "Path" in r and n not in ("full", "rel")}
    assert not path_like, f"door calls returning a path to open again: {path_like}"
    assert not {"inside", "no_links"} & set(door.__all__) and not hasattr(door, "inside")
    bad = [f"{rel}:{c.lineno}: {ast.unparse(c)[:70]}" for rel, tree in SOURCES.items() if rel not in DOOR_MODULES
           for c in names_a_door_path(tree)]
    assert not bad, "a path the door resolved, opened again by name:\n" + "\n".join(bad)


def test_the_door_opens_beneath_a_descriptor():
    """The mechanism: every open of rcn_fast/_beneath.py's walk starts from a folder descriptor
    (``dir_fd=``; the one exception probes openat2 on ``/``), and the door opens by name only the
    folder a user names (``Folder.__init__``) and a file a reader was given outside any confined folder
    (``open_named``)."""
    opens = [c for c in _calls(SOURCES["rcn_fast/_beneath.py"]) if ast.unparse(c.func) == "os.open"]
    assert opens and all("dir_fd" in {k.arg for k in c.keywords} or ast.unparse(c.args[0]) == "'/'" for c in opens)
    where = set()
    for rel in (FILES_DOOR, "rcn_fast/_file_data.py"):
        named = [c for c in _calls(SOURCES[rel]) if ast.unparse(c.func) == "os.open"
                 and "dir_fd" not in {k.arg for k in c.keywords}]
        where |= {f.name for f in ast.walk(SOURCES[rel]) if isinstance(f, ast.FunctionDef)
                  for c in named if any(c is x for x in ast.walk(f))}
    assert where == {"__init__", "open_named"}, where


#: modules that walk or glob task folders and fingerprinted folders: only through the door
WALKERS = ("rcn_fast/_hashing.py", "rcn_fast/eval/tasks/spec.py", "rcn_fast/eval/tasks/catalog.py",
           "rcn_fast/eval/tasks/lm_eval.py", "rcn_fast/eval/tasks/sources.py", "rcn_fast/eval/tasks/loading.py",
           "rcn_fast/data/loaders.py")


@pytest.mark.parametrize("rel", WALKERS)
def test_task_folders_and_fingerprints_never_follow_links_or_glob_by_name(rel):
    """Issue 53 (N4/N5): no ``os.walk`` (it was ``followlinks=True``), recursive ``glob`` or ``rglob``,
    no ``expanduser`` of a task file's data paths."""
    bad = [f"line {c.lineno}: {ast.unparse(c)[:60]}" for c in _calls(SOURCES[rel])
           if _name(c.func) in ("walk", "rglob", "iglob") and ast.unparse(c.func) != "f.walk"
           or ast.unparse(c.func) in ("glob.glob", "os.walk")]
    if rel in ("rcn_fast/eval/tasks/spec.py", "rcn_fast/_hashing.py"):
        bad += [f"line {c.lineno}: expanduser" for c in _calls(SOURCES[rel]) if _name(c.func) == "expanduser"]
    assert not bad, f"{rel} walks or globs around the door: {bad}"


@pytest.mark.parametrize("rel", OUTPUT_WRITERS)
def test_the_output_folder_is_written_only_through_the_door(rel):
    tree = SOURCES[rel]
    assert raw_file_accesses(tree) == [] and rel not in RAW_FILE_ACCESS
    assert _called(tree) & DOOR_FUNCS
    opened = {item.optional_vars.id for n in ast.walk(tree) if isinstance(n, ast.With) for item in n.items
              if _through_door(item.context_expr) and isinstance(item.optional_vars, ast.Name)} | _bound(tree)[0]
    bad = [f"line {c.lineno}: {ast.unparse(c)[:60]}" for c in _calls(tree)
           if (_name(c.func) in ("mkdir", "makedirs", "savefig") or _name(c.func) in ("replace", "rename")
               and isinstance(c.func, ast.Attribute) and ast.unparse(c.func.value) == "os")
           and not (c.args and (_through_door(c.args[-1]) or isinstance(c.args[0], ast.Name) and c.args[0].id in opened))]
    assert not bad, f"{rel} creates folders or files around the door: {bad}"


@pytest.mark.parametrize("rel", FOLDER_READERS)
def test_every_reader_of_a_folder_the_user_names_asks_the_door(rel):
    assert _called(SOURCES[rel]) & DOOR_FUNCS, rel


# ------------------------------------------------------------------ caches
CACHE_DOOR = "rcn_fast/_cache_dirs.py"
CACHE_USERS = {"rcn_fast/_hashing.py", "rcn_fast/llm/backends/engine/tokenizer.py", "rcn_fast/llm/backends/gguf_cache.py",
               "rcn_fast/llm/cache.py", "rcn_fast/retrieval/encoders/onnx.py", "rcn_fast/retrieval/corpus_input.py"}


def test_every_cache_is_located_and_trusted_through_the_door():
    bad, users = [], set()
    for rel, tree in SOURCES.items():
        if rel == CACHE_DOOR:
            continue
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "rcn_fast._cache_dirs"
                 for a in n.names}
        called = _called(tree)
        if "cache_root" in names or "cache_root" in called and rel != "rcn_fast/data/fetch.py":
            bad.append(f"{rel}: uses cache_root() (locate a cache with cache_dir(name))")
        if names - {"trusted_cache", "UntrustedCacheWarning"} and "trusted_cache" not in called:
            bad.append(f"{rel}: locates a cache ({sorted(names)}) but never asks trusted_cache()")
        if "trusted_cache" in called:
            users.add(rel)
    assert not bad, "a cache path around rcn_fast/_cache_dirs.py:\n" + "\n".join(bad)
    assert users >= CACHE_USERS, f"caches that no longer ask the door: {sorted(CACHE_USERS - users)}"


# ------------------------------------------------------------------ request fields
#: the server's modules; the body door (body.py) is the one that parses JSON
SERVER = tuple(sorted(rel for rel in SOURCES if rel.startswith("rcn_fast/llm/server/")))
BODY_DOOR = "rcn_fast/llm/server/body.py"
#: every request field the server reads -> the budget or check it is held to before any work
FIELD_BUDGETS = {
    "messages": "check_request_sizes (count, characters), validate_chats", "prompt": "check_request_sizes (count, "
    "token lists, characters)", "stop": "check_request_sizes (count, characters, the context)",
    "model": "check_model (compared, echoed cut to 200 characters)", "logit_bias": "logit_bias (entries, key lengths)",
    "max_tokens": "_int", "max_completion_tokens": "_int", "temperature": "_number", "top_p": "_number", "n": "_int",
    "seed": "_int", "logprobs": "check_k / bool", "top_logprobs": "check_k", "prompt_logprobs": "check_k",
    "echo": "bool", "add_special_tokens": "bool check", "continue_final_message": "bool",
    "add_generation_prompt": "bool", "stream": "stream_options (bool)",
    "stream_options": "stream_options (an object, only with stream; two bools)",
}


def test_the_server_parses_bodies_only_through_the_door_and_reads_only_budgeted_fields():
    app = SOURCES["rcn_fast/llm/server/app.py"]
    assert BODY_DOOR in SERVER and "rcn_fast/llm/server/routes.py" in SERVER
    loads = [f"{rel}: {ast.unparse(c)}" for rel in SERVER if rel != BODY_DOOR for c in _calls(SOURCES[rel])
             if _name(c.func) in ("loads", "load", "JSONDecoder", "raw_decode")]
    assert not loads, f"the server parses JSON around parse_request: {loads}"
    [post] = [n for n in ast.walk(app) if isinstance(n, ast.FunctionDef) and n.name == "do_POST"]
    methods = {n.name: n for n in ast.walk(app) if isinstance(n, ast.FunctionDef)}
    called = _called(post) | {c for m in _called(post) if m in methods for c in _called(methods[m])}
    assert {"parse_request", "check_request_sizes"} <= called  # in do_POST or the method it hands the body to
    read = set()
    for rel in SERVER:
        for c in _calls(SOURCES[rel]):
            f = c.func
            if isinstance(f, ast.Attribute) and f.attr == "get" and isinstance(f.value, ast.Name) \
                    and f.value.id == "body" and c.args and isinstance(c.args[0], ast.Constant):
                read.add(c.args[0].value)
        for n in ast.walk(SOURCES[rel]):
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "body" \
                    and isinstance(n.slice, ast.Constant):
                read.add(n.slice.value)
            if isinstance(n, ast.Call) and _name(n.func) in ("_int", "_number", "check_k") and len(n.args) > 1 \
                    and isinstance(n.args[1], ast.Constant):
                read.add(n.args[1].value)
    assert {"stop", "messages", "prompt", "max_completion_tokens", "n", "temperature"} <= read
    assert read <= set(FIELD_BUDGETS), f"request fields read without a listed budget: {sorted(read - set(FIELD_BUDGETS))}"


# ------------------------------------------------------------------ records read back
def test_records_have_one_validator_and_every_checkpoint_uses_it():
    defs = [rel for rel, tree in SOURCES.items() for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name == "check_record"]
    assert defs == ["rcn_fast/eval/metrics.py"]
    made = [(rel, c) for rel, tree in SOURCES.items() for c in _calls(tree) if _name(c.func) == "Checkpoint"]
    assert made and all("check" in {k.arg for k in c.keywords} for _, c in made), \
        [f"{rel}:{c.lineno}" for rel, c in made if "check" not in {k.arg for k in c.keywords}]
    plan = SOURCES["rcn_fast/eval/run/plan.py"]
    [rc] = [n for n in ast.walk(SOURCES["rcn_fast/eval/run/plan.py"]) if isinstance(n, ast.FunctionDef)
            and n.name == "record_check"] or [n for rel, tree in SOURCES.items() for n in ast.walk(tree)
                                              if isinstance(n, ast.FunctionDef) and n.name == "record_check"]
    assert "check_record" in _called(rc) and plan is not None


def test_the_walks_find_a_path_around_each_door():
    """The detectors above on code that goes around the doors (so none of these tests cannot fail)."""
    around = ast.parse("import jinja2\ntok.apply_chat_template(chat, tokenize=False)\n"
                       "open(out / 'llm_cache.sqlite', 'ab')\n(ck / 'x.jsonl').write_text(s)\nnp.load(p / 'texts.npy')\n"
                       "sqlite3.connect(path)\n")
    through = ast.parse("np.load(open_read(root, 'e.npy'))\nread_bytes(root, p)\n"
                        "with open_write(root, 'x', 'wb') as f:\n    np.save(f, a)\n"
                        "with Folder(p) as root:\n    root.read_text('index.json')\n")
    assert len(raw_file_accesses(around)) == 4 and raw_file_accesses(through) == []
    by_name = ast.parse("with Folder(p) as root:\n    np.load(root.path / 'e.npy')\n    open(root.full('x'))\n")
    assert len(names_a_door_path(by_name)) == 2
    assert {"apply_chat_template"} <= _called(around)
    assert any(isinstance(n, ast.Import) and n.names[0].name == "jinja2" for n in ast.walk(around))
