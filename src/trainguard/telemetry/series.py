"""The telemetry series: per GPU, one point per ``step_s`` of down-sampled readings and kernel-log
event counts, kept for a fixed depth. The recent past a failure model reads.

    each tick: Samples + Events -> Series.add -> a SeriesPoint per GPU and step -> the ring (depth)
                                                                                 -> take_closed() -> the store

A point folds the readings of its step: a gauge (temperature, power, clocks, utilisation, memory
used...) by its mean, and temperatures and power also by their max (``temperature_c_max``); a
counter, flag or limit (ECC errors, remapped rows, retired pages, PCIe replays, NVLink errors,
energy, pending remaps) by its last value; each throttle reason as the share of readings it was
active in (``throttle_hw_thermal``), and ``throttled`` the share of the readings that were read
with any reason active; ``lost``
counts readings of a GPU that stopped answering, ``unread`` the readings that came back with
neither a temperature nor a utilisation (NVML timed out, or the GPU was lost); ``recovery_action`` is the driver's last, as NVML's code (0 none ... 4 drain and reset).
Kernel-log events count per GPU (``events``, ``xids`` and per code ``xid_79``), those of no GPU
under ``NODE`` (-1). The agent keeps one series (agent/daemon.py) and writes each closed point to
the incident store (``IncidentStore.series`` reads them back)::

    >>> from trainguard.records import Gpu, Sample
    >>> series = Series(step_s=10.0, depth=3)
    >>> for t in (0.0, 5.0, 10.0):
    ...     series.add(t, [Sample(Gpu(0), t, temperature_c=60.0 + t, ecc_sbe_volatile=int(t))], [])
    >>> p = series.points(0)[0]
    >>> p.t, p.n, p["temperature_c"], p["temperature_c_max"], p["ecc_sbe_volatile"]
    (0.0, 2, 62.5, 65.0, 5.0)

Bounded: ``depth`` points per GPU in memory, at most ``depth`` closed points per GPU waiting for
the store (older ones are dropped and counted). A tick keeps each reading's numbers as one tuple;
a step is folded when it closes (benchmarks/bench_agent_tick.py measures both).
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from trainguard.records import Event, EventKind, RecoveryAction, Sample, Throttle

__all__ = ["FIELDS", "NODE", "Series", "SeriesPoint"]

NODE = -1  # the gpu of a point that counts kernel-log events no GPU owns (as the fleet store's)

# Read by their last value in a step: cumulative counters, flags and limits.
_LAST = frozenset({
    "temp_slowdown_c", "temp_shutdown_c", "power_limit_w", "sm_clock_max_mhz", "mem_clock_max_mhz",
    "mem_total_mib", "pcie_gen_max", "pcie_width_max", "nvlink_total",  # limits
    "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate",  # counters
    "retired_sbe", "retired_dbe", "remap_correctable", "remap_uncorrectable", "pcie_replay",
    "nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors", "energy_mj", "nvlink_data_kib",
    "retired_pending", "remap_pending", "remap_failure",  # flags
})  # fmt: skip
_MAXED = ("temperature_c", "memory_temp_c", "power_w")  # also kept as their max: a spike matters
_SPECIAL = frozenset({"gpu", "time", "lost", "error", "throttle", "recovery_action"})
_READ = tuple(f.name for f in fields(Sample) if f.name not in _SPECIAL)  # the numbers of a Sample
_THROTTLES = tuple(Throttle)
_ACTIONS = tuple(RecoveryAction)  # in NVML's code order: 0 none, 1 GPU reset ... 4 drain and reset

# A point's values, in this order.
FIELDS: tuple[str, ...] = (
    *_READ,
    *(f"{name}_max" for name in _MAXED),
    "lost",
    "unread",
    "throttled",
    *(f"throttle_{t.value}" for t in _THROTTLES),
    "recovery_action",
    "events",
    "xids",
)
_INDEX = {name: i for i, name in enumerate(FIELDS)}
_IS_LAST = tuple(name in _LAST for name in _READ)
_MAXED_AT = {_READ.index(name): k for k, name in enumerate(_MAXED)}  # column -> its max's place
_get = operator.attrgetter(*_READ)


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One GPU (or ``NODE``) over one step: ``values`` in `FIELDS` order (None: never read),
    ``xid_codes`` the (Xid, count) pairs of the step, ``uuid`` the GPU's (an index can change
    across reboots; a UUID does not). ``point["temperature_c"]``,
    ``point["xid_79"]`` and ``point.as_dict()`` read it by name."""

    host: str
    gpu: int
    t: float  # start of the step (a multiple of step_s)
    step_s: float
    n: int  # readings folded in (0: only events, or the GPU could not be read)
    values: tuple[float | None, ...]
    xid_codes: tuple[tuple[int, int], ...] = ()
    uuid: str | None = None  # the GPU's UUID, as its readings named it

    def __getitem__(self, name: str) -> float | None:
        if name.startswith("xid_"):
            return float(dict(self.xid_codes).get(int(name[4:]), 0))
        return self.values[_INDEX[name]]

    def as_dict(self) -> dict[str, float]:
        """The values that were read, by name, each Xid code as ``xid_<code>``."""
        out = {name: v for name, v in zip(FIELDS, self.values, strict=True) if v is not None}
        out.update({f"xid_{code}": float(n) for code, n in self.xid_codes})
        return out

    @classmethod
    def from_dict(
        cls,
        host: str,
        gpu: int,
        t: float,
        step_s: float,
        n: int,
        values: Mapping[str, float],
        uuid: str | None = None,
    ) -> SeriesPoint:
        """A point from `as_dict`'s values (names this version does not know are left out)."""
        codes = sorted(
            (int(k[4:]), int(v)) for k, v in values.items() if k.startswith("xid_") and k[4:].isdigit()
        )
        return cls(host, gpu, t, step_s, n, tuple(values.get(name) for name in FIELDS), tuple(codes), uuid)


