"""Relevance-based subset sampling (ReConnect eqs. 4-6): the public op.

Backends in priority order: ``cuda`` (rcn_fast._cuda, CUDA tensors),
``native`` (rcn_fast._C, CPU arrays), ``torch`` (the reference in torch ops,
any device of a torch tensor), ``numpy`` (the reference,
:mod:`rcn_fast.sampling.reference`, CPU). Pick one with ``backend=`` or
``RCN_FAST_BACKEND`` (e.g. ``RCN_FAST_BACKEND=sample_subsets=numpy``).
For CUDA tensors a CUDA sampler (the warp sampler, or the Gram sampler of
csrc/sampling/sampling_gram.h) is picked only for the dtypes and sizes where
it was measured at least as fast as the torch backend on the same GPU
(:mod:`rcn_fast._crossovers`); elsewhere torch serves.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from rcn_fast import _arrays as A
from rcn_fast import _crossovers, _dispatch, _native
from rcn_fast.sampling.reference import sample_subsets_reference
from rcn_fast._validate import is_integral, is_real

FIRST_MODES = ("uniform", "relevance")
_F32_MAX = float(np.finfo(np.float32).max)


def sample_subsets(
    query_emb: Any,
    cand_emb: Any,
    num_subsets: int,
    subset_size: int,
    *,
    tau: float = 1.0,
    seed: int = 0,
    keys: Any = None,
    valid: Any = None,
    first: str = "uniform",
    backend: str | None = None,
    return_logprobs: bool = False,
) -> Any:
    """Draw ``num_subsets`` subsets of ``subset_size`` candidates per question.

    For each question and subset, the first document is drawn uniformly
    (``first="uniform"``) or from ``softmax(dot(e_q, e_j) / tau)``
    (``first="relevance"``); every next one from
    ``softmax((dot(mean of the chosen, e_j) + dot(e_q, e_j)) / tau)`` over the
    candidates not chosen yet. Subsets are independent (they may overlap);
    no document repeats inside a subset.

    Parameters
    ----------
    query_emb : array [B, d]
        float32, float16 or bfloat16 (numpy bfloat16 via ``ml_dtypes``);
        numpy array or torch tensor.
    cand_emb : array [B, n, d]
        Each question's candidates, padded to ``n``; same library and device
        as ``query_emb``, any of the three float dtypes.
    num_subsets, subset_size : int
        ``N >= 1`` subsets of ``K >= 1`` documents per question.
    tau : float, default 1.0
        Softmax temperature, finite and > 0.
    seed : int, default 0
        In ``[0, 2**64)``.
    keys : int array [B], optional
        Random stream id of each question (default: the row index). A
        question's subsets depend only on its inputs, ``seed`` and key, not
        on the batch around it, its position or the thread count: pass a
        stable id per question to make results independent of batching.
    valid : array, optional
        Either int [B] (the first ``valid[b]`` candidates of question ``b``
        are real) or bool [B, n] (a mask). Default: all ``n`` are real.
    first : {"uniform", "relevance"}
        How the first document of a subset is drawn.
    backend : str, optional
        Force ``"cuda"``, ``"native"``, ``"torch"`` or ``"numpy"``.
    return_logprobs : bool, default False
        Also return the log-probability of every draw.

    Returns
    -------
    ids : int64 [B, num_subsets, subset_size]
        Candidate indices (into each question's ``n``) in draw order. A
        question with fewer than ``subset_size`` valid candidates gets all of
        them in every subset, padded with ``-1``.
    logprobs : float32 [B, num_subsets, subset_size]
        Only with ``return_logprobs``. ``log p`` of each draw under the model
        (0 for padding), so ``logprobs.sum(-1)`` is the log-probability of
        the ordered subset.

    Raises
    ------
    TypeError
        Wrong array type or dtype, non-integer sizes or seed.
    ValueError
        Shape mismatches, ``subset_size < 1``, ``tau <= 0``, NaN/inf in the
        embeddings (checked on the valid candidates), overflowing scores.

    Notes
    -----
    Random numbers come from Philox4x32-10 keyed by ``seed`` with counter
    ``(key, subset, step)``. Scores accumulate in float32. All backends
    implement the same procedure; they agree on the ids except when a draw
    falls within rounding error of a CDF boundary.

    Examples
    --------
    >>> import numpy as np, rcn_fast
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 8)).astype(np.float32)
    >>> c = rng.standard_normal((2, 6, 8)).astype(np.float32)
    >>> ids = rcn_fast.sample_subsets(q, c, num_subsets=3, subset_size=4, seed=1)
    >>> ids.shape
    (2, 3, 4)
    """
    query_emb = A.as_array(query_emb, "query_emb")
    cand_emb = A.as_array(cand_emb, "cand_emb")
    A.check_rank(query_emb, 2, "query_emb", "[B, d]")
    A.check_rank(cand_emb, 3, "cand_emb", "[B, n, d]")
    A.check_float_dtype(query_emb, "query_emb")
    ct = A.check_float_dtype(cand_emb, "cand_emb")
    A.check_same_place(cand_emb, query_emb, "cand_emb", "query_emb")
    B, n, d = (int(x) for x in cand_emb.shape)
    if tuple(query_emb.shape) != (B, d):
        raise ValueError(
            f"query_emb: expected shape [B, d] = [{B}, {d}] to match cand_emb {list(cand_emb.shape)}, "
            f"got {list(query_emb.shape)}"
        )
    if d < 1:
        raise ValueError("cand_emb: expected d >= 1 embedding columns, got 0")
    N = check_count(num_subsets, "num_subsets", 1)
    K = check_count(subset_size, "subset_size", 1)
    tau = _check_tau(tau)
    seed = check_seed(seed)
    if first not in FIRST_MODES:
        raise ValueError(f"first: expected one of {list(FIRST_MODES)}, got {first!r}")
    keys = check_stream_keys(keys, B)
    mask = check_valid_mask(valid, B, n)
    q32 = _query_float32(query_emb)
    if B == 0 or n == 0:  # nothing to draw: empty, or every slot padding
        ids = np.full((B, N, K), -1, dtype=np.int64)
        logp = np.zeros((B, N, K), dtype=np.float32)
        ids, logp = A.from_numpy_like(cand_emb, ids), A.from_numpy_like(cand_emb, logp)
        return (ids, logp) if return_logprobs else ids
    ctx = {
        "library": A.library(cand_emb),
        "device": A.device_of(cand_emb),
        "dtype": ct,
        "B": B,
        "n": n,
        "d": d,
        "N": N,
        "K": K,
    }
    if ctx["device"] == "cuda":  # only records of this GPU count (rcn_fast._crossovers)
        ctx.update(_crossovers.gpu_identity(cand_emb.device))
    ids, logp = SAMPLE_SUBSETS(
        ctx,
        backend,
        query=q32,
        cand=cand_emb,
        num_subsets=N,
        subset_size=K,
        tau=tau,
        seed=seed,
        keys=keys,
        mask=mask,
        first_relevance=first == "relevance",
    )
    return (ids, logp) if return_logprobs else ids


# ---------------------------------------------------------------- argument checks


def check_count(x: Any, name: str, minimum: int) -> int:
    """``x`` as an int in ``[minimum, 2**31)``; TypeError / ValueError naming ``name``."""
    if not is_integral(x):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}")
    if int(x) < minimum:
        raise ValueError(f"{name}: expected {name} >= {minimum}, got {int(x)}")
    if int(x) >= 2**31:
        raise ValueError(f"{name}: expected {name} < 2**31, got {int(x)}")
    return int(x)


def _check_tau(tau: Any) -> float:
    if not is_real(tau):
        raise TypeError(f"tau: expected a float, got {type(tau).__name__}")
    tau = float(tau)
    if not math.isfinite(tau) or tau <= 0.0:
        raise ValueError(f"tau: expected a finite temperature > 0, got {tau}")
    if 1.0 / tau > _F32_MAX:
        raise ValueError(f"tau: expected tau >= {1.0 / _F32_MAX:.3g} (1/tau must fit float32), got {tau}")
    return tau


def check_seed(seed: Any) -> int:
    """``seed`` as an int in ``[0, 2**64)`` (the Philox key)."""
    if not is_integral(seed):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed: expected 0 <= seed < 2**64, got {int(seed)}")
    return int(seed)


def check_stream_keys(keys: Any, B: int) -> np.ndarray:
    """Per-question stream ids: int64 [B] (``arange(B)`` for None; uint64 viewed as int64)."""
    if keys is None:
        return np.arange(B, dtype=np.int64)
    k = A.to_numpy(keys) if A.is_torch(keys) else np.asarray(keys)
    if k.dtype.kind not in "iu":
        raise TypeError(f"keys: expected an integer array [B], got dtype {k.dtype}")
    if k.shape != (B,):
        raise ValueError(f"keys: expected shape [{B}] (one stream id per question), got {list(k.shape)}")
    if k.dtype == np.uint64:
        return np.ascontiguousarray(k).view(np.int64)
    return np.ascontiguousarray(k, dtype=np.int64)


def check_valid_mask(valid: Any, B: int, n: int) -> np.ndarray | None:
    """None (all valid) or a contiguous uint8 [B, n] mask."""
    if valid is None:
        return None
    v = A.to_numpy(valid) if A.is_torch(valid) else np.asarray(valid)
    if v.dtype == bool:
        if v.shape != (B, n):
            raise ValueError(f"valid: expected a bool mask of shape [{B}, {n}], got {list(v.shape)}")
        return np.ascontiguousarray(v, dtype=np.uint8)
    if v.dtype.kind in "iu":
        if v.shape != (B,):
            raise ValueError(f"valid: expected int counts of shape [{B}], got {list(v.shape)}")
        if (v < 0).any() or (v > n).any():
            raise ValueError(f"valid: expected counts in [0, {n}], got min {v.min()} max {v.max()}")
        return (np.arange(n)[None, :] < v[:, None]).astype(np.uint8)
    raise TypeError(f"valid: expected int counts [B] or a bool mask [B, n], got dtype {v.dtype}")


def _query_float32(query: Any) -> Any:
    """float32 copy/view of the queries (small), checked for NaN/inf."""
    if A.is_torch(query):
        q = query.float()
        if not bool(q.isfinite().all()):
            raise ValueError("query_emb: expected finite values, found NaN or inf")
        return q
    q = np.asarray(query, dtype=np.float32)
    if not np.isfinite(q).all():
        raise ValueError("query_emb: expected finite values, found NaN or inf")
    return q


# ---------------------------------------------------------------- backends


def _check_cuda(ctx: Mapping[str, Any]) -> str | None:
    return _dispatch.check_cuda(ctx, "sample_subsets", "rcn_fast._cuda was built without the sampler")[1]


def cuda_kernel_for(cand: Any) -> str:
    """The CUDA sampler (a key of ``rcn_fast._crossovers.KERNELS["sample_subsets"]``)
    for candidates ``cand`` [B, n, d]: the fastest one a recorded run
    measured at least as fast as torch there; else (``backend="cuda"``) the
    Gram sampler where it can serve (n <= 128), the warp sampler otherwise."""
    mod, _ = _native.cuda_module()
    gram = mod is not None and hasattr(mod, "SAMPLER_GRAM_MAX_N") and int(cand.shape[1]) <= mod.SAMPLER_GRAM_MAX_N
    kernel, _ = _crossovers.kernel_choice("sample_subsets", {"dtype": A.dtype_name(cand), "B": int(cand.shape[0]),
                                                             **_crossovers.gpu_identity(cand.device)})
    if kernel is not None and (kernel != "sample_subsets_gram" or gram):
        return kernel
    return "sample_subsets_gram" if gram else "sample_subsets"


def run_cuda_kernel(query: Any, cand: Any, num_subsets: int, subset_size: int, tau: float, seed: int,
                    keys: np.ndarray, mask: np.ndarray | None, first_relevance: bool,
                    kernel: str = "sample_subsets") -> tuple[Any, Any]:
    """The CUDA sampler ``kernel`` ("sample_subsets": a warp a subset;
    "sample_subsets_gram": a block a question) on checked inputs."""
    if kernel not in ("sample_subsets", "sample_subsets_gram"):
        raise ValueError(f"kernel: expected 'sample_subsets' or 'sample_subsets_gram', got {kernel!r}")
    mod, _ = _native.cuda_module()
    torch = A.require("torch", "pip install torch")
    dev = cand.device
    cand = A.inner_contiguous(cand)
    query = query.contiguous()
    keys_t = torch.from_numpy(keys).to(dev)
    mask_t = None if mask is None else torch.from_numpy(mask).to(dev)
    B = cand.shape[0]
    ids = torch.empty((B, num_subsets, subset_size), dtype=torch.int64, device=dev)
    logp = torch.empty((B, num_subsets, subset_size), dtype=torch.float32, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    with torch.cuda.device(dev):
        mod.sample_subsets(query, cand, mask_t, keys_t, tau, seed, first_relevance, ids, logp, stream,
                           kernel == "sample_subsets_gram")
    return ids, logp


def _run_cuda(query: Any, cand: Any, num_subsets: int, subset_size: int, tau: float, seed: int,
              keys: np.ndarray, mask: np.ndarray | None, first_relevance: bool) -> tuple[Any, Any]:
    return run_cuda_kernel(query, cand, num_subsets, subset_size, tau, seed, keys, mask, first_relevance,
                           cuda_kernel_for(cand))


def _check_native(ctx: Mapping[str, Any]) -> str | None:
    return _dispatch.check_native(ctx, "sample_subsets",
                                  "rcn_fast._C was built without the sampler; reinstall with `pip install .`")


def _run_native(query: Any, cand: Any, num_subsets: int, subset_size: int, tau: float, seed: int,
                keys: np.ndarray, mask: np.ndarray | None, first_relevance: bool,
                num_threads: int = 0) -> tuple[Any, Any]:
    mod, _ = _native.cpu_module()
    cand = A.inner_contiguous(cand)
    query = A.inner_contiguous(query)
    bf16_view = False
    if not A.is_torch(cand) and A.dtype_name(cand) == "bfloat16":
        cand, bf16_view = cand.view(np.uint16), True
    B = cand.shape[0]
    ids = A.empty_like_lib(cand, (B, num_subsets, subset_size), "int64")
    logp = A.empty_like_lib(cand, (B, num_subsets, subset_size), "float32")
    mod.sample_subsets(query, cand, mask, keys, tau, seed, first_relevance, ids, logp,
                       num_threads, bf16_view)
    return ids, logp


def _run_torch(query: Any, cand: Any, num_subsets: int, subset_size: int, tau: float, seed: int,
               keys: np.ndarray, mask: np.ndarray | None, first_relevance: bool) -> tuple[Any, Any]:
    from rcn_fast.sampling.torch_backend import sample_subsets_torch

    return sample_subsets_torch(query, cand, num_subsets, subset_size, tau, seed, keys, mask,
                                first_relevance)


def _run_numpy(query: Any, cand: Any, num_subsets: int, subset_size: int, tau: float, seed: int,
               keys: np.ndarray, mask: np.ndarray | None, first_relevance: bool) -> tuple[Any, Any]:
    ids, logp = sample_subsets_reference(
        A.to_numpy(query), A.to_numpy(cand), num_subsets, subset_size, tau=tau, seed=seed,
        keys=keys, mask=None if mask is None else mask.astype(bool),
        first="relevance" if first_relevance else "uniform",
    )
    return A.from_numpy_like(cand, ids), A.from_numpy_like(cand, logp)


SAMPLE_SUBSETS = _dispatch.register_kernel_op(
    "sample_subsets",
    cuda=(_check_cuda, _run_cuda, "fused CUDA samplers: a warp a subset, or a block a question from its Gram "
                                  "matrix"),
    native=(_check_native, _run_native, "fused CPU sampler (rcn_fast._C)"),
    torch=(_run_torch, "torch ops on the inputs' device"),
    numpy=(_run_numpy, "plain numpy reference"),
)
