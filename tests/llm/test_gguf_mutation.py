"""A property test of the GGUF loader (hypothesis): bytes of a small real
GGUF (llama.cpp's converter's output, tests/llm/data/converter/) mutated in
its header, metadata, tensor infos or data -- bytes overwritten, a size
field set to an extreme, a bit flipped, the file cut, bytes inserted or
removed -- must load (and generate) or be refused with ONE clear error
naming the file (GGUFError, UnsupportedModel; NonFiniteLogitsError when
mutated weights make NaN logits): never a signal, a hang, a huge
allocation or a Python error of another kind.

The loads run in a worker process (tests/llm/gguf_load_worker.py): a crash
shows as the worker dying, a hang as no answer within the time limit."""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "data" / "converter" / "llama_default.gguf"
ANSWER_SECONDS = 120  # a load of this 150 KB file takes well under a second
EXTREMES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1]


def regions() -> dict[str, tuple[int, int]]:
    """Byte ranges of the source file's parts, found by gguf-py's reader (not the code under test)."""
    from gguf import GGUFReader

    r = GGUFReader(str(SOURCE))
    kv = [f.offset for name, f in r.fields.items() if not name.startswith("GGUF.")]
    infos = min(t.field.offset for t in r.tensors)
    return {"header": (0, 24), "metadata": (min(kv), infos), "tensor infos": (infos, r.data_offset),
            "data": (r.data_offset, SOURCE.stat().st_size)}


REGIONS = regions()
ORIGINAL = SOURCE.read_bytes()


class Worker:
    """The loading process; restarted after it dies."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen | None = None

    def ask(self, path: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, str(HERE / "gguf_load_worker.py")], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env=self.env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_SECONDS)
        if not ready:
            self.close()
            return {"outcome": "hang"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(timeout=30)
            self.proc = None
            return {"outcome": "died", "returncode": code}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    env = dict(os.environ, RCN_FAST_CACHE=str(tmp_path_factory.mktemp("cache")), RCN_FAST_NUM_THREADS="1")
    w = Worker(env)
    yield w
    w.close()


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, str, bytes]:
    region = draw(st.sampled_from(sorted(REGIONS)))
    lo, hi = REGIONS[region]
    at = draw(st.integers(lo, hi - 1))
    kind = draw(st.sampled_from(["bytes", "extreme", "bit", "cut", "insert", "delete"]))
    data = bytearray(ORIGINAL)
    if kind == "bytes":
        new = draw(st.binary(min_size=1, max_size=8))
        data[at : at + len(new)] = new
    elif kind == "extreme":
        data[at : at + 8] = struct.pack("<Q", draw(st.sampled_from(EXTREMES)))
    elif kind == "bit":
        data[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "cut":
        del data[at:]
    elif kind == "insert":
        data[at:at] = draw(st.binary(min_size=1, max_size=16))
    else:
        del data[at : at + draw(st.integers(1, 64))]
    return region, f"{kind}@{at}", bytes(data)


def _check(worker: Worker, path: Path, blob: bytes, what: str) -> dict:
    path.write_bytes(blob)
    got = worker.ask(path)
    assert got["outcome"] in ("loaded", "refused"), f"{what}: {got}"
    if got["outcome"] == "refused":
        assert got["named"], f"{what}: the error does not name the file: {got}"
    return got


@settings(max_examples=120, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(m=mutations())
def test_a_mutated_real_file_loads_or_is_one_clear_error(worker, tmp_path, m):
    region, what, blob = m
    _check(worker, tmp_path / "mutated.gguf", blob, f"{region} {what}")


def test_the_worker_reports_the_unmutated_file_as_loaded_and_a_cut_file_as_refused(worker, tmp_path):
    """The harness itself: the original loads, a truncated copy is refused
    naming it (so the property test can tell outcomes apart)."""
    assert _check(worker, tmp_path / "same.gguf", ORIGINAL, "original")["outcome"] == "loaded"
    got = _check(worker, tmp_path / "cut.gguf", ORIGINAL[: len(ORIGINAL) // 2], "cut")
    assert got["outcome"] == "refused" and got["type"] == "GGUFError"
    assert set(REGIONS) == {"header", "metadata", "tensor infos", "data"}
    assert all(lo < hi for lo, hi in REGIONS.values())
