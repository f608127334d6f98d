"""``python -m rcn_fast.search demo``: exact top-n search on a synthetic
corpus, rcn_fast against plain numpy on the same data, plus what was built.

Options: ``--n`` corpus rows (default 200000), ``--d`` width (768), ``--k``
(100), ``--queries`` (1 32), ``--dtype`` (float32 | float16).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _time(fn, repeat: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def demo(n: int, d: int, k: int, queries: list[int], dtype: str) -> None:
    import rcn_fast
    from rcn_fast.info import build_info

    info = build_info()
    nat = info["native"]
    print(f"rcn_fast {info['version']}: native SIMD {nat.get('simd_active', '-')}, "
          f"threads {nat.get('num_threads', '-')}, CUDA usable {info['cuda']['gpu_usable']}")
    rng = np.random.default_rng(0)
    corpus = rng.standard_normal((n, d), dtype=np.float32).astype(dtype)
    print(f"corpus: {n} x {d} {dtype} ({corpus.nbytes / 1e9:.2f} GB), k = {k}")
    for q in queries:
        qs = rng.standard_normal((q, d), dtype=np.float32)
        t_fast = _time(lambda: rcn_fast.topn(qs, corpus, k))
        c32 = corpus if dtype == "float32" else None

        def numpy_way() -> None:
            block = c32 if c32 is not None else corpus.astype(np.float32)
            s = qs @ block.T
            top = np.argpartition(-s, k - 1, axis=1)[:, :k]
            np.take_along_axis(s, top, 1).argsort(1)

        t_np = _time(numpy_way, repeat=1)
        s, i = rcn_fast.topn(qs, corpus, k)
        print(f"  Q={q:<4} rcn_fast {t_fast * 1e3:8.1f} ms ({corpus.nbytes / t_fast / 1e9:5.1f} GB/s, "
              f"{2 * q * n * d / t_fast / 1e9:6.1f} GFLOP/s)   numpy {t_np * 1e3:8.1f} ms   "
              f"x{t_np / t_fast:.1f}   best id {int(i[0, 0])} score {float(s[0, 0]):.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rcn_fast.search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="time exact search on a synthetic corpus")
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--queries", type=int, nargs="+", default=[1, 32])
    p.add_argument("--dtype", choices=["float32", "float16"], default="float16")
    args = parser.parse_args(argv)
    for name in ("n", "d", "k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive integer")
    demo(args.n, args.d, args.k, args.queries, args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
