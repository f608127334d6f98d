"""Compile the CUDA sources without a GPU and read what the compiler says
about every kernel (issue 55 item 2, the resource check): each ``.cu`` of
csrc/ is compiled to PTX for one architecture with the build's own flags
(read from CMakeLists.txt), then the PTX goes through ``ptxas -v``. From
that come, per kernel instantiation: registers, spill stores and loads,
stack frame, static shared memory (ptxas), the ``.maxntid`` its
``__launch_bounds__`` wrote and the float multiplies and adds ptxas may
still fuse into FMAs (the PTX).

Results are cached per (source digest, architecture) in a folder under the
system temp directory (``RCN_FAST_PTXAS_CACHE`` overrides it), so the suite
compiles a source again only when it, a header it includes, the flags or
nvcc change. The launch table (csrc/*/cuda/*_launch.h) is read by compiling
and running tests/cuda_launch_table.cpp on the host.

Used by tests/test_cuda_resources.py; ``python -m tests.cuda_ptxas`` prints
the table of every kernel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CSRC = REPO / "csrc"
CMAKE = REPO / "CMakeLists.txt"
DUMPER = Path(__file__).resolve().with_name("cuda_launch_table.cpp")
ARCHS = ("80", "90")
#: Registers a block may hold, and the allocation granularity (a warp takes
#: registers in units of 256: a thread's count rounded up to 8), sm_80 / sm_90.
REGISTERS_PER_BLOCK = 65536
REGISTER_UNIT = 8
#: Shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin):
#: A100 163 KB, H100/H200 227 KB; without the opt-in, 48 KB.
SMEM_OPTIN = {"80": 166912, "90": 232448}
SMEM_DEFAULT = 49152
#: Bump when what a cache entry holds changes.
CACHE_FORMAT = "2"


def nvcc() -> str | None:
    """The nvcc on PATH (or ``$CUDACXX``), None when there is none."""
    return os.environ.get("CUDACXX") or shutil.which("nvcc")


def ptxas(nvcc_path: str) -> str | None:
    """ptxas beside nvcc, on PATH, or in the toolkit ($CUDA_HOME, /usr/local/cuda)."""
    for cand in (Path(nvcc_path).resolve().parent / "ptxas", Path(nvcc_path).parent / "ptxas"):
        if cand.is_file():
            return str(cand)
    found = shutil.which("ptxas")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "ptxas").is_file():
            return str(Path(home) / "bin" / "ptxas")
    return None


# ------------------------------------------------------------------ the build's flags
def _cmake_list(text: str, name: str) -> list[str]:
    m = re.search(r"set\(\s*" + name + r"\s+([^)]*)\)", text)
    if m is None:
        raise AssertionError(f"CMakeLists.txt: no set({name} ...) (the resource check reads the CUDA flags from it)")
    return m.group(1).split()


def build_flags() -> tuple[list[str], list[str], list[str]]:
    """``(flags of every .cu, extra flags, the .cu globs that get them)`` as
    CMakeLists.txt sets them: RCN_CUDA_FLAGS, RCN_CUDA_EXACT_FLAGS and the
    globs of RCN_CUDA_EXACT_SOURCES."""
    text = CMAKE.read_text()
    flags = _cmake_list(text, "RCN_CUDA_FLAGS")
    exact = _cmake_list(text, "RCN_CUDA_EXACT_FLAGS")
    m = re.search(r"file\(GLOB\s+RCN_CUDA_EXACT_SOURCES\s+CONFIGURE_DEPENDS\s+([^)]*)\)", text)
    globs = [g.strip('"').replace("${CMAKE_CURRENT_SOURCE_DIR}/", "") for g in m.group(1).split()] if m else []
    return flags, exact, globs


def flags_for(source: Path) -> list[str]:
    flags, exact, globs = build_flags()
    rel = source.resolve().relative_to(REPO)
    if any(rel.match(g) for g in globs):
        flags = flags + exact
    return flags


def sources() -> list[Path]:
    """Every .cu the CUDA module compiles (csrc/<domain>/cuda/*.cu)."""
    return sorted(CSRC.glob("*/cuda/*.cu"))


# ------------------------------------------------------------------ digest and cache
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _includes(path: Path, seen: set[Path]) -> None:
    if path in seen:
        return
    seen.add(path)
    for inc in _INCLUDE.findall(path.read_text()):
        for base in (path.parent, CSRC):
            cand = (base / inc).resolve()
            if cand.is_file():
                _includes(cand, seen)
                break


def digest(source: Path, arch: str, tool: str) -> str:
    """sha256 of the source, every csrc header it includes (transitively),
    the flags, the architecture and nvcc's version."""
    files: set[Path] = set()
    _includes(source.resolve(), files)
    h = hashlib.sha256(CACHE_FORMAT.encode())
    h.update(tool.encode())
    h.update(arch.encode())
    h.update(" ".join(flags_for(source)).encode())
    for f in sorted(files):
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    root = os.environ.get("RCN_FAST_PTXAS_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                 f"rcn_fast_ptxas_{os.getuid()}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _version(tool: str) -> str:
    return subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout.strip()


# ------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class Kernel:
    """One kernel instantiation for one architecture."""

    mangled: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    static_smem: int
    maxntid: int | None  # the __launch_bounds__ in the PTX; None without one
    minnctapersm: int | None  # its minimum blocks an SM; None without
    fusable: int  # f32 mul/add/sub without a rounding mode: ptxas may fuse them into FMAs
    source: str

    def name_in(self, names) -> str | None:
        """The one name of ``names`` this instantiation is (by the mangled
        identifier, ``<length><name>``)."""
        hits = [n for n in names if f"{len(n)}{n}" in self.mangled]
        return hits[0] if len(hits) == 1 else None


_FUNC = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\d+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(log: str) -> dict[str, dict]:
    """Per kernel (mangled name): registers, spills, stack, static smem."""
    out: dict[str, dict] = {}
    cur = None
    for line in log.splitlines():
        m = _FUNC.search(line)
        if m:
            cur = out.setdefault(m.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0,
                                              "static_smem": 0})
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = (int(g) for g in m.groups())
            continue
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            cur["static_smem"] = int(m.group(2) or 0)
    return out


_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(")
_MAXNTID = re.compile(r"\.maxntid\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)")
_MINNCTA = re.compile(r"\.minnctapersm\s+(\d+)")
_FUSABLE = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:mul|add|sub)\.f32\s", re.M)


def parse_ptx(ptx: str) -> dict[str, dict]:
    """Per kernel entry: its ``.maxntid`` (threads; None) and how many f32
    multiplies/adds carry no rounding mode (ptxas may fuse those)."""
    out: dict[str, dict] = {}
    for m in _ENTRY.finditer(ptx):
        name = m.group(1)
        open_at = ptx.index("{", m.end())
        head = ptx[m.end():open_at]
        depth, i = 0, open_at
        while True:
            c = ptx[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
            if depth == 0:
                break
        body = ptx[open_at:i]
        mx, mn = _MAXNTID.search(head), _MINNCTA.search(head)
        out[name] = {"maxntid": int(mx.group(1)) * int(mx.group(2)) * int(mx.group(3)) if mx else None,
                     "minnctapersm": int(mn.group(1)) if mn else None, "fusable": len(_FUSABLE.findall(body))}
    return out


# ------------------------------------------------------------------ compiling
def compile_source(source: Path, arch: str, tool: str, work: Path) -> dict:
    """PTX facts and the ptxas log of one source for one architecture
    (cached)."""
    version = _version(tool)
    key = digest(source, arch, version)
    cached = cache_dir() / f"{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    ptx = work / f"{source.stem}.sm_{arch}.ptx"
    cmd = [tool, "-ptx", str(source), "-o", str(ptx), f"-I{CSRC}", "-std=c++17",
           f"-arch=compute_{arch}"] + flags_for(source)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"nvcc failed on {source.relative_to(REPO)} for sm_{arch}:\n{res.stderr[-4000:]}")
    asm = ptxas(tool)
    if asm is None:
        raise AssertionError("ptxas was not found beside nvcc")
    opt = ["-lineinfo"] if "-lineinfo" in flags_for(source) else []
    res2 = subprocess.run([asm, "-v", f"-arch=sm_{arch}", "-O3", *opt, str(ptx), "-o", str(ptx.with_suffix(".cubin"))],
                          capture_output=True, text=True)
    if res2.returncode != 0:
        raise AssertionError(f"ptxas failed on {source.relative_to(REPO)} for sm_{arch}:\n{res2.stderr[-4000:]}")
    data = {"source": str(source.relative_to(REPO)), "arch": arch, "command": " ".join(cmd),
            "ptxas": parse_ptxas(res2.stdout + res2.stderr), "ptx": parse_ptx(ptx.read_text())}
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, cached)
    return data


def kernels(archs=ARCHS, jobs: int | None = None) -> list[Kernel]:
    """Every kernel instantiation of every .cu for every architecture."""
    tool = nvcc()
    if tool is None:
        raise RuntimeError("nvcc is not on PATH")
    jobs = jobs or max(1, min(4, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="rcn_ptxas_") as tmp:
        work = Path(tmp)
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda sa: compile_source(sa[0], sa[1], tool, work),
                                    [(s, a) for s in sources() for a in archs]))
    out = []
    for data in results:
        for name, r in data["ptxas"].items():
            p = data["ptx"].get(name, {})
            out.append(Kernel(name, data["arch"], r["registers"], r["spill_stores"], r["spill_loads"], r["stack"],
                              r["static_smem"], p.get("maxntid"), p.get("minnctapersm"), p.get("fusable", 0),
                              data["source"]))
    return out


# ------------------------------------------------------------------ the launch table
def launch_table(*args: str, stdin: str | None = None) -> Any:
    """The launch table (or, with arguments, a launch plan) as
    tests/cuda_launch_table.cpp prints it from the launch headers."""
    tool = nvcc()
    if tool is None:
        raise RuntimeError("nvcc is not on PATH")
    headers: set[Path] = set()
    _includes(DUMPER, headers)
    h = hashlib.sha256(_version(tool).encode())
    for f in sorted(headers):
        h.update(f.read_bytes())
    exe = cache_dir() / f"launch_table_{h.hexdigest()[:24]}"
    if not exe.is_file():
        tmp = exe.with_name(exe.name + f".{os.getpid()}.tmp")
        res = subprocess.run([tool, "-std=c++17", f"-I{CSRC}", "-x", "c++", str(DUMPER), "-o", str(tmp)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise AssertionError(f"tests/cuda_launch_table.cpp does not compile:\n{res.stderr[-4000:]}")
        os.replace(tmp, exe)
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, input=stdin)
    if res.returncode != 0:
        raise AssertionError(f"cuda_launch_table {' '.join(args)}: {res.stderr}")
    return json.loads(res.stdout)


def block_registers(registers: int, threads: int) -> int:
    """Registers a block of ``threads`` threads takes (per-warp allocation in
    units of 256: a thread's registers rounded up to 8)."""
    warps = -(-threads // 32)
    return warps * 32 * (-(-registers // REGISTER_UNIT) * REGISTER_UNIT)


if __name__ == "__main__":
    table = {k["kernel"]: k for k in launch_table()["kernels"]}
    for k in sorted(kernels(), key=lambda k: (k.source, k.arch, k.mangled)):
        name = k.name_in(table) or "?"
        print(f"sm_{k.arch} {name:<22} regs {k.registers:>3} spill {k.spill_stores}/{k.spill_loads} stack "
              f"{k.stack:>3} smem {k.static_smem:>6} maxntid {k.maxntid} fusable {k.fusable}  {k.mangled[:90]}")
