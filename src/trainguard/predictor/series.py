"""The series a failure predictor reads: per GPU, one `Point` per step of down-sampled readings
and kernel-log event counts, oldest first. Stdlib only.

    agent tick: Samples + Events --(fold, per GPU and step)--> Point --(the last N)--> GpuSeries
                                                                                       -> predictor

A point keeps only what the model reads: gauges by their mean over the step (temperature,
utilisation, power, SM clock, the share of readings with a throttle reason), counters by their
last value (ECC, remapped rows, PCIe replays, NVLink CRC errors), how many readings the step
took (``n``), how many of them came back empty (``missed``: NVML timed out) and whether the GPU
was lost, and the Xid events the kernel log named it in. The names are those of the node
agent's telemetry series (a ``SeriesPoint``'s ``as_dict()``), so `point_of_values` turns one of
its points into this one::

    >>> from trainguard.records import Gpu, Sample
    >>> fold = Fold(t=0.0)
    >>> fold.add(Sample(Gpu(0), 0.0, temperature_c=60.0, ecc_sbe_aggregate=3))
    >>> fold.add(Sample(Gpu(0), 30.0, error="NVML: Timeout"))
    >>> p = fold.point(step_s=60.0)
    >>> p.n, p.missed, p.temperature_c, p.ecc_sbe_aggregate
    (2, 1, 60.0, 3.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainguard.records import Sample

__all__ = ["COUNTERS", "GAUGES", "Fold", "GpuSeries", "Point", "point_of_values"]

GAUGES = ("temperature_c", "temp_slowdown_c", "util_gpu_pct", "power_w", "power_limit_w", "sm_clock_mhz",
          "sm_clock_max_mhz")  # fmt: skip
COUNTERS = ("ecc_sbe_aggregate", "ecc_dbe_aggregate", "remap_correctable", "remap_uncorrectable",
            "pcie_replay", "nvlink_crc_errors")  # fmt: skip
_LIMITS = frozenset({"temp_slowdown_c", "power_limit_w", "sm_clock_max_mhz"})  # read by their last value


@dataclass(frozen=True, slots=True)
class Point:
    """One GPU over one step (None: not read in the step)."""

    t: float  # start of the step
    step_s: float
    n: int = 0  # readings taken
    missed: int = 0  # readings that came back with nothing (a timeout, an error)
    lost: bool = False  # the GPU stopped answering
    temperature_c: float | None = None
    temp_slowdown_c: float | None = None
    util_gpu_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    throttled: float | None = None  # share of readings with any throttle reason
    ecc_sbe_aggregate: float | None = None
    ecc_dbe_aggregate: float | None = None
    remap_correctable: float | None = None
    remap_uncorrectable: float | None = None
    pcie_replay: float | None = None
    nvlink_crc_errors: float | None = None
    xids: int = 0  # kernel-log Xid events naming this GPU


@dataclass(frozen=True, slots=True)
class GpuSeries:
    """The recent points of one GPU, oldest first."""

    host: str
    gpu: int
    points: tuple[Point, ...]


class Fold:
    """The readings and Xid events of one GPU in one step, folded into a `Point`."""

    def __init__(self, t: float) -> None:
        self.t = t
        self.n = self.missed = self.xids = 0
        self.lost = False
        self.sums = dict.fromkeys(GAUGES, 0.0)
        self.counts = dict.fromkeys(GAUGES, 0)
        self.last: dict[str, float] = {}
        self.throttled = 0
        self.throttle_read = 0

    def add(self, s: Sample) -> None:
        self.n += 1
        if s.lost:
            self.lost = True
        if s.temperature_c is None and s.util_gpu_pct is None:
            self.missed += 1  # NVML answered nothing for this GPU
            return
        for k in GAUGES:
            v = getattr(s, k)
            if v is not None:
                if k in _LIMITS:
                    self.last[k] = float(v)
                else:
                    self.sums[k] += v
                    self.counts[k] += 1
        for k in COUNTERS:
            v = getattr(s, k)
            if v is not None:
                self.last[k] = float(v)
        if s.throttle is not None:
            self.throttle_read += 1
            self.throttled += bool(s.throttle)

    def point(self, step_s: float) -> Point:
        gauges = {
            k: (
                self.last.get(k)
                if k in _LIMITS
                else self.sums[k] / self.counts[k]
                if self.counts[k]
                else None
            )
            for k in GAUGES
        }
        return Point(
            t=self.t,
            step_s=step_s,
            n=self.n,
            missed=self.missed,
            lost=self.lost,
            throttled=self.throttled / self.throttle_read if self.throttle_read else None,
            xids=self.xids,
            **gauges,
            **{k: self.last.get(k) for k in COUNTERS},
        )


def point_of_values(t: float, step_s: float, n: int, values: Mapping[str, float | None]) -> Point:
    """A point from the agent series' values by name (``SeriesPoint.as_dict()``): ``missed`` is
    its ``unread`` (readings with nothing in them), the throttle share its ``throttled`` (any
    reason; from a store written without it, the largest per-reason share)."""
    throttled = values.get("throttled")
    if throttled is None and "unread" not in values:  # a point written before the series had both
        shares = [v for k, v in values.items() if k.startswith("throttle_") and v is not None]
        throttled = max(shares) if shares else None
    fields = {k: values.get(k) for k in (*GAUGES, *COUNTERS)}
    return Point(
        t=t,
        step_s=step_s,
        n=n,
        missed=int(values.get("unread") or 0),
        lost=bool(values.get("lost")),
        throttled=throttled,
        xids=int(values.get("xids") or 0),
        **fields,
    )


def last_points(points: Sequence[Point], n: int) -> tuple[Point, ...]:
    """The newest ``n`` points (all of them when there are fewer)."""
    return tuple(points[-n:])
