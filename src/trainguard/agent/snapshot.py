"""What the daemon publishes after each tick, for the HTTP side to read without locks.

``Snapshot`` is frozen and replaced whole (one reference assignment), so a request always sees
one consistent tick. ``Tally`` holds the counters that only grow (Prometheus counters: every
finding, incident, kernel event and refused request is counted, none overwritten); ``History``
the recent readings per GPU for the charts, bounded by a time window.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainguard.records import Event, Finding, Health, NodeVerdict, Sample

# One chart point: time and the readings the dashboard draws, None when unreadable.
CHART_FIELDS = ("temperature_c", "power_w", "sm_clock_mhz", "mem_used_pct", "util_gpu_pct", "ecc_errors")
ChartPoint = tuple[float | None, ...]  # JSON-ready: None, never NaN


@dataclass(frozen=True, slots=True)
class Snapshot:
    seq: int  # 0 before the first tick
    time: float  # when the tick sampled (the agent's clock)
    hostname: str
    verdict: NodeVerdict | None = None
    samples: tuple[Sample, ...] = ()
    health: Health = Health.UNKNOWN  # the agent's own health: can it see, store and remember?
    problems: tuple[str, ...] = ()  # why the agent's health is not ok
    started: float = 0.0
    tick_s: float = 0.0  # how long the last tick took
    interval_s: float = 1.0


@dataclass(slots=True)
class Tally:
    """Counters that only grow; ``copy()`` is what a scrape reads."""

    findings: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # category, action, health
    incidents: Counter[tuple[str, str]] = field(default_factory=Counter)  # root cause, action
    kernel_events: Counter[tuple[str, str]] = field(default_factory=Counter)  # kind, category
    xids: Counter[tuple[int, int]] = field(default_factory=Counter)  # gpu, xid
    last_xid: dict[int, int] = field(default_factory=dict)  # gpu -> latest Xid (dcgm-exporter's gauge)
    errors: Counter[str] = field(
        default_factory=Counter
    )  # telemetry | kernel_log | detector | store | series | state | act
    refusals: Counter[str] = field(default_factory=Counter)  # HTTP refusals by reason
    incidents_dropped: int = 0
    ticks: int = 0
    latency_sum: float = 0.0
    latency_count: int = 0
    latency_buckets: Counter[float] = field(default_factory=Counter)  # cumulative at render time
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def copy(self) -> Tally:
        with self.lock:
            return Tally(
                Counter(self.findings),
                Counter(self.incidents),
                Counter(self.kernel_events),
                Counter(self.xids),
                dict(self.last_xid),
                Counter(self.errors),
                Counter(self.refusals),
                self.incidents_dropped,
                self.ticks,
                self.latency_sum,
                self.latency_count,
                Counter(self.latency_buckets),
            )

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.refusals[reason] += 1

    def count_tick(
        self,
        new: Iterable[Finding],
        events: Iterable[Event],
        gpu_of: Callable[[Event], int | None],
        detector_failures: int = 0,
    ) -> None:
        """One tick recorded: its new findings, its kernel-log events (each Xid by GPU) and the
        failures it had (telemetry, kernel log, detectors)."""
        new = list(new)
        with self.lock:
            self.ticks += 1
            for f in new:
                self.findings[(f.category.value if f.category else "", f.action.value, f.health.value)] += 1
            for ev in events:
                self.kernel_events[(ev.kind.value, ev.category.value)] += 1
                if ev.xid is not None:
                    gpu = gpu_of(ev)
                    if gpu is not None:
                        self.xids[(gpu, ev.xid)] += 1
                        self.last_xid[gpu] = ev.xid
            if any(f.rule == "telemetry" for f in new):
                self.errors["telemetry"] += 1
            if any(f.rule == "kernel_log" for f in new):
                self.errors["kernel_log"] += 1
            if detector_failures:
                self.errors["detector"] += detector_failures

    def observe_latency(self, new: Iterable[Finding], published: float, tick_s: float) -> None:
        """Detection latency of each new finding: from its evidence's own time when that is a
        real clock's, else the tick's duration."""
        with self.lock:
            for f in new:
                lat = published - f.time if f.time is not None and 0 <= published - f.time < 3600 else tick_s
                self.latency_sum += lat
                self.latency_count += 1
                for b in LATENCY_BUCKETS:
                    if lat <= b:
                        self.latency_buckets[b] += 1


# Why the HTTP side refuses a request (trainguard_http_refusals_total{reason}); all exported from 0.
REFUSALS = (
    "unauthenticated",
    "wrong_token",
    "forbidden",
    "token_in_query",
    "path_traversal",
    "oversized",
    "method",
    "rate_limited",
    "bad_request",
    "not_found",
    "too_many_connections",
    "evicted",
    "write_timeout",
)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class History:
    """The last ``window_s`` seconds of chart points per GPU (bounded: old points fall off)."""

    def __init__(self, window_s: float, interval_s: float) -> None:
        self.window_s = window_s
        self._maxlen = max(2, int(window_s / interval_s) + 2)
        self._points: dict[int, deque[ChartPoint]] = {}
        self._lock = threading.Lock()

    def resize(self, interval_s: float) -> None:
        with self._lock:
            self._maxlen = max(2, int(self.window_s / interval_s) + 2)
            self._points = {i: deque(p, maxlen=self._maxlen) for i, p in self._points.items()}

    def add(self, samples: tuple[Sample, ...]) -> None:
        with self._lock:
            for s in samples:
                ring = self._points.get(s.gpu.index)
                if ring is None:
                    ring = self._points[s.gpu.index] = deque(maxlen=self._maxlen)
                ring.append(chart_point(s))

    def since(self, t: float) -> dict[int, list[ChartPoint]]:
        """Points newer than ``t`` per GPU index."""
        with self._lock:
            rings = {i: list(p) for i, p in self._points.items()}
        out: dict[int, list[ChartPoint]] = {}
        for i, points in rings.items():
            # points are in time order: scan back from the newest
            k = len(points)
            while k > 0 and (points[k - 1][0] or 0.0) > t:
                k -= 1
            out[i] = points[k:]
        return out


def chart_point(s: Sample) -> ChartPoint:
    def f(v: float | int | None) -> float | None:
        return None if v is None else round(float(v), 2)

    mem = s.mem_used_mib / s.mem_total_mib * 100 if s.mem_used_mib is not None and s.mem_total_mib else None
    ecc = None
    if s.ecc_sbe_volatile is not None or s.ecc_dbe_volatile is not None:
        ecc = (s.ecc_sbe_volatile or 0) + (s.ecc_dbe_volatile or 0)
    return (s.time, f(s.temperature_c), f(s.power_w), f(s.sm_clock_mhz), f(mem), f(s.util_gpu_pct), f(ecc))
