"""The Guard's per-step numbers, read in batches and agreed across ranks without stalling the device.

Part of the Guard (``trainguard.torch.guard``). Reading a CUDA loss (``item()``) or waiting for a
collective is a device synchronisation: the CPU stops queueing work until the GPU has drained its
stream. So the Guard does not read each step's loss. It keeps the steps' loss tensors (a list
append, no kernel) and, every ``every`` steps, packs them with the gradient, preemption and
checkpoint-request flags into one small tensor, starts one ``all_reduce`` (SUM: mean loss, "any rank" flags, and which
ranks' own loss was non-finite: each rank adds its own bit) and one of the arrival times (MAX: how long each rank waited for the slowest), and copies the result into
pinned host memory with ``non_blocking=True``. ``collect`` reads it ``lag`` steps later (0: at
once), when the GPU has normally long finished it: in steady state nothing waits on the device.

Every rank launches and collects at the same steps, so every rank reads the same agreed numbers
and takes the same decision at the same step.
"""

from __future__ import annotations

import ctypes
import math
import struct
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

NAN = float("nan")
MASK_BITS = 52  # ranks per float64 of a source mask: sums of distinct powers of two below 2**53 are exact
SLOT_WORLD = 64  # up to this many ranks, host windows carry each rank's arrivals in its own slots
_FLAGS = 2  # one float per window after the per-step values: preemption, checkpoint request


class Window(NamedTuple):  # a NamedTuple: built on every check, it must be cheap
    """What all ranks agreed about a run of consecutive steps (local values where noted)."""

    steps: tuple[int, ...]
    losses: tuple[float | None, ...]  # mean over ranks; None when no rank had a loss
    grads_bad: tuple[bool, ...]  # NaN/Inf in some rank's gradients (with check_grads)
    step_times: tuple[float, ...]  # this rank's step times
    waits: tuple[float, ...] | None  # this rank's wait for the slowest rank; None without peers
    preempt: bool  # some rank was asked to stop
    sources: tuple[tuple[int, ...], ...]  # per step: the ranks whose own loss was non-finite
    step_s: float | None = None  # agreed seconds per step (the latest arrivals); None without peers
    save: bool = False  # some rank saw the supervisor ask for a checkpoint (`trainguard.control`)


@dataclass(slots=True)
class _Launched:
    entries: list[tuple[int, Any, float, float, Any]]
    packed: torch.Tensor | None = None  # on the device; the host copy when ``event`` is set
    arrivals: torch.Tensor | None = None
    works: tuple[Any, ...] = ()
    event: Any = None  # torch.cuda.Event recorded after the copy to host
    preempt: bool = False
    save: bool = False
    slots: bool = False  # the arrivals are per-rank slots at the end of ``packed`` (host windows)


