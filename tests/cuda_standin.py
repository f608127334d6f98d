"""A recording stand-in for a GPU (issue 55 item 2: the stream-order and
device checks without one).

``GpuStandIn`` replaces, for the duration of a ``with`` block, what the CUDA
code paths of rcn_fast ask of torch.cuda (streams, the stream and device
contexts, events, synchronisation, device properties) and of the native
CUDA module (every launcher of rcn_fast._cuda; the Triton kernels through
:meth:`GpuStandIn.triton_kernels`). The tensors stay CPU tensors: they stand
for tensors of one GPU, ``data_device`` (1 by default), while the current
device starts at another (0), as in a process whose tensors live on
``cuda:1``. ``rcn_fast._arrays.is_cuda`` answers yes for them, so the code
takes its CUDA paths; the launchers compute their results on the CPU (the
CPU module's kernels and the numpy references), so results can be compared.

What it records and checks, with a vector clock per stream and one for the
host (wait_stream, events and synchronisations merge clocks; a stream's
work is ordered after the host's program order at enqueue):

* every torch op (through a ``TorchFunctionMode``) and every launch reads
  and writes byte ranges of tensors on a stream: the current stream of the
  data device for torch ops (torch runs an op on its tensors' device's
  current stream), the stream handle passed to a native launcher, the
  current device's current stream for a Triton launch;
* a read of bytes last written by another stream, with no wait after that
  write, is a stream-order error (:class:`StreamOrderError`); so is a host
  read (``.numpy()``, ``.item()`` ...) of bytes a stream wrote that no
  synchronisation has covered (a non-blocking copy read before its event);
* a native or Triton launch while the current device is not the data
  device, or with a stream of another device, is a :class:`DeviceError`
  (the CUDA runtime launches on the current device: another GPU's stream is
  an invalid handle there, and Triton uses the current device's stream);
  so is an event recorded on another device's stream than the data's.

Used by tests/test_cuda_streams.py. Not a GPU: nothing here runs kernels
concurrently; it proves the orchestration's order, not the kernels.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode, _pop_mode_temporarily


class StreamOrderError(AssertionError):
    """A read of data another stream (or the device, for a host read) may not have written yet."""


class DeviceError(AssertionError):
    """A launch or an event on another device than the data's."""


# ------------------------------------------------------------------ clocks
def _join(a: dict, b: dict) -> None:
    for k, v in b.items():
        if a.get(k, 0) < v:
            a[k] = v


@dataclass(eq=False)
class FakeStream:
    """A torch.cuda.Stream: its device, a handle (``cuda_stream``) and its clock."""

    sim: "GpuStandIn"
    device: int
    sid: int
    clock: dict = field(default_factory=dict)

    @property
    def cuda_stream(self) -> int:
        return 0x5000 + self.sid

    @property
    def device_index(self) -> int:
        return self.device

    def wait_stream(self, other: "FakeStream") -> None:
        self.sim.log.append(f"stream {self.sid} waits for stream {other.sid}")
        _join(self.clock, other.clock)

    def wait_event(self, event: "FakeEvent") -> None:
        _join(self.clock, event.clock)

    def record_event(self, event: "FakeEvent | None" = None) -> "FakeEvent":
        event = event or FakeEvent(self.sim)
        event.record(self)
        return event

    def synchronize(self) -> None:
        _join(self.sim.host, self.clock)

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<stream {self.sid} of device {self.device}>"


class FakeEvent:
    def __init__(self, sim: "GpuStandIn", *args: Any, **kwargs: Any) -> None:
        self.sim = sim
        self.clock: dict = {}
        self.stream: FakeStream | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream if stream is not None else self.sim.current_stream(None)
        if stream.device != self.sim.data_device:
            raise DeviceError(f"an event recorded on {stream!r}, while the data is on device {self.sim.data_device}: "
                              "it never sees that device's work (record it on the data device's stream)")
        self.stream = stream
        self.clock = dict(stream.clock)

    def synchronize(self) -> None:
        _join(self.sim.host, self.clock)

    def wait(self, stream: FakeStream | None = None) -> None:
        (stream or self.sim.current_stream(None)).wait_event(self)

    def query(self) -> bool:
        return True


