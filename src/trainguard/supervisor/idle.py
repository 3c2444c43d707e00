"""Hang evidence for scripts that write no heartbeats: process state, CPU time and output.

A training script that never imports trainguard says nothing about its steps, so "no step for
N seconds" means nothing for it. What exists without the Guard is the ranks' processes: a rank
that computes uses CPU (its own or its data-loader children's), a rank that logs writes output,
a rank in uninterruptible I/O (state ``D``: a checkpoint on a slow filesystem) is busy. A job is
hung when *every* rank has shown none of that for ``timeout`` seconds: all of them parked in a
collective or a wait. A rank spinning on a GPU synchronisation uses CPU and is not caught here
(the Guard's heartbeats and watchdog are what catch that).

``IdleWatch`` samples /proc (the only I/O); ``idle_since`` is the pure judgement.

    >>> a = Activity(time=0.0, cpu_s=1.0, out_bytes=10, state="S")
    >>> b = Activity(time=5.0, cpu_s=1.001, out_bytes=10, state="S")
    >>> active(a, b)
    False
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CPU_SHARE = 0.01  # a rank using less than 1% of a core between two samples shows no work
SAMPLE_EVERY_S = 1.0


@dataclass(frozen=True, slots=True)
class Activity:
    time: float
    cpu_s: float  # user + system time of the rank and its children
    out_bytes: int  # size of the rank's stdout + stderr logs
    state: str | None  # Linux process state of the rank (R, S, D, T, Z), None if unknown


def active(before: Activity, after: Activity) -> bool:
    """Did the rank show work between two samples?"""
    dt = max(after.time - before.time, 1e-9)
    return (
        after.cpu_s - before.cpu_s >= CPU_SHARE * dt
        or after.out_bytes != before.out_bytes
        or after.state in ("R", "D")
    )


def idle_since(last_active: dict[int, float], now: float, timeout: float) -> float | None:
    """When every rank was last active, if all have been idle for longer than ``timeout``."""
    if not last_active:
        return None
    latest = max(last_active.values())
    return latest if now - latest > timeout else None


class IdleWatch:
    """Per attempt: when each rank last showed work (see the module docstring)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._last: dict[int, Activity] = {}
        self._active: dict[int, float] = {}
        self._next = 0.0

    def begin_attempt(self, started: float) -> None:
        self._last, self._active, self._next = {}, {}, started

    def poll(self, now: float, pids: dict[int, int], log_dir: Path) -> float | None:
        """Activity the live ranks (``rank -> pid``; their logs are ``log_dir/rank<R>.std*``) at
        most once a second; the time the job went idle, if it is hung. A timeout <= 0: never."""
        if self.timeout <= 0:
            return None
        if now >= self._next:
            self._next = now + SAMPLE_EVERY_S
            for rank, pid in pids.items():
                logs = [log_dir / f"rank{rank}.{stream}" for stream in ("stdout", "stderr")]
                sample = read_activity(pid, logs, now)
                before = self._last.get(rank)
                if before is None or active(before, sample):
                    self._active[rank] = now
                self._last[rank] = sample
        live = {r: t for r, t in self._active.items() if r in pids}
        return idle_since(live, now, self.timeout)


def read_activity(pid: int, logs: list[Path], now: float) -> Activity:
    cpu, state = _cpu_and_state(pid)
    for child in _children(pid):
        cpu += _cpu_and_state(child)[0]
    out = 0
    for path in logs:
        with contextlib.suppress(OSError):
            out += path.stat().st_size
    return Activity(now, cpu, out, state)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_and_state(pid: int) -> tuple[float, str | None]:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, None
    fields = stat.rsplit(")", 1)[-1].split()
    # after the name: state(0) ... utime(11) stime(12) cutime(13) cstime(14), in clock ticks
    try:
        return sum(int(f) for f in fields[11:15]) / _TICK, fields[0]
    except (IndexError, ValueError):
        return 0.0, None


def _children(pid: int) -> list[int]:
    """Descendants of ``pid`` (data-loader workers, a checkpoint writer)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 256:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = [int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            found += kids
            todo += kids
    return found
