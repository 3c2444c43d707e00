"""Figures the demo's report measures from the run itself (heartbeats, incidents, the ledger),
never from the fault plan: the median step time, the time a slow stretch cost, and the ETTR
the incidents' own time-lost figures predict, and the one the fault-free reference's time
predicts (stdlib only)."""

from __future__ import annotations

import statistics
from itertools import pairwise
from pathlib import Path
from typing import Any

from trainguard.incidents import Incident
from trainguard.rundir import Heartbeat, read_heartbeats

SLOW = 1.5  # a stretch of steps at this many times the median pace or slower is a slowdown


def _beats(run_dir: Path) -> list[Heartbeat]:
    return [
        b
        for path in sorted((run_dir / "heartbeat").glob("rank*.jsonl"))
        for b in read_heartbeats(path)
        if b.phase == "train"
    ]


def train_span(run_dir: Path) -> float | None:
    """Seconds from the run's first training step to its last (any rank's heartbeats)."""
    times = [b.time for b in _beats(run_dir)]
    return max(times) - min(times) if len(times) > 1 else None


def median_step_time(run_dir: Path) -> float | None:
    times = [b.step_time for b in _beats(run_dir) if b.step_time]
    return statistics.median(times) if times else None


def pace(beats: list[Heartbeat]) -> list[tuple[float, float, int]]:
    """(from, to, steps) between consecutive progress of one attempt: the first time any rank
    reported each step, in order (the slowest rank sets the pace of an all-reduce)."""
    first: dict[tuple[int, int], float] = {}
    for b in beats:
        key = (b.attempt, b.step)
        first[key] = min(first.get(key, b.time), b.time)
    ordered = sorted(first.items())
    return [(t0, t1, s1 - s0) for ((a0, s0), t0), ((a1, s1), t1) in pairwise(ordered) if a0 == a1 and t1 > t0]


def slow_time_lost(run_dir: Path, start: float, end: float) -> float | None:
    """Seconds lost to slow steps between ``start`` and ``end`` (unix s): for each stretch run at
    SLOW x the run's median pace or slower, the time beyond that pace. None without heartbeats."""
    spans = pace(_beats(run_dir))
    if not spans:
        return None
    per_step = statistics.median((t1 - t0) / n for t0, t1, n in spans)
    lost = 0.0
    for t0, t1, n in spans:
        if t0 >= start and t1 <= end and (t1 - t0) / n >= SLOW * per_step:
            lost += (t1 - t0) - n * per_step
    return round(lost, 2)


def predicted_ettr(
    goodput: dict[str, Any], incidents: list[Incident], startup_s: float | None
) -> float | None:
    """The ETTR the report's own accounting predicts: wall time less the start-up before the first
    step, the checkpoint stalls and every incident's measured time lost, over the wall time. It
    is computed apart from the ledger's intervals, so the two disagree when either is wrong."""
    wall = goodput.get("wall_s")
    if not wall or startup_s is None:
        return None
    lost = sum(i.time_lost_s for i in incidents if i.time_lost_s is not None)
    return max(0.0, 1.0 - (startup_s + goodput.get("checkpoint_s", 0.0) + lost) / wall)


def reference_ettr(
    goodput: dict[str, Any], train_s: float | None, ref_step_s: float | None, step_s: float | None
) -> float | None:
    """The ETTR the fault-free reference predicts, from neither this run's ledger nor its
    incidents: the time the same steps took without faults (the reference's first step to its
    last, ``train_s``), at this run's pace (scaled by the two runs' median step times, so a busier
    host does not count as lost time), less this run's checkpoint stalls (the ledger counts them
    apart from productive time), over this run's wall time."""
    wall = goodput.get("wall_s")
    if not wall or not train_s or not ref_step_s or not step_s:
        return None
    return max(0.0, min(1.0, (train_s * step_s / ref_step_s - goodput.get("checkpoint_s", 0.0)) / wall))
