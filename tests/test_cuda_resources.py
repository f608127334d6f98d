"""The resource check (issue 55 item 2): GPU-only launch failures caught
without a GPU.

Every ``.cu`` of csrc/ is compiled for sm_80 and sm_90 with the build's
flags and put through ``ptxas -v`` (tests/cuda_ptxas.py, cached per source
digest). Each kernel instantiation is checked against the launch table its
launcher takes its configurations from (csrc/*/cuda/*_launch.h, printed by
tests/cuda_launch_table.cpp) and against the architecture:

* its ``__launch_bounds__`` is the table's largest block, with
  ``launch::kMinBlocksPerSm`` (a walk of csrc/**/*.cu finds every
  ``__global__`` function and its bounds; the PTX shows what was compiled);
* registers x the largest block <= 65,536 (a warp's registers allocated in
  units of 256): the launch cannot fail with too many resources requested
  (sample_kernel<F32, true> took 130 registers on sm_80 at 16 warps: C1);
* static + the most dynamic shared memory its launcher asks for <= the
  architecture's opt-in limit (163 KB sm_80, 227 KB sm_90), and kernels
  above 48 KB set cudaFuncAttributeMaxDynamicSharedMemorySize;
* the hot kernels spill nothing and keep no stack frame (block_select_kernel
  kept an 80-byte TermRow there: S3);
* the samplers' PTX has no float multiply or add ptxas could fuse into an
  FMA (--fmad=false: Y2);
* every grid a launcher plans stays within gridDim limits at the extremes
  (C4: the tiled kernel at Q > 4,194,240, the int8 kernel at Q > 524,280).

Skipped, with the reason, only where nvcc is absent.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import cuda_ptxas as cp

pytestmark = pytest.mark.skipif(cp.nvcc() is None, reason="nvcc is not on PATH: the CUDA sources cannot be compiled")

_GLOBAL = re.compile(r"__global__\s+void\s+((?:__launch_bounds__\s*\([^)]*\)\s*)?)(\w+)\s*\(")


def _kernels_in_sources() -> dict[str, tuple[str, str]]:
    """``name -> (file, what stands between __global__ void and the name)``
    for every kernel defined in csrc/**/*.cu."""
    out = {}
    for cu in sorted(cp.CSRC.rglob("*.cu")):
        text = re.sub(r"//[^\n]*", "", cu.read_text())
        for m in _GLOBAL.finditer(text):
            out[m.group(2)] = (str(cu.relative_to(cp.REPO)), m.group(1))
    return out


@pytest.fixture(scope="module")
def table():
    data = cp.launch_table()
    return {k["kernel"]: k for k in data["kernels"]}


@pytest.fixture(scope="module")
def compiled():
    return cp.kernels()


def test_every_kernel_has_launch_bounds_from_its_table(table):
    found = _kernels_in_sources()
    assert found, "the walk found no __global__ function in csrc/"
    missing = [f"{f}: {k}" for k, (f, pre) in found.items() if "__launch_bounds__" not in pre]
    assert not missing, "kernels without __launch_bounds__:\n" + "\n".join(missing)
    weak = [f"{f}: {k}" for k, (f, pre) in found.items() if "kMinBlocksPerSm" not in pre]
    assert not weak, ("__launch_bounds__ without launch::kMinBlocksPerSm (CUDA 13's ptxas then trades registers "
                      "for occupancy and spills):\n" + "\n".join(weak))
    assert set(found) == set(table), (f"kernels without a launch table entry: {sorted(set(found) - set(table))}; "
                                      f"table entries without a kernel: {sorted(set(table) - set(found))}")


def _problems(k: cp.Kernel, spec: dict) -> list[str]:
    out = []
    if k.maxntid != spec["max_threads"]:
        out.append(f"__launch_bounds__ {k.maxntid} threads, the table says {spec['max_threads']}")
    if k.minnctapersm != 1:
        out.append(f"minimum blocks an SM {k.minnctapersm} (expected launch::kMinBlocksPerSm = 1)")
    regs = cp.block_registers(k.registers, spec["max_threads"])
    if regs > cp.REGISTERS_PER_BLOCK:
        out.append(f"{k.registers} registers x {spec['max_threads']} threads = {regs} > {cp.REGISTERS_PER_BLOCK}: "
                   "the launch fails (cudaErrorLaunchOutOfResources)")
    smem = k.static_smem + spec["max_dynamic_smem"]
    if smem > cp.SMEM_OPTIN[k.arch]:
        out.append(f"{k.static_smem} B static + {spec['max_dynamic_smem']} B dynamic shared memory > "
                   f"{cp.SMEM_OPTIN[k.arch]} B")
    if spec["hot"] and (k.spill_stores or k.spill_loads or k.stack):
        out.append(f"a hot kernel spills ({k.spill_stores} B stores, {k.spill_loads} B loads, {k.stack} B stack)")
    return out


@pytest.mark.parametrize("arch", cp.ARCHS)
def test_every_kernel_fits_the_architecture(compiled, table, arch):
    mine = [k for k in compiled if k.arch == arch]
    assert len(mine) >= 40, f"only {len(mine)} kernel instantiations compiled for sm_{arch}"
    bad = []
    for k in mine:
        name = k.name_in(table)
        if name is None:
            bad.append(f"{k.source}: {k.mangled}: no launch table entry")
            continue
        bad += [f"{k.source}: sm_{arch} {name} ({k.mangled[-60:]}): {p}" for p in _problems(k, table[name])]
    assert not bad, "\n".join(bad)


def test_large_shared_memory_is_opted_in(table):
    found = _kernels_in_sources()
    for name, spec in table.items():
        if spec["max_dynamic_smem"] > cp.SMEM_DEFAULT:
            text = (cp.REPO / found[name][0]).read_text()
            assert "cudaFuncAttributeMaxDynamicSharedMemorySize" in text and name in text, name


def test_the_samplers_fuse_only_where_the_code_says(compiled):
    """--fmad=false for csrc/sampling/cuda/*.cu: every f32 multiply and add
    of the samplers' PTX carries its rounding (.rn), so neither nvcc nor
    ptxas contracts p * r + c (the softmax's exp polynomial) into an FMA the
    CPU build (-ffp-contract=off) does not make; only the source's fmaf
    (the dot products, in the CPU's order) are FMAs."""
    samplers = [k for k in compiled if k.source.startswith("csrc/sampling/cuda/")]
    assert samplers
    fused = sorted({f"{k.source} sm_{k.arch}: {k.fusable} ops" for k in samplers if k.fusable})
    assert not fused, "sampler PTX with fusable float ops (compile with --fmad=false):\n" + "\n".join(fused)
    flags, exact, globs = cp.build_flags()
    assert "--fmad=false" in exact and "csrc/sampling/cuda/*.cu" in globs


# ------------------------------------------------------------------ the grids


def _check_chunks(plan: dict, gx_max: int, total_y: int) -> None:
    launches = plan["launches"]
    assert launches and all(1 <= g["y"] <= 65535 and 1 <= g["x"] <= gx_max for g in launches), launches
    assert [g["y0"] for g in launches] == [sum(g["y"] for g in launches[:i]) for i in range(len(launches))]
    assert sum(g["y"] for g in launches) == total_y


#: 2-d grids whose y is checked where it is computed (file, y expression): why it stays within 65,535.
CHECKED_Y = {
    ("csrc/topn/cuda/topn_mma.cu", "unsigned(groups)"): "scan_grid (topn_launch.h) refuses more groups",
    ("csrc/topn/cuda/topn_block_select.cu", "unsigned(tile.Qt)"): "topn_block_select_cuda refuses Qt > 65,535",
}
_DIM3 = re.compile(r"\bdim3\s*\w*\s*\(")


def _arguments(text: str, open_at: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose ``(`` is at ``open_at``."""
    depth, args, cur = 0, [], ""
    for c in text[open_at:]:
        if c == "(":
            depth += 1
            if depth == 1:
                continue
        elif c == ")":
            depth -= 1
            if depth == 0:
                return args + [cur.strip()]
        elif c == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
            continue
        cur += c
    return args


def _grids_in_sources() -> list[tuple[str, str]]:
    """(file, y expression) of every 2-d grid of csrc/*/cuda/*.cu."""
    out = []
    for cu in sorted(cp.CSRC.glob("*/cuda/*.cu")):
        text = re.sub(r"//[^\n]*", "", cu.read_text())
        for m in _DIM3.finditer(text):
            args = _arguments(text, m.end() - 1)
            if len(args) >= 2:
                out.append((str(cu.relative_to(cp.REPO)), args[1]))
    return out


def test_every_2d_grid_takes_its_y_from_a_plan():
    """C4: gridDim.y may not exceed 65,535. Every 2-d grid's y is a plan's
    (``g.y`` of launch::y_chunks, which splits wider grids over launches) or
    is refused above the limit where it is computed (CHECKED_Y)."""
    grids = _grids_in_sources()
    assert grids
    bad = [f"{f}: gridDim.y = {y}" for f, y in grids if "g.y" not in y and (f, y) not in CHECKED_Y]
    assert not bad, "2-d grids whose y nothing bounds:\n" + "\n".join(bad)


@pytest.mark.parametrize("Q", [1, 64, 65, 4_194_240, 4_194_241, 10_000_000])
def test_the_tiled_kernel_splits_query_tiles_over_launches(Q):
    """C4: ceil(Q / 64) query tiles in gridDim.y overflowed 65,535 above
    Q = 4,194,240; the plan now covers every tile in launches of <= 65,535."""
    rows = 262_144
    _check_chunks(cp.launch_table("score", str(Q), str(rows)), -(-rows // 64), -(-Q // 64))


@pytest.mark.parametrize("Q", [1, 2, 3, 8, 9, 524_280, 524_281, 2_000_000])
def test_the_int8_search_splits_query_groups_over_launches(Q):
    for k, group in ((100, 1 if Q == 1 else 2 if Q == 2 else 8 if Q <= 8 else 16), (1024, 8 if Q > 2 else Q)):
        got = cp.launch_table("int8", str(Q), "1000000", "132", str(k), "768")
        assert got["group"] == group and got["mma"] == (Q > 2), (Q, k, got)
        _check_chunks({"launches": got["plan"]}, 2**31 - 1, -(-Q // group))


@pytest.mark.parametrize("arch", cp.ARCHS)
def test_every_int8_configuration_fits(table, arch):
    """Every configuration the int8 search's launcher can pick (Q from 1 to
    many, k from 0 (no filter) to 1,024, widths 16 to 1,024) asks for no
    more shared memory than its table entry (which fits the architecture:
    test_every_kernel_fits_the_architecture) and has an instantiation
    (1 to 4 chunks a lane or warp); wider codes are refused."""
    optin = cp.SMEM_OPTIN[arch]
    for Q in (1, 2, 3, 8, 9, 16, 17, 512):
        for k in (0, 1, 100, 256, 257, 1024):
            for width in (16, 48, 64, 80, 256, 512, 768, 1024):
                c = cp.launch_table("int8", str(Q), "1000003", "132", str(k), str(width))
                assert 1 <= c["chunks"] <= 4 and c["smem"] <= table[c["kernel"]]["max_dynamic_smem"] <= optin, (Q, k, c)
                assert all(1 <= g["x"] <= -(-1000003 // 32) and 1 <= g["y"] <= 65535 for g in c["plan"]), (Q, k, c)
    assert "error" in cp.launch_table("int8", "3", "10", "132", "10", "1040")


@pytest.mark.parametrize("arch", cp.ARCHS)
def test_every_scan_configuration_fits(table, arch):
    """Every configuration the scan's launcher can pick (terms 1-3, k up to
    its limit, d up to 4,096, Q from 1 to its limit) fits the opt-in shared
    memory and the grid; where none fits, the launcher says so (nt = 0) and
    the call goes to the tiled kernel."""
    optin = cp.SMEM_OPTIN[arch]
    cases = [(23_500_000, Q, k, terms, d, optin, 132) for terms in (1, 2, 3) for k in (1, 100, 128, 129, 256)
             for d in (8, 64, 768, 1024, 2048, 4096) for Q in (1, 8, 9, 17, 33, 512, 524_280)]
    got = cp.launch_table("scans", stdin="".join(" ".join(map(str, c)) + "\n" for c in cases))
    assert len(got) == len(cases)
    assert got[cases.index((23_500_000, 1, 100, 1, 768, optin, 132))] == cp.launch_table(
        "scan", "23500000", "1", "100", "1", "768", str(optin), "132")
    seen = set()
    for case, c in zip(cases, got):
        if c["nt"] == 0:
            continue
        seen.add(c["nt"])
        assert c["smem"] <= min(optin, table["scan_kernel"]["max_dynamic_smem"]), case
        assert 1 <= c["groups"] <= 65535 and 1 <= c["S"] <= 2**31 - 1, case
        assert c["slice"] * c["S"] >= 23_500_000, case
    assert seen == {1, 2, 4}


def test_the_sampler_plans_fit(table):
    for B, n, N in [(1, 1, 1), (10_000, 100, 9), (3, 300, 16), (2, 5000, 40), (10**9, 1, 1)]:
        p = cp.launch_table("sample", str(B), str(n), str(N))
        assert 32 * p["warps"] <= table["sample_kernel"]["max_threads"] and p["chunk"] <= 2**31 - 1
        assert p["chunk"] * p["per_block_bytes"] <= max(256 << 20, p["per_block_bytes"])
    for dt in (0, 1, 2):
        for n in (1, 16, 100, 128):
            assert cp.launch_table("gram", str(dt), str(n))["smem"] <= table["gram_kernel"]["max_dynamic_smem"]
    # S7: the float32 register tile covers npad rows and no more than the next power of two of 16-row groups
    for n, tile in ((1, 1), (9, 1), (16, 1), (17, 2), (32, 2), (33, 4), (64, 4), (65, 8), (100, 8), (128, 8)):
        assert cp.launch_table("gram", "0", str(n))["f32_tile"] == tile, n


def test_the_check_reads_the_builds_flags():
    flags, _, _ = cp.build_flags()
    assert {"-O3", "--expt-relaxed-constexpr"} <= set(flags)
    text = Path(cp.CMAKE).read_text()
    assert "${RCN_CUDA_FLAGS}" in text and "${RCN_CUDA_EXACT_FLAGS}" in text