@dataclass
class _Write:
    lo: int
    hi: int
    who: Any  # a stream id, or "host"
    at: int
    what: str


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte range ``t`` may touch."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    span = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


def _tensors(obj: Any) -> list[torch.Tensor]:
    out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            out.extend(_tensors(o))
    elif isinstance(obj, dict):
        for o in obj.values():
            out.extend(_tensors(o))
    return out


#: Functions that read tensor data into Python values: the host waits for the stream.
_HOST_SYNC = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "cpu"}
#: Functions whose output size depends on the data: torch synchronises with the device.
_DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere"}
_INPLACE_DUNDER = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ior__", "__iand__"}


class _Mode(TorchFunctionMode):
    def __init__(self, sim: "GpuStandIn") -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(self, func, types_, args=(), kwargs=None):  # noqa: ANN001
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        sim = self.sim
        pinned = kwargs.pop("pin_memory", False) is True
        if name == "pin_memory":  # page-locked host memory: a host tensor
            out = args[0]
            sim.host_ptrs.add(out.untyped_storage().data_ptr())
            return out
        if name == "cuda":  # x.cuda(): the stand-in's tensors are already "on the GPU"
            sim.mark_device(args[0])
            return args[0]
        if name == "numpy" or name == "__array__":
            t = args[0]
            sim.host_read(t, f"{name}()")
            return func(*args, **kwargs)
        inputs = _tensors(args) + _tensors(kwargs)
        out = func(*args, **kwargs)
        outputs = _tensors(out)
        if name in ("to", "cuda") and outputs and any(o is i for o in outputs for i in inputs):
            # .to(the data device) of a tensor already there (the stand-in's tensors are CPU tensors)
            for o in outputs:
                sim.mark_device(o)
            return out
        if not inputs and not outputs:
            return out
        if name in _HOST_SYNC:
            sim.op(inputs, [], name, sync=True)
            return out
        inplace = (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_DUNDER
        in_ptrs = {i.untyped_storage().data_ptr() for i in inputs}
        fresh = [o for o in outputs if o.untyped_storage().data_ptr() not in in_ptrs]
        if "out" in kwargs:
            written = _tensors(kwargs["out"])
        elif inplace:
            written = [args[0]]
        else:
            written = []
        if not written and not fresh:
            return out  # a view, or metadata: no kernel
        # on the device when it touches device data, or creates a tensor on the device (device=...)
        device_op = sim.any_device(inputs + written) or (not inputs and "device" in kwargs and not pinned)
        for o in fresh:
            if device_op and not pinned:
                sim.mark_device(o)
            else:
                sim.mark_host(o)
        blocking_download = (name in ("copy_", "to") and not kwargs.get("non_blocking", False)
                             and sim.any_device(inputs) and not sim.any_device(written + fresh))
        sync = name in _DATA_DEPENDENT or blocking_download or (
            name == "__getitem__" and any(i.dtype == torch.bool for i in _tensors(args[1:])))
        sim.op(inputs, written + fresh, name, sync=sync, device=device_op, fresh=tuple(fresh))
        return out


class GpuStandIn:
    """The stand-in; see the module docstring. ``with GpuStandIn(monkeypatch) as gpu: ...``"""

    def __init__(self, monkeypatch: Any, *, data_device: int = 1, current_device: int = 0, devices: int = 2,
                 name: str = "NVIDIA Stand-In", capability: tuple[int, int] = (9, 0), sms: int = 132) -> None:
        self.mp = monkeypatch
        self.data_device = data_device
        self.device = current_device
        self.devices = devices
        self.name, self.capability, self.sms = name, capability, sms
        self._sid = itertools.count()
        self.host: dict = {}
        self._host_at = 0
        self.default = {d: FakeStream(self, d, next(self._sid)) for d in range(devices)}
        self.current = dict(self.default)
        self.streams = {s.cuda_stream: s for s in self.default.values()}
        self.writes: list[_Write] = []
        self.device_ptrs: set[int] = set()
        self.host_ptrs: set[int] = set()
        self.log: list[str] = []
        self.launches: list[str] = []

    # ---------------------------------------------------------------- devices
    def index(self, device: Any) -> int:
        """A device argument as an index (the CPU device stands for the data device)."""
        if device is None:
            return self.device
        if isinstance(device, torch.Tensor):
            device = device.device
        if isinstance(device, int):
            return device
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, FakeStream):
            return device.device
        if device.type == "cpu":
            return self.data_device
        return device.index if device.index is not None else self.device

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current[self.index(device)]

    def new_stream(self, device: Any = None, *args: Any, **kwargs: Any) -> FakeStream:
        s = FakeStream(self, self.index(device), next(self._sid))
        self.streams[s.cuda_stream] = s
        return s

    @contextlib.contextmanager
    def device_ctx(self, device: Any):
        prev, self.device = self.device, self.index(device)
        try:
            yield
        finally:
            self.device = prev

    @contextlib.contextmanager
    def stream_ctx(self, stream: FakeStream | None):
        if stream is None:
            yield
            return
        # torch.cuda.stream: the stream becomes its device's current stream and
        # the current device is its device until the block ends
        prev_dev, prev_stream = self.device, self.current[stream.device]
        self.device, self.current[stream.device] = stream.device, stream
        try:
            yield
        finally:
            self.current[stream.device] = prev_stream
            self.device = prev_dev

    def synchronize(self, device: Any = None) -> None:
        d = self.index(device)
        for s in self.streams.values():
            if s.device == d:
                _join(self.host, s.clock)

    # ---------------------------------------------------------------- memory
    def mark_device(self, t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        self.device_ptrs.add(ptr)
        self.host_ptrs.discard(ptr)

    def mark_host(self, t: torch.Tensor) -> None:
        """A new host allocation: whatever a freed device tensor at the same
        address was, this one is on the host (addresses are reused)."""
        ptr = t.untyped_storage().data_ptr()
        self.host_ptrs.add(ptr)
        self.device_ptrs.discard(ptr)

    def any_device(self, ts: list[torch.Tensor]) -> bool:
        return any(t.untyped_storage().data_ptr() in self.device_ptrs for t in ts)

    def _check(self, t: torch.Tensor, reader: Any, clock: dict, what: str) -> None:
        lo, hi = _extent(t)
        for w in self.writes:
            if w.lo < hi and lo < w.hi and w.who != reader and w.who != "host" and clock.get(w.who, 0) < w.at:
                by = "the host" if reader == "host" else f"stream {reader}"
                raise StreamOrderError(
                    f"{what} on {by} reads bytes {w.what} wrote on stream {w.who} with no wait after that write "
                    f"(the write is #{w.at} of stream {w.who}; the reader has seen #{clock.get(w.who, 0)})")

    def _write(self, t: torch.Tensor, who: Any, at: int, what: str, clock: dict, fresh: bool) -> None:
        lo, hi = _extent(t)
        if hi == lo:
            return
        if fresh:  # a new allocation: what was written at these addresses before is dead
            self.writes = [w for w in self.writes if w.hi <= lo or hi <= w.lo]
        else:  # an older write this one covers and is ordered after no longer matters
            self.writes = [w for w in self.writes
                           if not (lo <= w.lo and w.hi <= hi and (w.who == who or clock.get(w.who, 0) >= w.at))]
        self.writes.append(_Write(lo, hi, who, at, what))

    def host_read(self, t: torch.Tensor, what: str) -> None:
        self._check(t, "host", self.host, what)

    def op(self, reads: list[torch.Tensor], writes: list[torch.Tensor], what: str, *, sync: bool = False,
           device: bool = True, stream: FakeStream | None = None, fresh: tuple = ()) -> None:
        """One kernel (or host operation) reading and writing tensors
        (``fresh``: those of ``writes`` it allocated)."""
        fresh_ids = {id(t) for t in fresh}
        if not device and stream is None:  # a host operation, in program order
            self._host_at += 1
            self.host["host"] = self._host_at
            for t in reads:
                self._check(t, "host", self.host, what)
            for t in writes:
                self._write(t, "host", self._host_at, what, self.host, id(t) in fresh_ids)
            return
        s = stream or self.current_stream(self.data_device)
        _join(s.clock, self.host)  # enqueued after everything the host did so far
        s.clock[s.sid] = s.clock.get(s.sid, 0) + 1
        for t in reads:
            self._check(t, s.sid, s.clock, what)
        for t in writes:
            self._write(t, s.sid, s.clock[s.sid], what, s.clock, id(t) in fresh_ids)
        if sync:
            _join(self.host, s.clock)

    # ---------------------------------------------------------------- launches
    def launch(self, what: str, stream_handle: Any, reads: list, writes: list) -> None:
        """A native launcher: runs on the current device with the stream it is given."""
        if self.device != self.data_device:
            raise DeviceError(f"{what} launched while the current device is {self.device}; its tensors are on "
                              f"device {self.data_device} (wrap the launch in torch.cuda.device(tensor.device))")
        s = self.streams.get(int(stream_handle)) if stream_handle else self.default[self.device]
        if s is None:
            raise DeviceError(f"{what}: stream handle {stream_handle!r} is no stream")
        if s.device != self.device:
            raise DeviceError(f"{what} launched on device {self.device} with a stream of device {s.device}")
        self.launches.append(f"{what} on stream {s.sid}")
        self.op([t for t in reads if isinstance(t, torch.Tensor)], [t for t in writes if isinstance(t, torch.Tensor)],
                what, stream=s)

    # ---------------------------------------------------------------- the fakes
    def _cuda_namespace(self) -> dict[str, Any]:
        sim = self
        props = types.SimpleNamespace(multi_processor_count=self.sms, name=self.name, major=self.capability[0],
                                      minor=self.capability[1], total_memory=80 << 30)
        return {
            "is_available": lambda: True,
            "device_count": lambda: self.devices,
            "current_device": lambda: sim.device,
            "set_device": lambda d: setattr(sim, "device", sim.index(d)),
            "device": sim.device_ctx,
            "stream": sim.stream_ctx,
            "current_stream": sim.current_stream,
            "default_stream": lambda device=None: sim.default[sim.index(device)],
            "Stream": sim.new_stream,
            "Event": lambda *a, **k: FakeEvent(sim, *a, **k),
            "synchronize": sim.synchronize,
            "get_device_properties": lambda d=None: props,
            "get_device_name": lambda d=None: sim.name,
            "get_device_capability": lambda d=None: sim.capability,
            "mem_get_info": lambda d=None: (40 << 30, 80 << 30),
            "memory_reserved": lambda d=None: 0,
            "memory_allocated": lambda d=None: 0,
        }

    def __enter__(self) -> "GpuStandIn":
        from rcn_fast import _arrays, _crossovers, _native

        for attr, value in self._cuda_namespace().items():
            self.mp.setattr(torch.cuda, attr, value, raising=False)
        self.mp.setattr(_arrays, "is_cuda", lambda x: _arrays.is_torch(x))
        self.module = FakeCudaModule(self)
        self.mp.setattr(_native, "cuda_module", lambda: (self.module, None))
        self.mp.setattr(_crossovers, "_GPUS", {})
        from rcn_fast.search import cuda_tiled, torch_backend

        self.mp.setattr(cuda_tiled, "_STREAMS", {})
        self.mp.setattr(cuda_tiled, "_SMS", {})
        self.mp.setattr(torch_backend, "_OUT_DTYPE_OK", {})
        self.mode = _Mode(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)

    @contextlib.contextmanager
    def paused(self):
        """Torch ops that are not recorded (the fakes' own CPU computation)."""
        with _pop_mode_temporarily():
            yield

    def triton_kernels(self) -> Any:
        """A stand-in for rcn_fast.kernels.choice_scoring: its launches are
        recorded on the current device's current stream (as Triton's are),
        check the device, and compute with the torch references."""
        return _FakeTriton(self)


# ------------------------------------------------------------------ native launchers
def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _select(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    from rcn_fast.search.reference import select_topn

    return select_topn(scores, ids, k)


class FakeCudaModule:
    """rcn_fast._cuda's launchers, recorded by the stand-in and computed on the CPU."""

    TOPN_MAX_K = 1024
    TOPN_MMA_MAX_K = 256
    TOPN_BLOCK_SELECT_ROUND = 1024
    SAMPLER_GRAM_MAX_N = 128

    def __init__(self, sim: GpuStandIn) -> None:
        from rcn_fast import _crossovers

        self.sim = sim
        self.KERNEL_VERSIONS = dict(_crossovers.KERNEL_VERSIONS)

    def _cpu(self) -> Any:
        from rcn_fast import _native

        mod, why = _native.cpu_module()
        assert mod is not None, why
        return mod

    def topn_split_queries(self, queries, terms, scales, stream=0):
        self.sim.launch("topn_split_queries", stream, [queries], [terms, scales])
        from rcn_fast.search.torch_backend import split_query_torch

        with self.sim.paused():
            t, s = split_query_torch(torch, queries, str(terms.dtype).removeprefix("torch."))
            terms.copy_(t)
            scales.copy_(s.view(-1))

    def topn_block_select(self, scores, terms, scales, R, k, row0, slices, part_s, part_i, slot0, stream=0):
        self.sim.launch("topn_block_select", stream, [scores, scales],
                        [part_s[slot0 : slot0 + slices], part_i[slot0 : slot0 + slices]])
        with self.sim.paused():
            qt = scores.shape[0] // terms
            tile = _np(scores)[:, :R].reshape(terms, qt, R).astype(np.float32)
            if terms == 1:
                comb = tile[0]
            else:
                sc = _np(scales).reshape(terms, qt, 1).astype(np.float32)
                with np.errstate(invalid="ignore", over="ignore"):
                    comb = (tile[-1] * sc[-1]).astype(np.float32)
                    for t in range(terms - 2, -1, -1):
                        comb = ((tile[t] * sc[t]).astype(np.float32) + comb).astype(np.float32)
            width = R if slices <= 1 else -(-R // slices)
            for si in range(slices):
                c0, c1 = min(R, si * width), min(R, si * width + width)
                ids = np.broadcast_to(np.arange(c0, c1, dtype=np.int64) + row0, (qt, c1 - c0))
                s, i = _select(comb[:, c0:c1], ids, k)
                part_s[slot0 + si] = torch.from_numpy(s)
                part_i[slot0 + si] = torch.from_numpy(i)

    def topn_merge_lists(self, part_s, part_i, scores_out, ids_out, stream=0):
        self.sim.launch("topn_merge_lists", stream, [part_s, part_i], [scores_out, ids_out])
        with self.sim.paused():
            S, Q, k = part_s.shape
            s = _np(part_s).transpose(1, 0, 2).reshape(Q, S * k)
            i = _np(part_i).transpose(1, 0, 2).reshape(Q, S * k)
            os_, oi = _select(np.where(i >= 0, s, -np.inf).astype(np.float32), i, k)
            scores_out.copy_(torch.from_numpy(os_))
            ids_out.copy_(torch.from_numpy(oi))

    def topn_int8_scan(self, codes, rows, qcodes, qparams, k, bound, cand_q, cand_j, cand_lo, cand_hi, count,
                       stream=0):
        self.sim.launch("topn_int8_scan", stream, [codes, rows, qcodes, qparams, bound, count],
                        [bound, cand_q, cand_j, cand_lo, cand_hi, count])
        with self.sim.paused():  # the kernels' host emulation, writing the tensors in place
            self._cpu().topn_int8_scan_emulated(_np(codes), _np(rows), _np(qcodes), _np(qparams), k, _np(bound),
                                                _np(cand_q), _np(cand_j), _np(cand_lo), _np(cand_hi), _np(count),
                                                self.sim.sms)

    def topn_finish_rows(self, scores, top_s, top_i, k, id_base, scores_out, ids_out, queries=None, corpus=None,
                         stream=0):
        self.sim.launch("topn_finish_rows", stream, [scores, top_s, top_i, queries, corpus], [scores_out, ids_out])
        with self.sim.paused():
            extra = {} if queries is None else {"queries": queries, "corpus": corpus}
            self._cpu().topn_finish_rows(scores, top_s.contiguous(), top_i.contiguous(), k, id_base, scores_out,
                                         ids_out, **extra)

    def topn(self, queries, corpus, k, scores_out, ids_out, stream=0, algorithm=0):
        self.sim.launch("topn", stream, [queries, corpus], [scores_out, ids_out])
        with self.sim.paused():
            self._cpu().topn(queries, corpus, k, scores_out, ids_out)

    def sample_subsets(self, query, cand, mask, keys, tau, seed, first_relevance, ids, logp, stream=0, gram=False):
        self.sim.launch("sample_subsets_gram" if gram else "sample_subsets", stream, [query, cand, mask, keys],
                        [ids, logp])
        with self.sim.paused():
            self._cpu().sample_subsets(query, cand, mask, keys, tau, seed, first_relevance, ids, logp)


class _FakeTritonKernel:
    def __init__(self, sim: GpuStandIn, name: str, compute: Any) -> None:
        self.sim, self.name, self.compute = sim, name, compute

    def __getitem__(self, grid: Any) -> Any:
        def run(**kw: Any) -> None:
            sim = self.sim
            if sim.device != sim.data_device:
                raise DeviceError(f"Triton kernel {self.name} launched on the current device {sim.device}; its "
                                  f"tensors are on device {sim.data_device} (Triton launches on the current device)")
            tensors = [v for v in kw.values() if isinstance(v, torch.Tensor)]
            outs = [kw["out_ptr"], kw["arg_ptr"]]
            sim.op([t for t in tensors if all(t is not o for o in outs)], outs, self.name,
                   stream=sim.current_stream(None))
            with sim.paused():
                self.compute(kw)

        return run


class _FakeTriton:
    def __init__(self, sim: GpuStandIn) -> None:
        from rcn_fast.llm.scoring import reference

        def logits(kw: dict) -> None:
            out, arg = reference.choice_logprobs_reference(kw["logits_ptr"], kw["ids_ptr"])
            kw["out_ptr"].copy_(out)
            kw["arg_ptr"].copy_(arg)

        def hidden(kw: dict) -> None:
            bias = kw["bias_ptr"] if kw["HAS_BIAS"] else None
            out, arg = reference.choice_logprobs_hidden_reference(kw["hidden_ptr"], kw["weight_ptr"], kw["ids_ptr"],
                                                                  bias)
            kw["out_ptr"].copy_(out)
            kw["arg_ptr"].copy_(arg)

        self.choice_logprobs_logits_kernel = _FakeTritonKernel(sim, "choice_logprobs_logits_kernel", logits)
        self.choice_logprobs_hidden_kernel = _FakeTritonKernel(sim, "choice_logprobs_hidden_kernel", hidden)
