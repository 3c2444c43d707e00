"""A GPU of the simulated node as a diagnostics device. Imports torch.

It does the real work on the CPU, then does to it what the node's faults do to silicon:

- its SM clock (the node's reading under load) sets its speed: a straggler's half clock or a
  thermal slowdown makes every product take twice as long on the device's clock (``clock()``),
  which counts the CPU time of the work, each product at the least CPU time a product of its
  shape took on the host: a GPU is not slowed by other processes on its host, and a host busy
  elsewhere (sharing its caches, taking its time slices) does not skew one GPU against another;
  its writes are priced the same way (the least CPU time a write of their size took);
- ``SlowProducts`` (clocks read normal) makes it really do more work per product: the compute
  test sees the time it took, telemetry sees nothing;
- ``WrongProducts`` flips a bit in that share of the elements of its products' results, picked by
  each element's position and value: the same operands always come back with the same wrong
  elements, as a defective unit errs reproducibly on operations of a particular kind;
- ``HbmCorruption`` flips bits in what is written to its memory; ``StuckBits`` holds a bit of some
  bytes at 0 or 1, so a written pattern that needs the other value really reads back wrong;
- its link moves data at its model's rate (``profiles.link_gbps``): the collective's bytes really
  travel between threads through gloo, but the time charged is what they take on the simulated
  NVLink, since the host's loopback says nothing about it; ``SlowLink`` caps that rate.
  ``DetouredLink`` really copies each transfer through host bounce buffers (the partner waits for
  it): the charge is stretched by the CPU time of those copies over that of one direct copy (the
  least disturbed of the copies, so a host busy elsewhere can make a detour look slower, never
  hide it);
- ``busy()`` raises the GPU's load in the node, so heat builds up as it would (``HotUnderLoad``).

The tests see only the computed tensors and the time they took, as on real hardware.

    >>> from trainguard.telemetry.sim import SimNode
    >>> sim = SimNode(n_gpus=2, load=0.0)
    >>> _ = sim.now().wrong_products(gpu=1)
    >>> import torch
    >>> a = torch.ones(4, 4)
    >>> [bool((SimDevice(sim, i).matmul(a, a) == 4).all()) for i in (0, 1)]
    [True, False]
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import torch

from trainguard.diagnose.torch_device import TorchDevice
from trainguard.records import Sample
from trainguard.telemetry.sim import SimNode, state
from trainguard.telemetry.sim.profiles import link_gbps

__all__ = ["SimDevice"]

C = TypeVar("C")

# The share of a link's one-way rate that NCCL's ring all-reduce reaches as bus bandwidth
# (8 x H100 SXM: ~360 GB/s of 450 in nccl-tests).
LINK_EFFICIENCY = 0.8


class SimDevice(TorchDevice):
    def __init__(self, sim: SimNode, index: int, least: dict[tuple[Any, ...], float] | None = None) -> None:
        """``least``: the least CPU time a product of each shape took, shared by the devices of one
        target (the host does every device's work, so one figure prices every device's products)."""
        super().__init__(index, "cpu", sim.identity(index).name or "simulated GPU", "sim")
        self.sim = sim
        self._rng = sim.rng("sim-device", index)
        self._lock = threading.Lock()
        self._busy_depth = 0
        self._ratio, self._ratio_at = 1.0, float("-inf")
        self._added_s = 0.0  # device time the faults added (a slow clock), less what the host took
        self._least = {} if least is None else least
        self._before: float | None = None  # the GPU's own load before busy()
        self._link_direct_s = 0.0  # CPU time of the direct copies of a detoured link's transfers
        self._link_total_s = 0.0  # ... and of those copies with the detour's bounces
        self._bounce: Any = None  # a detoured link's bounce buffer
        self._stuck: tuple[object, list[tuple[int, int, bool]]] | None = None  # (defect, cells)

    # -- what the faults do -----------------------------------------------------------------
    def _active(self, kind: type[C]) -> C | None:
        self.sim.poll()
        st = self.sim.state(self.index)
        return next((c for c in (*st.conditions, *st.defects) if isinstance(c, kind)), None)

    def _clock_ratio(self) -> float:
        """SM clock / max under load, re-read at most every 50 ms (GPUs boost when work arrives)."""
        if self._busy_depth == 0:
            return 1.0
        now = time.monotonic()
        if now - self._ratio_at > 0.05:
            s = self.reading()
            if s is not None and s.sm_clock_mhz and s.sm_clock_max_mhz:
                self._ratio = min(1.0, s.sm_clock_mhz / s.sm_clock_max_mhz)
            self._ratio_at = now
        return self._ratio

    def _flip_bits(self, t: Any, n: int) -> None:
        raw = t.view(-1).view(torch.uint8)
        for _ in range(n):
            k = self._rng.randrange(raw.numel())
            raw[k] ^= 1 << self._rng.randrange(8)

    def _stuck_cells(self, defect: state.StuckBits) -> list[tuple[int, int, bool]]:
        """(byte offset, bit, stuck at 1) of each cell, the same for every allocation (seeded)."""
        if self._stuck is None or self._stuck[0] is not defect:
            rng = self.sim.rng("stuck-bits", self.index)
            cells = [
                (rng.randrange(defect.span), rng.randrange(8), rng.random() < 0.5)
                for _ in range(defect.cells)
            ]
            self._stuck = (defect, cells)
        return self._stuck[1]

    def _hold_stuck_bits(self, dst: Any, defect: state.StuckBits) -> None:
        if not dst.is_contiguous():
            return
        start = dst.storage_offset() * dst.element_size()
        raw = dst.view(-1).view(torch.uint8)
        for offset, bit, high in self._stuck_cells(defect):
            k = offset - start
            if 0 <= k < raw.numel():
                raw[k] = int(raw[k]) | (1 << bit) if high else int(raw[k]) & ~(1 << bit) & 0xFF

    # -- Device -----------------------------------------------------------------------------
    def clock(self) -> float:
        """The CPU time of the calling thread plus the time the faults added, less what a busy host
        added to products: a simulated GPU is not slowed by other processes, as a real GPU is not."""
        return time.thread_time() + self._added_s

    def matmul(self, a: Any, b: Any) -> Any:
        t0 = time.thread_time()
        slow, wrong = self._active(state.SlowProducts), self._active(state.WrongProducts)
        ratio = self._clock_ratio()
        t1 = time.thread_time()
        c = a @ b
        if slow is not None and slow.fraction > 0:
            # The work a GPU at this fraction of its rate spends on one product, really done.
            extra = 1 / slow.fraction - 1
            for _ in range(int(extra)):
                a @ b
            rows = round(a.shape[-2] * (extra - int(extra)))
            if rows:
                a[..., :rows, :] @ b
        key = (a.shape, b.shape, a.dtype, torch.get_float32_matmul_precision(), slow)
        least = self._least[key] = min(time.thread_time() - t1, self._least.get(key, float("inf")))
        if wrong is not None:
            _defective_results(c, wrong.rate)
        # On the device a product costs the least one of its shape took on the host, at the clock's
        # rate: neither a moment when the host was busy elsewhere nor the simulator's bookkeeping
        # is device time (the extra work of a slow product is).
        self._added_s += least / ratio - (time.thread_time() - t0)
        return c

    def write(self, dst: Any, src: Any) -> None:
        t0 = time.thread_time()
        super().write(dst, src)
        # As for products: a write costs the least one of its size and kind took on the host (a
        # host busy elsewhere slows the copies it makes while measuring one GPU, not that GPU).
        key = ("write", dst.shape, dst.dtype, isinstance(src, torch.Tensor))
        least = self._least[key] = min(time.thread_time() - t0, self._least.get(key, float("inf")))
        self._added_s += least - (time.thread_time() - t0)
        t0 = time.thread_time()
        hbm = self._active(state.HbmCorruption)
        if hbm is not None:
            expected = hbm.per_gib * dst.numel() * dst.element_size() / 2**30
            with self._lock:
                self._flip_bits(dst, int(expected + self._rng.random()))
        stuck = self._active(state.StuckBits)
        if stuck is not None:
            self._hold_stuck_bits(dst, stuck)
        # Corrupting memory costs a real GPU nothing: the simulator's bookkeeping is not device time.
        self._added_s -= time.thread_time() - t0

    def all_reduce(self, group: Any, tensor: Any) -> None:
        group.allreduce([tensor]).wait()
        detour = self._active(state.DetouredLink)
        if detour is None:
            return
        # What this rank sent in the ring, moved again: once directly, then through the bounces.
        sent = tensor.view(-1)[: max(1, tensor.numel() * 2 * (group.size() - 1) // group.size())]
        if self._bounce is None or self._bounce.numel() != sent.numel():
            self._bounce = torch.empty_like(sent)
            self._bounce.copy_(sent)  # its pages mapped before anything is timed
        bounce = self._bounce
        bounce.copy_(sent)  # the bytes in cache, as for the copies timed next
        took = []
        t0 = time.thread_time()
        for _ in range(1 + detour.bounces):
            bounce.copy_(sent)
            t1 = time.thread_time()
            took.append(t1 - t0)
            t0 = t1
        # One copy costs what the least disturbed of these copies of the same bytes took: a
        # preemption or a cold cache in the direct copy must not pass for a fast detour.
        one = min(took)
        if one > 0:
            self._link_direct_s += one
            self._link_total_s += one + sum(took[1:])

    def link_seconds(self, nbytes: int, ranks: int, wall_s: float) -> float:
        """The time a ring all-reduce of ``nbytes`` among ``ranks`` spends on this GPU's link: each
        rank sends ``2 (n - 1) / n`` of the buffer, at the rate NCCL reaches on the link (the
        partners wait for the slowest link: the caller takes the slowest rank's time), stretched
        by what the copies of a detoured link took since the last call."""
        link = self._active(state.SlowLink)
        rate = LINK_EFFICIENCY * link_gbps(self.sim.profile) * 1e9 * (link.fraction if link else 1.0)
        stretch = self._link_total_s / self._link_direct_s if self._link_direct_s > 0 else 1.0
        self._link_direct_s = self._link_total_s = 0.0
        return nbytes * 2 * (ranks - 1) / ranks / rate * stretch

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        # OpenMP's thread count is per calling thread: pin the one that does this device's work,
        # so all of it runs (and is timed) there. The target restores the count on close.
        torch.set_num_threads(1)
        with self._lock:
            self._busy_depth += 1
            if self._busy_depth == 1:
                self._before = self.sim.state(self.index).load
                self.sim.set_load(1.0, gpu=self.index)
                self._ratio_at = float("-inf")
        try:
            yield
        finally:
            with self._lock:
                self._busy_depth -= 1
                if self._busy_depth == 0:
                    self.sim.set_load(self._before, gpu=self.index)

    def reading(self) -> Sample | None:
        return self.sim.sample()[self.index]

    def memory_free(self) -> int:
        st = self.sim.sample()[self.index]
        if st.mem_total_mib is None or st.mem_used_mib is None:
            return self._cpu_memory_bytes
        return int((st.mem_total_mib - st.mem_used_mib) * 2**20)


_INT_OF_SIZE = {2: "int16", 4: "int32", 8: "int64"}
_FLIP_OF_SIZE = {2: 1 << 6, 4: 1 << 22, 8: 1 << 51}  # the top mantissa bit of bf16, fp32, fp64


def _defective_results(c: Any, rate: float) -> None:
    """Flip a mantissa bit in the share ``rate`` of ``c``'s elements, picked by a hash of each
    element's position and correct value: the same operands give the same wrong elements every
    time. Defective cores err reproducibly on a small share of operations of a particular kind
    (Meta's "Silent Data Corruptions at Scale", 2021; Google's "Cores that don't count", 2021), so
    a fixed test workload either always sees the defect or never does."""
    if rate <= 0 or not c.is_contiguous() or c.element_size() not in _INT_OF_SIZE:
        return
    bits = c.view(-1).view(getattr(torch, _INT_OF_SIZE[c.element_size()]))
    h = bits.to(torch.int64) * 0x9E3779B1 + torch.arange(bits.numel(), dtype=torch.int64) * 0x85EBCA77
    h = ((h ^ (h >> 29)) * 0x2C1B3C6D) & 0xFFFFFFFF  # a multiplicative hash's low 32 bits, mixed
    picked = h < int(rate * 2**32) if rate < 1 else torch.ones_like(h, dtype=torch.bool)
    bits[picked] ^= _FLIP_OF_SIZE[c.element_size()]