class Agreement:
    """Packs steps ``(step, loss, step_time, arrival, grad_flag)``; launch, then collect.

    >>> a = Agreement(world=1)
    >>> w = a.collect(a.launch([(0, torch.tensor(2.0), 0.1, 0.0, None)], preempt=False))
    >>> w.losses, w.grads_bad, w.sources
    ((2.0,), (False,), ((),))
    """

    def __init__(self, world: int = 1, backend: str | None = None, rank: int = 0) -> None:
        self.world = world
        self.backend = backend
        self.rank = rank
        self._groups = -(-world // MASK_BITS)  # floats per step in the source mask
        self.device: torch.device | None = None  # where packing happens; None: read host values
        self._device_known = False
        self._wall = time.time() - time.perf_counter()  # arrival perf_counter -> unix time
        self._host: dict[tuple[int, str], torch.Tensor] = {}  # pinned buffers, reused
        self._cpu: dict[int, tuple[Any, struct.Struct, torch.Tensor]] = {}  # host windows, by size
        self._settled: tuple[Any, ...] = ()  # the works of the window settled last (see settle)
        self._opts: dict[Any, Any] = {}  # reduce op -> AllreduceOptions, reused

    def choose_device(self, loss: Any) -> None:
        """Where windows are packed, from the first loss: None for host values in one process."""
        if not self._device_known:
            self.device, self._device_known = self._device([(0, loss, 0.0, 0.0, None)]), True

    def launch(
        self, entries: list[tuple[int, Any, float, float, Any]], preempt: bool, save: bool = False
    ) -> _Launched:
        """Start reading (and agreeing on) these steps; nothing here waits for the device."""
        job = _Launched(entries, preempt=preempt, save=save)
        if not self._device_known:
            self.device, self._device_known = self._device(entries), True
        device = self.device
        if device is None:  # one process, host values: nothing to pack, read them at collect
            return job
        if device.type == "cpu":
            self._launch_host(job)
            return job
        n = len(entries)
        with torch.no_grad():
            losses = _losses(entries, device)
            mask = torch.zeros(n, self._groups, dtype=torch.float64, device=device)
            mask[:, self.rank // MASK_BITS] = (~torch.isfinite(losses)).to(torch.float64) * float(
                2 ** (self.rank % MASK_BITS)
            )
            packed = torch.cat(
                [
                    losses,
                    _present(entries, device),
                    _grad_flags(entries, device),
                    torch.full((1,), 1.0 if preempt else 0.0, dtype=torch.float64, device=device),
                    torch.full((1,), 1.0 if save else 0.0, dtype=torch.float64, device=device),
                    mask.reshape(-1),
                ]
            )
            works: list[Any] = []
            arrivals = None
            if self.world > 1:
                self._wall = time.time() - time.perf_counter()  # follow NTP slewing
                stamps = torch.tensor([e[3] + self._wall for e in entries], dtype=torch.float64)
                arrivals = self._to_device(stamps, device, "arrivals")
                works.append(self._all_reduce(packed, dist.ReduceOp.SUM))
                works.append(self._all_reduce(arrivals, dist.ReduceOp.MAX))
            if device.type == "cuda":
                for w in works:
                    w.wait()  # NCCL: the current stream waits for the collective; the CPU does not
                works = []
                packed = self._to_host(packed, "packed")
                if arrivals is not None:
                    arrivals = self._to_host(arrivals, "arrivals-host")
                job.event = torch.cuda.Event()
                job.event.record()
        job.packed, job.arrivals, job.works = packed, arrivals, tuple(works)
        assert packed.numel() == (3 + self._groups) * n + _FLAGS
        return job

    def collect(self, job: _Launched) -> Window:
        """The agreed numbers of a launched window (waits only if the device is still behind)."""
        entries = job.entries
        steps = tuple([e[0] for e in entries])
        dts = tuple([e[2] for e in entries])
        if job.packed is None:
            losses = tuple([host_value(e[1]) for e in entries])
            bad = tuple([e[4] is not None and bool(e[4].item() > 0) for e in entries])
            own = tuple([(self.rank,) if v is not None and not math.isfinite(v) else () for v in losses])
            return Window(steps, losses, bad, dts, None, job.preempt, own, save=job.save)
        self.settle(job)
        if job.event is not None:
            job.event.synchronize()  # normally long done: launched at least a step ago
        n = len(entries)
        values = job.packed.tolist()
        sums, present, flags = values[:n], values[n : 2 * n], values[2 * n : 3 * n]
        losses = tuple(s / p if p > 0 else None for s, p in zip(sums, present, strict=True))
        waits = step_s = None
        latest: list[float] | None = None  # per step, the last rank's arrival: the same on every rank
        if job.slots:
            base, world = (3 + self._groups) * n + _FLAGS, self.world
            latest = [max(values[base + i * world : base + (i + 1) * world]) for i in range(n)]
        elif job.arrivals is not None:
            latest = job.arrivals.tolist()
        if latest is not None:
            waits = tuple(max(0.0, t - (e[3] + self._wall)) for t, e in zip(latest, entries, strict=True))
            step_s = (latest[-1] - latest[0]) / (n - 1) if n > 1 else None
        sources = _decode_masks(values[3 * n + _FLAGS :], n, self._groups)
        flagged = tuple(f > 0 for f in flags)
        return Window(
            steps, losses, flagged, dts, waits, values[3 * n] > 0, sources, step_s, values[3 * n + 1] > 0
        )

    def settle(self, job: _Launched) -> None:
        """Wait for the collectives of ``job`` (before its buffer is read or reused)."""
        for w in job.works:
            w.wait()
        # Hold the handles until the next window settles (or `release`). gloo's worker thread
        # drops its own reference just after it wakes us; were it the last, the work would be
        # destroyed there, which takes the GIL. Should the main thread (holding the GIL) destroy
        # the process group then, which joins that thread, the rank never exits.
        self._settled, job.works = job.works, ()

    def release(self) -> None:
        """Drop the handles `settle` kept, once gloo's thread is surely done with them: they must
        not outlive the process group (its threads would be destroyed unjoined at exit)."""
        if self._settled:
            time.sleep(0.01)  # lets gloo's thread, woken with us, drop its references first
            self._settled = ()

    def _launch_host(self, job: _Launched) -> None:
        """Pack a window of host values with no tensor op: the values are read (``item()`` on a
        CPU tensor is no device sync), written into a reused buffer with one ``struct`` call,
        and summed in one asynchronous all-reduce (gloo runs it on its own thread). Up to
        `SLOT_WORLD` ranks, each rank writes its arrivals into its own slots of the same
        buffer (a sum of one value and zeros: an all-gather), so no second collective is needed.
        The window in flight is always collected (or settled) before the next launch, so one
        buffer per size is never overwritten while gloo reads it."""
        entries, n, groups, world, rank = job.entries, len(job.entries), self._groups, self.world, self.rank
        slots = world <= SLOT_WORLD
        size = (3 + groups + (world if slots else 0)) * n + _FLAGS
        buf = self._cpu.get(size)
        if buf is None:
            # The tensor owns its memory and Python writes through a ctypes view of it: gloo's
            # thread may drop the last reference to the tensor, and a tensor over a Python buffer
            # (torch.frombuffer) would need the GIL to be freed there (a deadlock at teardown).
            packed = torch.zeros(size, dtype=torch.float64)
            raw = (ctypes.c_double * size).from_address(packed.data_ptr())
            buf = self._cpu[size] = (raw, struct.Struct(f"={size}d"), packed)
        raw, layout, packed = buf
        values = [0.0] * size
        own, bit = 3 * n + _FLAGS + rank // MASK_BITS, float(2 ** (rank % MASK_BITS))
        self._wall = time.time() - time.perf_counter()  # follow NTP slewing
        for i, e in enumerate(entries):
            value = host_value(e[1])
            if value is not None:
                values[i], values[n + i] = value, 1.0
                if not math.isfinite(value):
                    values[own + i * groups] = bit
            if e[4] is not None:
                values[2 * n + i] = 1.0 if e[4].item() > 0 else 0.0
        values[3 * n] = 1.0 if job.preempt else 0.0
        values[3 * n + 1] = 1.0 if job.save else 0.0
        if slots:
            base = (3 + groups) * n + _FLAGS + rank
            for i, e in enumerate(entries):
                values[base + i * world] = e[3] + self._wall
        layout.pack_into(raw, 0, *values)
        works: list[Any] = []
        arrivals = None
        if world > 1:
            works.append(self._all_reduce(packed, dist.ReduceOp.SUM))
            if not slots:
                arrivals = torch.tensor([e[3] + self._wall for e in entries], dtype=torch.float64)
                works.append(self._all_reduce(arrivals, dist.ReduceOp.MAX))
        job.packed, job.arrivals, job.works, job.slots = packed, arrivals, tuple(works), slots and world > 1

    def _all_reduce(self, t: torch.Tensor, op: Any) -> Any:
        """An asynchronous all-reduce on the default group, straight to the process group:
        ``dist.all_reduce``'s argument checks cost more CPU than the Guard's whole check."""
        opts = self._opts.get(op)
        if opts is None:
            opts = self._opts[op] = dist.AllreduceOptions()
            opts.reduceOp = op
            if hasattr(opts, "asyncOp"):  # torch >= 2.8 tells the backend the caller waits later
                opts.asyncOp = True
        group = dist.group.WORLD
        if group is None:  # the Guard took its world size from the default group, now destroyed
            raise RuntimeError(
                "the default process group was destroyed while a Guard used it: close the Guard first"
            )
        return group.allreduce([t], opts)

    def _device(self, entries: list[tuple[int, Any, float, float, Any]]) -> torch.device | None:
        if self.world > 1 and self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        for e in entries:
            if isinstance(e[1], torch.Tensor) and e[1].device.type != "cpu":
                return e[1].device
        return torch.device("cpu") if self.world > 1 else None

    def _host_buffer(self, like: torch.Tensor, name: str) -> torch.Tensor:
        key = (like.numel(), name)
        buf = self._host.get(key)
        if buf is None:
            buf = self._host[key] = torch.empty(like.numel(), dtype=like.dtype, pin_memory=True)
        return buf

    def _to_host(self, t: torch.Tensor, name: str) -> torch.Tensor:
        # Reusing one buffer is safe: the previous window was collected (its event synchronised)
        # before this one is launched.
        return self._host_buffer(t, name).copy_(t, non_blocking=True)

    def _to_device(self, t: torch.Tensor, device: torch.device, name: str) -> torch.Tensor:
        if device.type != "cuda":
            return t
        staged = self._host_buffer(t, name).copy_(t)  # pinned: the copy below does not sync
        return staged.to(device, non_blocking=True)


def _decode_masks(values: list[float], n: int, groups: int) -> tuple[tuple[int, ...], ...]:
    if not any(values):  # the common case: every rank's losses were finite
        return ((),) * n
    out = []
    for i in range(n):
        ranks: list[int] = []
        for g in range(groups):
            bits = int(values[i * groups + g])
            ranks += [g * MASK_BITS + b for b in range(MASK_BITS) if bits >> b & 1]
        out.append(tuple(ranks))
    return tuple(out)


def _losses(entries: list[tuple[int, Any, float, float, Any]], device: torch.device) -> torch.Tensor:
    tensors = [e[1] for e in entries]
    if all(isinstance(t, torch.Tensor) for t in tensors):
        flat = [t.detach().reshape(-1)[0] if t.dim() else t.detach() for t in tensors]
        return torch.stack(flat).to(device=device, dtype=torch.float64)
    parts = [
        t.detach().reshape(-1)[0].to(device=device, dtype=torch.float64).reshape(1)
        if isinstance(t, torch.Tensor)
        else torch.full((1,), _float_or_zero(t), dtype=torch.float64, device=device)
        for t in tensors
    ]
    return torch.cat(parts)


def _present(entries: list[tuple[int, Any, float, float, Any]], device: torch.device) -> torch.Tensor:
    if all(isinstance(e[1], torch.Tensor) for e in entries):
        return torch.ones(len(entries), dtype=torch.float64, device=device)
    parts = [
        torch.full((1,), 1.0 if isinstance(e[1], torch.Tensor) or _as_float(e[1]) is not None else 0.0)
        for e in entries
    ]
    return torch.cat(parts).to(device=device, dtype=torch.float64)


def _grad_flags(entries: list[tuple[int, Any, float, float, Any]], device: torch.device) -> torch.Tensor:
    if all(e[4] is None for e in entries):
        return torch.zeros(len(entries), dtype=torch.float64, device=device)
    parts = [
        e[4].reshape(1).to(device=device, dtype=torch.float64)
        if e[4] is not None
        else torch.zeros(1, dtype=torch.float64, device=device)
        for e in entries
    ]
    return torch.cat(parts)


def host_value(loss: Any) -> float | None:
    if type(loss) is float:  # kept as a value already (LossWindow.take on the host)
        return loss
    try:
        return loss.item()  # a one-element host tensor: the common case
    except (AttributeError, RuntimeError, ValueError):
        if isinstance(loss, torch.Tensor):
            return float(loss.reshape(-1)[0].item())
        return _as_float(loss)


def _as_float(loss: object) -> float | None:
    try:
        return float(loss)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _float_or_zero(loss: object) -> float:
    value = _as_float(loss)
    return 0.0 if value is None else value
