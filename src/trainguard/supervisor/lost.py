"""A previous supervisor of the same job that died without finishing (``kill -9``, a node reboot).

A supervisor started on an existing job id looks for the run it continues: the job is still
"running" in the store, and the supervisor that ran it (``logs/<host>-<pid>/``, on this host)
is gone. Its bookkeeping died with it (the goodput ledger is written at the end), so what it
left on disk is read back: when it started (the store), how far training got and when
(heartbeats), and when anything last happened (its files' modification times). The new
supervisor then records one interruption: the previous run's time (productive up to its last
sign of life, or unmeasured without heartbeats), the time nobody supervised the job
(downtime), and an incident whose lost work is the steps since the checkpoint it resumes from.

Supervisors of other hosts (several nodes, one job id) are never judged: their pids mean
nothing here.

Light on purpose: `next_attempt` and `node_name` are on `trainguard run`'s path to its workers'
start, so the incident types load only when a lost run is recorded.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.incidents import Incident, Interval
    from trainguard.incidents.goodput import JobInfo


def node_name() -> str:
    """This supervisor's name, ``host:pid``; its logs go to ``logs/<host>-<pid>/``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class LostRun:
    node: str  # host:pid of the supervisor that was lost
    started: float  # the job's start, as that supervisor recorded it
    last_seen: float  # its latest sign of life: a heartbeat, a log line, an incident
    next_attempt: int  # attempts it started: the new supervisor's first attempt number
    first_step_time: float | None  # first heartbeat of a training step (None: no heartbeats)
    furthest_step: int | None  # furthest step any rank reported


def find_lost_run(info: JobInfo | None, run_dir: Path, host: str | None = None) -> LostRun | None:
    """The unfinished previous run of this job on this host, if its supervisor is gone."""
    if info is None or info.status != "running" or info.started is None:
        return None
    host = host or socket.gethostname()
    logs = run_dir / "logs"
    nodes = [d for d in _dirs(logs) if d.name.rsplit("-", 1)[0] == host]
    mine = [d for d in nodes if _pid(d.name) is not None]
    if not mine or any(_alive(_pid(d.name)) for d in mine):
        return None
    newest = max(mine, key=lambda d: d.stat().st_mtime)
    files = [p for d in mine for p in d.rglob("*") if p.is_file()]
    files += [p for p in (run_dir / "heartbeat").glob("*.jsonl")] + [run_dir / "incidents.jsonl"]
    last_seen = max([info.started, *(_mtime(p) for p in files)])
    first, furthest = _heartbeats(run_dir)
    return LostRun(
        node=f"{host}:{_pid(newest.name)}",
        started=info.started,
        last_seen=last_seen,
        next_attempt=next_attempt(run_dir),
        first_step_time=first,
        furthest_step=furthest,
    )


def next_attempt(run_dir: Path) -> int:
    """The attempt number after every attempt any supervisor of this job started here: a
    re-run continues the numbering, so its heartbeats are never taken for an older attempt's."""
    logs = run_dir / "logs"
    attempts = [int(a.name[7:]) for d in _dirs(logs) for a in _dirs(d) if a.name[7:].isdigit()]
    return max(attempts, default=-1) + 1


def lost_run_record(
    lost: LostRun, job: str, now: float, resume_at: float | None = None
) -> tuple[Incident, list[Interval]]:
    """The interruption to record for it (pure): one incident and the previous run's intervals.
    ``resume_at``: when the previous run reported the step the new one resumes from; the work
    after it is lost (redone)."""
    from trainguard.actions import JobAction
    from trainguard.incidents import Incident, Interval, IntervalKind, RootCause

    attempt = max(0, lost.next_attempt - 1)
    ran = IntervalKind.PRODUCTIVE if lost.first_step_time is not None else IntervalKind.UNMEASURED
    intervals = [
        Interval(job, IntervalKind.INIT, lost.started, lost.first_step_time or lost.started, attempt),
        Interval(job, ran, lost.first_step_time or lost.started, lost.last_seen, attempt, "supervisor lost"),
        Interval(job, IntervalKind.DOWNTIME, lost.last_seen, now, attempt, "no supervisor"),
    ]
    if resume_at is not None and lost.first_step_time is not None:
        intervals.append(
            Interval(job, IntervalKind.LOST, resume_at, lost.last_seen, attempt, "after the checkpoint")
        )
    step = "no steps reported" if lost.furthest_step is None else f"last step reported {lost.furthest_step}"
    incident = Incident(
        job=job,
        time=now,
        root_cause=RootCause.UNKNOWN,
        action=JobAction.RESTART,
        summary=f"supervisor {lost.node} was lost (killed?) without finishing the job; {step}",
        started=lost.last_seen,
        category="supervisor_lost",
        evidence=(
            f"job still 'running' in the store; supervisor {lost.node} is gone",
            f"its last sign of life {now - lost.last_seen:.1f}s before this supervisor started",
        ),
        attempt=attempt,
        detected_by="supervisor_restart",
        detection_delay_s=max(0.0, now - lost.last_seen),
    )
    return incident, [iv for iv in intervals if iv.end > iv.start]


def step_reached_at(run_dir: Path, step: int | None) -> float | None:
    """When a rank first reported finishing ``step`` (the checkpointed step a resume starts
    from: the work after it is redone); None without heartbeats. The Guard beats once per loss
    window, so the step a checkpoint was taken at may show only in that checkpoint's own beat."""
    if step is None:
        return None
    times = [
        beat["time"]
        for path in (run_dir / "heartbeat").glob("rank*.jsonl")
        for beat in _beats(path)
        if beat.get("phase") in ("train", "checkpoint") and beat.get("step", -1) >= step - 1  # from 0
    ]
    return min(times, default=None)


def _beats(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            beat = json.loads(line)
        except ValueError:
            continue
        if isinstance(beat, dict) and isinstance(beat.get("time"), (int, float)):
            out.append(beat)
    return out


def _heartbeats(run_dir: Path) -> tuple[float | None, int | None]:
    first: float | None = None
    furthest: int | None = None
    for path in (run_dir / "heartbeat").glob("rank*.jsonl"):
        for beat in _beats(path):
            if beat.get("phase") == "train" and isinstance(beat.get("step"), int):
                first = min(first or beat["time"], beat["time"])
                furthest = max(furthest or 0, beat["step"])
    return first, furthest


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def _pid(name: str) -> int | None:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
