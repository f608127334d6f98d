"""``engine="auto"`` for a .gguf file: the fastest backend that runs it, by
recorded speeds per quantisation and model size on a matching CPU class
(rcn_fast/llm/backends/speeds.py), never one that would refuse it (each is
probed from the file's header first: rcn_fast/llm/backends/probe.py); and
every refusal names a backend that runs the file, or says that none
installed does and what to install (issue 52 items 1-2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import converter_cases as cc

from rcn_fast.llm import load_llm
from rcn_fast.llm import load as load_mod
from rcn_fast.llm.backends import speeds
from rcn_fast.llm.backends.engine import GGUFError, UnsupportedModel
from rcn_fast.llm.backends.probe import check_file, probe

ME = {"vendor": "GenuineTest", "isa": "avx2", "model": "Test CPU"}


def _row(backend: str, quant: str, params: int, tok_s: float, cpu: dict | None = None) -> speeds.SpeedRecord:
    return speeds.SpeedRecord(backend=backend, quant=quant, params=params, decode_tok_s=tok_s, prompt_tok_s=10 * tok_s,
                              cpu=cpu or ME, threads=2)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RCN_FAST_CACHE", str(tmp_path / "cache"))


# ------------------------------------------------------------------ the lookup


def test_the_nearest_measured_size_on_this_cpu_class_orders_the_backends():
    table = (_row("native", "Q8_0", 135_000_000, 60.0), _row("llamacpp", "Q8_0", 135_000_000, 50.0),
             _row("native", "Q8_0", 1_000_000_000, 10.0), _row("llamacpp", "Q8_0", 1_000_000_000, 25.0))
    all3 = ["native", "llamacpp", "transformers"]
    small, why = speeds.ranking("Q8_0", 200_000_000, all3, cpu=ME, records=table)
    assert small == ["native", "llamacpp", "transformers"] and "native 60.0 tok/s" in why
    big, why = speeds.ranking("Q8_0", 800_000_000, all3, cpu=ME, records=table)
    assert big == ["llamacpp", "native", "transformers"] and "at 1000M parameters" in why
    # halfway on a log scale: the smaller size decides
    assert speeds.ranking("Q8_0", int((135e6 * 1e9) ** 0.5), all3, cpu=ME, records=table)[0][0] == "native"
    # above the largest measured size that one decides; far below the smallest, the default order
    assert speeds.ranking("Q8_0", 70 * 10**9, all3, cpu=ME, records=table)[0][0] == "llamacpp"
    tiny, why = speeds.ranking("Q8_0", 135_000_000 // (speeds.MAX_BELOW + 1), all3, cpu=ME, records=table)
    assert tiny == list(speeds.DEFAULT_ORDER) and "measured on this CPU class from 135M" in why
    # a backend the options rule out is not named; one never measured there follows in the default order
    assert speeds.ranking("Q8_0", 10**9, ["native", "transformers"], cpu=ME, records=table)[0] == \
        ["native", "transformers"]


def test_other_cpu_classes_and_unmeasured_types_keep_the_default_order():
    table = (_row("llamacpp", "Q8_0", 10**9, 99.0), _row("native", "Q8_0", 10**9, 1.0))
    all3 = ["native", "llamacpp", "transformers"]
    for cpu in ({**ME, "isa": "avx512"}, {**ME, "vendor": "AuthenticAMD"}):
        order, why = speeds.ranking("Q8_0", 10**9, all3, cpu=cpu, records=table)
        assert order == list(speeds.DEFAULT_ORDER) and "the default order" in why
    assert speeds.ranking("Q4_K", 10**9, all3, cpu=ME, records=table)[0] == list(speeds.DEFAULT_ORDER)
    assert speeds.ranking("Q8_0", 10**9, all3, cpu={**ME, "model": "another model"}, records=table)[0][0] == "llamacpp"
    assert speeds.ranking("Q8_0", 10**9, all3, cuda=True, records=table)[0] == list(speeds.CUDA_ORDER)


def test_the_cpu_class_and_the_file_kind():
    assert speeds._flags_isa({"avx2", "fma"}) == "avx2"
    assert speeds._flags_isa({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}) == "avx512"
    assert speeds._flags_isa({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}) == "avx512-vnni"
    assert speeds._flags_isa({"sse2"}) == "generic"
    info = speeds.cpu_info()
    assert set(info) == {"vendor", "isa", "model"} and info["isa"]
    quant, params = speeds.file_kind(check_file(cc.DATA / "llama31_k256.gguf"))
    assert quant == "F32" and 800_000 < params < 900_000


def test_the_shipped_records_are_well_formed():
    from rcn_fast.llm.backends.engine import ggml_types

    rows = speeds.load_records()
    assert rows  # measured on at least one machine
    for r in rows:
        assert r.backend in ("native", "llamacpp", "transformers") and r.params > 0
        assert r.decode_tok_s > 0 and r.prompt_tok_s > 0 and r.threads >= 1
        assert {"vendor", "isa", "model"} <= set(r.cpu) and r.command.startswith("python bench/engine_speeds.py")
        assert r.quant in ggml_types.by_name()
    with pytest.raises(ValueError, match="format"):
        speeds.load_records(json.dumps({"format": "other", "rows": []}))


# ------------------------------------------------------------------ auto


@pytest.fixture(scope="module")
def q3k(tmp_path_factory):
    """A Q3_K_M file made by llama.cpp's quantizer (Q3_K tensors: no rcn_fast kernel)."""
    pytest.importorskip("llama_cpp")
    from rcn_fast.llm.backends.llamacpp import lib

    path = tmp_path_factory.mktemp("q3k") / "k256-Q3_K_M.gguf"
    lib.quantize(cc.DATA / "llama31_k256.gguf", path, "Q3_K_M")
    return path


