"""``--executor ray``: the evaluation's planned units and shards as Ray tasks.

The driver plans the run as a local run does (:func:`rcn_fast.eval.run.plan.plan`:
tasks, pipelines, checkpoints; nothing heavy loads), then
:class:`RayExecutor` submits one Ray task per planned task x pipeline x
seed that has questions left, or per (task x pipeline x seed, shard) with
``num_shards = S > 1``. Each Ray task runs
:func:`rcn_fast.eval.run.executors.run_slice` in its worker: it plans that
slice alone, as a shard of the run (``shard_id`` set), runs it with the
local executor (loading the configured model itself: an OpenAI-compatible
server at scale), appends to its own checkpoint files in the shared output
folder and writes no report. When every task has finished, the driver
re-reads the planned units' checkpoints and goes on as a local run: every
question is found in the checkpoints, no model is loaded, and the reports
are written exactly as a local run writes them. Nothing calls
:func:`rcn_fast.eval.evaluate` again.

Requirements: the output folder (and the call cache, ``cache_path``) must
be reachable from every worker under the same path (a shared file system on
a multi-machine cluster; see ``cache_journal`` for network file systems),
and the model a spec string every worker can load.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from rcn_fast.eval.config import EvalConfig, EvalError

RAY_HINT = 'pip install "rcn_fast[ray]"'
#: Seconds :func:`check_ray_address` waits for a cluster's head to answer.
PROBE_TIMEOUT_S = 5.0
# HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's
# GCS, or the Ray Client server of a ray:// address) answers with a frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EvalError(f"executor: 'ray' needs the ray package; install it with:\n    {RAY_HINT}") from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT``, ``ray://HOST:PORT`` or
    ``[IPv6]:PORT``; None for addresses Ray resolves itself (``auto``,
    ``local``, no port)."""
    rest = address.strip()
    if "://" in rest:
        rest = rest.split("://", 1)[1]
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str | None, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Check, within about ``timeout`` seconds, that a Ray cluster's head
    answers at ``address`` before joining it (``ray.init`` retries an
    address that refuses or does not speak Ray for many minutes).

    The probe connects to ``HOST:PORT`` and sends the HTTP/2 preface; Ray's
    GCS (and the Ray Client server of a ``ray://`` address) is a gRPC
    server and answers with a frame. ``None``, ``auto``, ``local`` and
    addresses without a port are left to Ray.

    Raises
    ------
    EvalError
        Nothing listens there, the host cannot be reached or resolved, or
        what answers is not a gRPC server; the message names the address
        and how to start a cluster.
    """
    hp = _host_port(address) if isinstance(address, str) else None
    if hp is None:
        return
    host, port = hp
    start = "start one with `ray start --head` and pass the address it prints, or leave --ray-address out for a " \
            "local cluster"
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_H2_PREFACE)
            head = b""
            for _ in range(9):  # a frame header is 9 bytes; a server may send them in pieces
                more = sock.recv(9 - len(head))
                head += more
                if not more or len(head) >= 9:
                    break
    except socket.gaierror as exc:
        raise EvalError(f"ray-address: cannot resolve the host of {address!r} ({exc.strerror or exc}); "
                        f"{start}") from None
    except (socket.timeout, TimeoutError):
        raise EvalError(f"ray-address: no Ray cluster answers at {address!r} (no reply within {timeout:g} s); "
                        f"{start}") from None
    except OSError as exc:
        raise EvalError(f"ray-address: no Ray cluster at {address!r} ({exc.strerror or exc}); {start}") from None
    if len(head) < 9 or head[3] != 0x04:  # not an HTTP/2 SETTINGS frame: some other server
        raise EvalError(f"ray-address: {address!r} answers, but not as a Ray cluster's head (GCS) does; check "
                        f"the port (`ray status` on the head prints the address); {start}")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run_slice(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """Body of one Ray task: one shard of one task x pipeline x seed."""
    from rcn_fast.eval.run.executors import run_slice

    return run_slice(cfg_dict)


def local_config(cfg: EvalConfig) -> EvalConfig:
    """The driver's view of a Ray run: the same run, local and unsharded
    (its plan, its merge of the workers' checkpoints and its reports)."""
    return dataclasses.replace(cfg, executor="local", num_shards=1, shard_id=None)


def slices_of(cfg: EvalConfig, units: list[Any]) -> list[dict[str, Any]]:
    """The sub-runs (as EvalConfig dicts) of the planned ``units`` that have
    questions left: one per task x pipeline x seed, times ``num_shards``
    shards, each with ``executor="local"`` and a ``shard_id`` (a sub-run
    plans and answers every order of ``permute_choices`` of its task x
    pipeline x seed: each is listed once)."""
    from rcn_fast.eval.run.shards import shard_of

    out = Path(cfg.output_path).expanduser()
    slices = []
    threads = cfg.threads if cfg.threads is not None else max(1, int(cfg.ray_num_cpus))
    for u in units:
        if not u.pending:
            continue
        for shard in sorted({shard_of(q.id, cfg.num_shards) for q in u.pending}):
            d = cfg.to_dict()
            d.update(executor="local", tasks=[u.entry], pipelines=[u.pipeline], seeds=[u.seed],
                     num_shards=cfg.num_shards, shard_id=shard, progress=False, plot=False, threads=threads,
                     output_path=str(out))
            if d not in slices:
                slices.append(d)
    return slices


def plan_slices(cfg: EvalConfig) -> list[dict[str, Any]]:
    """The sub-runs of ``cfg`` (planned here) that have questions left (see :func:`slices_of`)."""
    from rcn_fast.eval.run.plan import plan

    base = local_config(cfg)
    return slices_of(cfg, plan(base, Path(cfg.output_path).expanduser()).units)


def _embed_corpus_files(cfg: EvalConfig, out: Path, units: list[Any]) -> None:
    """Embed every corpus given as a file into the output folder before the
    workers start (each worker would otherwise build the same store at
    the same time); stores are only opened by the workers."""
    from rcn_fast.eval.run.loading import Components

    files = [u.corpus for u in units if u.pending and u.corpus is not None and Path(u.corpus).is_file()]
    if files:
        comps = Components(cfg, out)
        for corpus in dict.fromkeys(files):
            comps.retriever(corpus)


class RayExecutor:
    """Runs planned units as Ray tasks (see the module docstring).

    :meth:`check` fails in seconds, before anything is planned: Ray is not
    installed, components were given as objects (workers load them from the
    config's specs), or no Ray head answers at the address
    (:func:`check_ray_address`).
    """

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg

    def check(self, **given: Any) -> None:
        cfg = self.cfg
        objects = [n for n, v in given.items() if v is not None]
        if objects or not isinstance(cfg.model, str):
            raise EvalError(f"executor: 'ray' workers load the model, encoder and corpus from the config's specs; "
                            f"pass them as names or paths, not as objects ({', '.join(objects) or 'model'})")
        ray = _require_ray()
        if not ray.is_initialized():  # before planning, which may embed corpora: fail in seconds
            check_ray_address(cfg.ray_address or os.environ.get("RAY_ADDRESS") or None)

    def run(self, units: list[Any], out: Path) -> None:
        """Run the pending ``units`` (planned with :func:`local_config`) on
        the cluster, then re-read their checkpoints.

        Raises
        ------
        EvalError
            The cluster cannot be reached, or a Ray task failed (its error is
            shown; finished work is kept).
        """
        cfg = self.cfg
        ray = _require_ray()
        t0 = time.time()
        _embed_corpus_files(local_config(cfg), out, units)
        slices = slices_of(cfg, units)
        if not slices:
            return
        address = cfg.ray_address or os.environ.get("RAY_ADDRESS") or None
        started_here = not ray.is_initialized()
        if started_here:
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True)
            except Exception as exc:  # noqa: BLE001 - any failure to reach the cluster is the user's to fix
                raise EvalError(f"ray-address: cannot start or join a Ray cluster at {address or 'a new local one'}: "
                                f"{type(exc).__name__}: {exc}") from None
        try:
            self._wait(ray, slices)
        finally:
            if started_here:
                ray.shutdown()
        _log(f"ray: all tasks finished in {time.time() - t0:.1f} s; writing the reports")
        for u in units:
            if u.pending:
                u.reopen()

    def _wait(self, ray: Any, slices: list[dict[str, Any]]) -> None:
        cfg = self.cfg
        task = ray.remote(_run_slice).options(num_cpus=cfg.ray_num_cpus, num_gpus=cfg.ray_num_gpus, max_retries=0)
        _log(f"ray: {len(slices)} task(s) (task x pipeline x seed"
             + (f" x shard, {cfg.num_shards} shards" if cfg.num_shards > 1 else "") + ") on "
             + f"{ray.cluster_resources().get('CPU', 0):g} CPUs")
        refs = {task.remote(s): s for s in slices}
        failures = []
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            s = refs[ready[0]]
            where = f"{s['tasks'][0]} | {s['pipelines'][0]} | seed {s['seeds'][0]}" + (
                f" | shard {s['shard_id']}" if s.get("shard_id") is not None else "")
            try:
                ray.get(ready[0])
                _log(f"ray: done {where} ({len(refs) - len(pending)}/{len(refs)})")
            except Exception as exc:  # noqa: BLE001 - reported below, the others keep running
                cause = getattr(exc, "cause", None) or exc
                failures.append(f"{where}: {type(cause).__name__}: {cause}")
        if failures:
            raise EvalError("executor: {} Ray task(s) failed (finished questions are saved; run the same "
                            "command again to resume):\n  ".format(len(failures)) + "\n  ".join(failures))


__all__ = ["RayExecutor", "plan_slices", "slices_of", "local_config", "check_ray_address", "RAY_HINT"]
