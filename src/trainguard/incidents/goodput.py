"""The goodput ledger: where a job's wall-clock time went, and its ETTR.

The supervisor records timed intervals per job (`Interval`: productive steps, checkpoint
stalls, restarts, initialisation, lost work, detection delay, downtime); `goodput()` folds them
into a `GoodputSummary`. ETTR (effective training time ratio, as Meta defines it for its research
clusters) is productive time / wall time. A run whose workers reported no steps (a script
without the Guard's heartbeats) has `unmeasured` time, and then no ETTR (None, shown "n/a"):
zero would be a lie, and so would any other number.

Intervals may overlap; each instant is charged to ONE kind, the first of `PRECEDENCE` that covers
it. So a supervisor can record a whole attempt as productive and then lay a checkpoint stall, or
the lost work since the last checkpoint, over it, and neither is counted twice::

    >>> ivs = [Interval("j", IntervalKind.PRODUCTIVE, 0, 100), Interval("j", IntervalKind.LOST, 80, 100),
    ...        Interval("j", IntervalKind.RESTART, 100, 110, attempt=1)]
    >>> s = goodput(ivs, 0, 120)
    >>> s.productive_s, s.lost_s, s.restart_s, s.unaccounted_s, round(s.ettr, 3)
    (80.0, 20.0, 10.0, 10.0, 0.667)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class IntervalKind(str, Enum):
    PRODUCTIVE = "productive"  # training steps whose results were kept
    CHECKPOINT = "checkpoint"  # training blocked on a checkpoint save
    INIT = "init"  # (launcher, then) worker start to the first completed step (imports, rendezvous, load)
    RESTART = "restart"  # tearing down the failed attempt and launching the next
    LOST = "lost"  # work thrown away: steps since the last checkpoint, recomputed later
    DETECTION = "detection"  # from the failure to its detection (e.g. a hang until the timeout)
    DOWNTIME = "downtime"  # waiting: backoff, diagnostics, a spare node
    UNMEASURED = "unmeasured"  # workers ran, but reported no steps (no heartbeats): not known


# Highest first: an instant covered by several intervals is charged to the first listed.
PRECEDENCE: tuple[IntervalKind, ...] = (
    IntervalKind.DETECTION,
    IntervalKind.LOST,
    IntervalKind.DOWNTIME,
    IntervalKind.RESTART,
    IntervalKind.INIT,
    IntervalKind.CHECKPOINT,
    IntervalKind.PRODUCTIVE,
    IntervalKind.UNMEASURED,
)


@dataclass(frozen=True, slots=True)
class Interval:
    job: str
    kind: IntervalKind
    start: float
    end: float
    attempt: int = 0
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", IntervalKind(self.kind))
        object.__setattr__(self, "start", float(self.start))
        object.__setattr__(self, "end", float(self.end))


@dataclass(frozen=True, slots=True)
class JobInfo:
    job: str
    name: str | None = None
    command: str | None = None
    started: float | None = None
    ended: float | None = None
    status: str | None = None  # running | succeeded | failed | crash_loop | ...
    world_size: int | None = None


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """A sampled training step (for the timeline plot), not one row per step."""

    job: str
    time: float
    step: int
    loss: float | None = None
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class GoodputSummary:
    wall_s: float
    productive_s: float
    checkpoint_s: float
    init_s: float
    restart_s: float
    lost_s: float
    detection_s: float
    downtime_s: float
    unaccounted_s: float  # wall time no interval covers
    ettr: float | None  # productive_s / wall_s (0.0 for an empty window); None: not measured
    interruptions: int
    attempts: int
    unmeasured_s: float = 0.0  # workers ran without reporting steps: productive or not, unknown

    @property
    def badput_s(self) -> float:
        return self.wall_s - self.productive_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def goodput(intervals: Iterable[Interval], wall_start: float, wall_end: float) -> GoodputSummary:
    """Fold a job's intervals, clipped to [wall_start, wall_end], into a summary.

    An interruption is an attempt that ended in failure: one with detection or lost time, or
    one followed by a later attempt.
    """
    ivs = [iv for iv in intervals if iv.end > iv.start]
    wall = max(0.0, wall_end - wall_start)
    raw = _charge(ivs, wall_start, wall_end)
    # Shown rounded to the microsecond (float sums of many short intervals otherwise print as
    # 431.79999995); rounding is monotonic, so no part exceeds the wall. ETTR uses the raw sums.
    charged = {k: round(v, 6) for k, v in raw.items()}
    attempts = sorted({iv.attempt for iv in ivs})
    failed = {iv.attempt for iv in ivs if iv.kind in (IntervalKind.DETECTION, IntervalKind.LOST)}
    failed |= set(attempts[:-1])
    ettr: float | None = min(1.0, raw[IntervalKind.PRODUCTIVE] / wall) if wall > 0 else 0.0
    if charged[IntervalKind.UNMEASURED] > 0:
        ettr = None  # part of the run reported no steps: its productive share cannot be known
    return GoodputSummary(
        wall_s=round(wall, 6),
        productive_s=charged[IntervalKind.PRODUCTIVE],
        checkpoint_s=charged[IntervalKind.CHECKPOINT],
        init_s=charged[IntervalKind.INIT],
        restart_s=charged[IntervalKind.RESTART],
        lost_s=charged[IntervalKind.LOST],
        detection_s=charged[IntervalKind.DETECTION],
        downtime_s=charged[IntervalKind.DOWNTIME],
        unaccounted_s=round(max(0.0, wall - sum(raw.values())), 6),
        ettr=ettr,
        interruptions=len(failed),
        attempts=len(attempts),
        unmeasured_s=charged[IntervalKind.UNMEASURED],
    )


def charged_spans(
    intervals: Iterable[Interval], kind: IntervalKind, lo: float, hi: float
) -> list[tuple[float, float]]:
    """The spans of [lo, hi] charged to ``kind`` (as `goodput` charges them), merged, in order:
    a group's productive spans, with its restarts and lost work laid over them taken out."""
    spans: list[tuple[float, float]] = []
    for start, end, top in _segments([iv for iv in intervals if iv.end > iv.start], lo, hi):
        if top is not kind:
            continue
        if spans and spans[-1][1] >= start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def _charge(ivs: list[Interval], lo: float, hi: float) -> dict[IntervalKind, float]:
    """Charge each elementary segment to its top-precedence kind."""
    charged = dict.fromkeys(IntervalKind, 0.0)
    for start, end, top in _segments(ivs, lo, hi):
        charged[top] += end - start
    return charged


def _segments(ivs: list[Interval], lo: float, hi: float) -> list[tuple[float, float, IntervalKind]]:
    """Sweep the boundaries: each elementary segment some interval covers, with its top kind."""
    out: list[tuple[float, float, IntervalKind]] = []
    edges: list[tuple[float, int, IntervalKind]] = []
    for iv in ivs:
        start, end = max(iv.start, lo), min(iv.end, hi)
        if end > start:
            edges += [(start, 1, iv.kind), (end, -1, iv.kind)]
    edges.sort(key=lambda e: e[0])
    active = dict.fromkeys(IntervalKind, 0)
    prev: float | None = None
    for t, delta, kind in edges:
        if prev is not None and t > prev:
            top = next((k for k in PRECEDENCE if active[k] > 0), None)
            if top is not None:
                out.append((prev, t, top))
        active[kind] += delta
        prev = t
    return out