def test_auto_takes_the_recorded_fastest_that_runs_the_file(monkeypatch):
    pytest.importorskip("llama_cpp")
    from rcn_fast.llm.backends.engine import GGUFLLM
    from rcn_fast.llm.backends.llamacpp import LlamaCppLLM

    path = cc.DATA / "llama31_k256.gguf"
    quant, params = speeds.file_kind(check_file(path))
    monkeypatch.setattr(speeds, "cpu_info", lambda: ME)
    monkeypatch.setattr(speeds, "load_records", lambda: (_row("native", quant, params, 5.0),
                                                         _row("llamacpp", quant, params, 9.0)))
    assert isinstance(load_llm(str(path)), LlamaCppLLM)
    monkeypatch.setattr(speeds, "load_records", lambda: (_row("native", quant, params, 9.0),
                                                         _row("llamacpp", quant, params, 5.0)))
    assert isinstance(load_llm(str(path)), GGUFLLM)
    monkeypatch.setattr(speeds, "load_records", lambda: ())
    assert isinstance(load_llm(str(path)), GGUFLLM)  # the default order
    assert isinstance(load_llm(str(path), kv_type="f16"), LlamaCppLLM)  # an option only llama.cpp takes
    assert isinstance(load_llm(str(path), prefix_cache_mb=64), GGUFLLM)  # one only the native engine takes


def test_auto_never_picks_a_backend_that_would_refuse_the_file(q3k, monkeypatch):
    from rcn_fast.llm.backends.llamacpp import LlamaCppLLM

    g = check_file(q3k)
    if probe(q3k, "native", g).runs:
        pytest.skip("this native engine multiplies Q3_K")
    quant, params = speeds.file_kind(g)
    assert quant == "Q3_K"
    monkeypatch.setattr(speeds, "cpu_info", lambda: ME)
    monkeypatch.setattr(speeds, "load_records", lambda: (_row("native", quant, params, 99.0),
                                                         _row("llamacpp", quant, params, 1.0)))
    tried = []
    real = load_mod._make
    monkeypatch.setattr(load_mod, "_make", lambda b, *a, **k: tried.append(b) or real(b, *a, **k))
    assert isinstance(load_llm(str(q3k)), LlamaCppLLM)
    assert tried == ["llamacpp"]  # the native engine was probed, not loaded


# ------------------------------------------------------------------ refusals


def test_a_refusal_names_the_backend_that_runs_the_file(q3k):
    with pytest.raises(UnsupportedModel, match=r"'blk\.0\.attn_q\.weight' is Q3_K|is Q3_K|is Q[0-9]_K") as err:
        load_llm(str(q3k), engine="native")
    assert str(err.value).endswith("; engine='llamacpp' runs it"), str(err.value)
    # transformers refuses the llama3 rope it would ignore, naming the backends that run it (it named
    # engine='native' even where the native engine had just refused the file)
    with pytest.raises(GGUFError, match="cannot run on transformers: it holds rope_freqs") as err:
        load_llm(str(q3k), engine="transformers", device="cpu")
    assert str(err.value).endswith("; engine='llamacpp' runs it"), str(err.value)
    rope = cc.DATA / "llama31_rope.gguf"
    with pytest.raises(GGUFError, match="cannot run on transformers") as err:
        load_llm(str(rope), engine="transformers", device="cpu")
    assert str(err.value).endswith("; engine='native' or engine='llamacpp' run it"), str(err.value)


def test_when_no_installed_backend_runs_it_the_refusal_says_what_to_install(q3k, monkeypatch):
    from rcn_fast.llm.backends.llamacpp import lib

    monkeypatch.setattr(lib, "installed", lambda: False)
    with pytest.raises(UnsupportedModel) as err:
        load_llm(str(q3k), engine="native")
    msg = str(err.value)
    assert "no installed backend runs it (" in msg and "llamacpp: llama-cpp-python is not installed: pip install " \
        "'rcn_fast[llamacpp]'" in msg and "transformers: it holds rope_freqs.weight" in msg, msg
    with pytest.raises(UnsupportedModel, match=r"no installed backend runs it with these options \(native: ") as err:
        load_llm(str(q3k))
    assert "pip install 'rcn_fast[llamacpp]'" in str(err.value)


def test_a_malformed_file_is_refused_before_any_backend(tmp_path, monkeypatch):
    """B7's rule for every engine: a GGUFError (here declared sizes the
    tensors lack) stops the load; no backend is tried."""
    import gguf_bytes as gb

    kvs, tensors = gb.read(cc.DATA / "llama_default.gguf")
    path = tmp_path / "bad.gguf"
    path.write_bytes(gb.build(gb.edit(kvs, "llama.block_count", gb.U32, 3), tensors))
    tried = []
    monkeypatch.setattr(load_mod, "_make", lambda b, *a, **k: tried.append(b))
    for engine in ("auto", "native", "llamacpp", "transformers"):
        with pytest.raises(GGUFError, match="block_count is 3 but the file holds tensors of 2 blocks"):
            load_llm(str(path), engine=engine)
    assert tried == []


def test_probe_reports_each_backend(q3k):
    g = check_file(q3k)
    assert probe(q3k, "llamacpp", g).runs
    tr = probe(q3k, "transformers", g)
    assert not tr.runs and "rope_freqs" in tr.why
    native = probe(Path(cc.DATA / "qwen2.gguf"), "native")
    assert native.runs and native.why == ""
    with pytest.raises(ValueError, match="backend"):
        probe(q3k, "vllm")