class _Step:
    """The readings and events of one GPU in the step being filled. A tick only keeps the
    reading's numbers (one tuple); the folding is done once, when the step closes."""

    __slots__ = (
        "action",
        "events",
        "lost",
        "rows",
        "said",
        "t",
        "throttled",
        "throttles",
        "unread",
        "uuid",
        "xids",
    )

    def __init__(self, t: float) -> None:
        self.t, self.lost, self.unread, self.events = t, 0, 0, 0
        self.said = self.throttled = 0  # readings that said their throttle reasons; any reason active
        self.rows: list[tuple[Any, ...]] = []
        self.throttles: list[frozenset[Throttle]] = []
        self.action: float | None = None
        self.xids: dict[int, int] = {}
        self.uuid: str | None = None

    def fold(self, s: Sample) -> None:
        self.rows.append(_get(s))
        if s.lost:
            self.lost += 1
        if s.temperature_c is None and s.util_gpu_pct is None:
            self.unread += 1  # a hang's precursor: ever more readings time out
        elif s.throttle is not None:
            self.said += 1
            self.throttled += bool(s.throttle)
        if s.throttle is not None:
            self.throttles.append(s.throttle)
        if s.recovery_action is not None:
            self.action = float(_ACTIONS.index(s.recovery_action))
        if s.gpu.uuid:
            self.uuid = s.gpu.uuid

    def count(self, ev: Event) -> None:
        self.events += 1
        if ev.kind is EventKind.XID and ev.xid is not None:
            self.xids[ev.xid] = self.xids.get(ev.xid, 0) + 1

    def point(self, host: str, gpu: int, step_s: float) -> SeriesPoint:
        n = len(self.rows)
        read: list[float | None] = [None] * len(_READ)
        maxes: list[float | None] = [None] * len(_MAXED)
        for i, column in enumerate(zip(*self.rows, strict=True)):  # NaN (v != v): NVML could not read
            if _IS_LAST[i]:
                read[i] = next((float(v) for v in reversed(column) if v is not None and v == v), None)
                continue
            try:
                total = sum(column)  # every reading had it: the common case, summed in C
            except TypeError:  # some could not say (None)
                total = math.nan
            seen = column if total == total else [v for v in column if v is not None and v == v]
            if seen:
                read[i] = (total if seen is column else sum(seen)) / len(seen)
                if i in _MAXED_AT:
                    maxes[_MAXED_AT[i]] = float(max(seen))
        shares: list[float | None] = [None] * len(_THROTTLES)
        if self.throttles:  # a share of all readings, those that could not say counted as not active
            shares = [sum(r in t for t in self.throttles) / n for r in _THROTTLES]
        anyone = self.throttled / self.said if self.said else None  # of the readings that said
        counts = (float(self.lost), float(self.unread)) if n else (None, None)
        values = (
            *read, *maxes, *counts, anyone, *shares, self.action,
            float(self.events), float(sum(self.xids.values())),
        )  # fmt: skip
        return SeriesPoint(host, gpu, self.t, step_s, n, values, tuple(sorted(self.xids.items())), self.uuid)


class Series:
    """The recent points of every GPU of one node (see the module docstring)."""

    def __init__(self, step_s: float = 60.0, depth: int = 360, host: str = "") -> None:
        if not 0 < step_s < math.inf or depth < 1:
            raise ValueError(f"a series needs step_s > 0 and depth >= 1 (got {step_s}, {depth})")
        self.step_s, self.depth, self.host = step_s, depth, host
        self._open: dict[int, _Step] = {}
        self._rings: dict[int, deque[SeriesPoint]] = {}
        self._closed: deque[SeriesPoint] = deque()
        self.dropped = 0  # closed points nobody took before the outbox was full

    def add(
        self,
        now: float,
        samples: Iterable[Sample],
        events: Iterable[Event],
        gpu_of: Callable[[Event], int | None] = lambda ev: None,
    ) -> None:
        """Fold one tick in: its readings, and its kernel-log events (``gpu_of`` says whose)."""
        t = math.floor(now / self.step_s) * self.step_s
        for gpu in [g for g, step in self._open.items() if step.t != t]:
            self._close(gpu)
        for s in samples:
            self._step(s.gpu.index, t).fold(s)
        for ev in events:
            owner = gpu_of(ev)
            self._step(NODE if owner is None else owner, t).count(ev)

    def _step(self, gpu: int, t: float) -> _Step:
        step = self._open.get(gpu)
        if step is None:
            step = self._open[gpu] = _Step(t)
        return step

    def _close(self, gpu: int) -> None:
        point = self._open.pop(gpu).point(self.host, gpu, self.step_s)
        ring = self._rings.get(gpu)
        if ring is None:
            ring = self._rings[gpu] = deque(maxlen=self.depth)
        ring.append(point)
        self._closed.append(point)
        while len(self._closed) > self.depth * max(1, len(self._rings)):
            self._closed.popleft()
            self.dropped += 1

    def points(self, gpu: int) -> tuple[SeriesPoint, ...]:
        """The closed points of one GPU, oldest first (at most ``depth``)."""
        return tuple(self._rings.get(gpu, ()))

    def newest(self, gpu: int) -> SeriesPoint | None:
        """The newest closed point of one GPU (a detector's check for a step that closed)."""
        ring = self._rings.get(gpu)
        return ring[-1] if ring else None

    def gpus(self) -> list[int]:
        return sorted(self._rings)

    def take_closed(self) -> list[SeriesPoint]:
        """The points closed since the last call (for the store), oldest first."""
        out = list(self._closed)
        self._closed.clear()
        return out
