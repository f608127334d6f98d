"""README is a short front door and docs/ holds the rest (issue 42 item 2):
README stays within 300 lines and lists every docs/ page; every
``python -m rcn_fast...`` command in README and docs/ names a module that
runs and only flags its ``--help`` lists (per subcommand); README's Python
example runs (tests/integrations/test_readme_examples.py)."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 300


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_readme_is_a_short_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    for heading in ("## Quick start", "## Tests", "## Documentation"):
        assert heading in text
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"```bash\n(.*?)```", quick, re.S)) == 2, "the Quick start is two commands: set-up, run"


def test_readme_lists_every_docs_page_and_links_resolve():
    text = README.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([^)#]+)", text))
    assert linked == {p.name for p in DOCS.glob("*.md")}
    for page in pages():  # relative links between pages point at files that exist
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.name} links to {target}, which does not exist"


def _code_texts(text: str) -> list[str]:
    """Fenced shell blocks (continuation lines joined) and inline code spans."""
    out = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang in ("", "bash", "sh", "console", "shell"):
            out += body.replace("\\\n", " ").splitlines()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    out += re.findall(r"`([^`\n]*python -m rcn_fast[^`\n]*)`", prose)
    return out


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv after ``python -m``) of every rcn_fast command in README and docs/."""
    found = []
    for page in pages():
        for line in _code_texts(page.read_text(encoding="utf-8")):
            for part in re.split(r"&&|\|\||;|\|", line):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:  # an unclosed quote in prose: not a command
                    continue
                for i in range(len(words) - 2):
                    if words[i].endswith("python") and words[i + 1] == "-m" and words[i + 2].startswith("rcn_fast"):
                        found.append((f"{page.name}: {part.strip()}", words[i + 2:]))
    return found


@functools.lru_cache(maxsize=None)
def help_text(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", *argv, "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO.parent)
    assert proc.returncode == 0, f"python -m {' '.join(argv)} --help failed: {proc.stderr[-2000:]}"
    return proc.stdout


def _subcommands(help_out: str) -> set[str]:
    """An argparse subparser's names: the ``{a,b}`` line under "positional arguments"."""
    m = re.search(r"positional arguments:\n\s+\{([\w,-]+)\}", help_out)
    return set(m.group(1).split(",")) if m else set()


def test_the_docs_show_commands():
    mods = {argv[0] for _, argv in commands()}
    assert {"rcn_fast.eval", "rcn_fast.corpus", "rcn_fast.serve", "rcn_fast.info"} <= mods


@pytest.mark.parametrize("where,argv", commands(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_documented_command_parses(where, argv):
    """The module runs with ``--help``, a subcommand it names exists, and every
    long flag of the line is one its ``--help`` lists."""
    module, rest = argv[0], argv[1:]
    top = help_text(module)
    subs = _subcommands(top)
    if subs and rest and not rest[0].startswith("-"):
        assert rest[0] in subs, f"{where}: {module} has no subcommand {rest[0]!r} ({sorted(subs)})"
        text = help_text(module, rest[0])
    else:
        text = top
    for word in rest:
        if word.startswith("--") and len(word) > 2:
            flag = word.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), \
                f"{where}: {flag} is not a flag of python -m {module}"


def test_help_texts_read_whole():
    """Every ``--help`` ends a sentence, not mid-word (issue 42 item 4: ``kb --help``
    stopped mid-sentence)."""
    for argv in sorted({tuple(a[:1]) for _, a in commands()}):
        text = help_text(*argv)
        desc = re.split(r"\n\s*\n", text.strip())
        assert desc, argv
        for para in desc:
            if para.lstrip().startswith(("usage:", "options:", "positional arguments:", "-")) or ":\n" in para:
                continue
            assert para.rstrip()[-1] in ".):", f"python -m {argv[0]} --help: a paragraph stops mid-sentence: {para!r}"
