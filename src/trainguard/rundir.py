"""The run directory: how a training process talks to the supervisor and the agent, through files.

Torch-free and documented so that any trainer (PyTorch, JAX, a shell script) can speak it::

    $TRAINGUARD_RUN_DIR/
      heartbeat/rank<R>.jsonl   one JSON object per line, appended by rank R:
                                {"rank": R, "step": S, "time": unix_s, "loss": float|null,
                                 "step_time": s|null, "pid": P, "attempt": A, "phase": "train",
                                 "wait": s|null}
                                phase is one of init | train | checkpoint | exit. "wait" (optional):
                                seconds the rank waited for its peers in the step's agreement
                                all-reduce; all ranks share step_time, the straggler waits least.
                                Readers take the last complete line.
      errors/rank<R>.json       written once, atomically, when rank R dies of an uncaught exception:
                                {"rank", "time", "pid", "attempt", "step", "exc_type", "message",
                                 "traceback"}. The earliest "time" across ranks is the root cause.
      dumps/rank<R>-<unix>.txt  hang dumps: every thread's Python stack (+ .fr flight recorder)
      control.json              the other way, supervisor -> ranks: the supervisor's requests
                                (a checkpoint now), versioned; see `trainguard.control`
      findings/rank<R>.jsonl    findings rank R raised in the loop (numerics, hang), one JSON per line:
                                {"rank", "step", "rule", "health", "action", "reason", "gpu", "time",
                                 "category", "evidence"}  (records.Finding plus rank and step)

The supervisor sets TRAINGUARD_RUN_DIR and TRAINGUARD_ATTEMPT for every worker it starts; under
``--replica-groups N`` each group's supervisor and workers also get REPLICA_GROUP_ID (0..N-1) and
NUM_REPLICA_GROUPS (N), the names torchft's examples read (`replica_group`).
A worker that leaves on purpose says why with its exit code (``WorkerExit``; see docs/guard.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from trainguard.actions import Advice
from trainguard.records import Category, Finding, Health


class WorkerExit(IntEnum):
    """Exit codes of a worker that leaves on purpose (trainguard.torch.guard.Guard), so the
    supervisor can tell a decision from a crash. Chosen clear of shells' 126-165 and sysexits."""

    OK = 0
    PREEMPTED = 83  # a preemption signal arrived: a checkpoint was saved, restart anywhere
    HANG = 84  # the hang watchdog fired: stacks and the flight-recorder trace are in dumps/
    NUMERICS_STOP = 85  # NaN/Inf or a loss spike under the "stop" policy (see findings/)


RUN_DIR_ENV = "TRAINGUARD_RUN_DIR"
ATTEMPT_ENV = "TRAINGUARD_ATTEMPT"
REPLICA_GROUP_ENV = "REPLICA_GROUP_ID"
NUM_REPLICA_GROUPS_ENV = "NUM_REPLICA_GROUPS"

_TAIL_BYTES = 4096  # a heartbeat line is ~150 bytes; the last one always fits


@dataclass(frozen=True, slots=True)
class Heartbeat:
    rank: int
    step: int
    time: float
    loss: float | None = None
    step_time: float | None = None
    pid: int | None = None
    attempt: int = 0
    phase: str = "train"
    wait: float | None = None


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    rank: int
    time: float
    exc_type: str
    message: str
    traceback: str = ""
    pid: int | None = None
    attempt: int = 0
    step: int | None = None


def run_dir_from_env(environ: dict[str, str] | None = None) -> Path | None:
    value = (os.environ if environ is None else environ).get(RUN_DIR_ENV)
    return Path(value) if value else None


def replica_group_env(group: int, groups: int) -> dict[str, str]:
    """The environment that makes a process part of replica group ``group`` of ``groups``."""
    return {REPLICA_GROUP_ENV: str(group), NUM_REPLICA_GROUPS_ENV: str(groups)}


def replica_group(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(group, groups) of a process started under ``--replica-groups``; None outside one (or
    when the environment is unreadable).

    >>> replica_group(replica_group_env(1, 2)), replica_group({})
    ((1, 2), None)
    """
    env = os.environ if environ is None else environ
    try:
        return int(env[REPLICA_GROUP_ENV]), int(env.get(NUM_REPLICA_GROUPS_ENV, "1"))
    except (KeyError, ValueError):
        return None


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "heartbeat" / f"rank{rank}.jsonl"


def error_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "errors" / f"rank{rank}.json"


def dumps_dir(run_dir: Path) -> Path:
    return run_dir / "dumps"


def findings_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "findings" / f"rank{rank}.jsonl"


def append_finding(run_dir: Path, rank: int, finding: Finding, step: int | None = None) -> None:
    """Append one finding of rank R (one O_APPEND write: a reader never sees half a line)."""
    path = findings_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"rank": rank, "step": step}
    for name in Finding.__slots__:
        value = getattr(finding, name)
        record[name] = list(value) if isinstance(value, tuple) else value
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record, allow_nan=True) + "\n").encode())
    finally:
        os.close(fd)


def discarded_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "discarded" / f"rank{rank}.jsonl"


def append_discarded(run_dir: Path, rank: int, step: int, start: float, end: float) -> None:
    """Record that rank R's try at ``step`` (from ``start`` to ``end``) was discarded: its
    replica group did not commit it (a failed quorum or all-reduce, a Guard that rejected it)."""
    path = discarded_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "step": step, "start": start, "end": end, "pid": os.getpid()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def read_discarded(run_dir: Path, rank: int = 0) -> list[tuple[int, float, float]]:
    """Rank R's discarded steps as (step, start, end), oldest first; bad lines are skipped."""
    try:
        data = discarded_path(run_dir, rank).read_bytes()
    except OSError:
        return []
    out = [d for d in map(parse_discarded, data.split(b"\n")) if d is not None]
    return sorted(out, key=lambda t: t[1])


def parse_discarded(line: bytes) -> tuple[int, float, float] | None:
    """One line of a discarded-steps file as (step, start, end); None for a bad line."""
    r = _parse(line)
    try:
        return None if r is None else (int(r["step"]), float(r["start"]), float(r["end"]))
    except (KeyError, TypeError, ValueError):
        return None


def read_findings(run_dir: Path) -> list[tuple[int, int | None, Finding]]:
    """Every (rank, step, Finding) the ranks recorded, oldest first; bad lines are skipped."""
    out: list[tuple[float, int, int | None, Finding]] = []
    for path in sorted((run_dir / "findings").glob("rank*.jsonl")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for line in data.split(b"\n"):
            r = _parse(line)
            if r is None:
                continue
            try:
                f = Finding(
                    rule=r["rule"],
                    health=Health(r["health"]),
                    action=Advice(r["action"]),
                    reason=r["reason"],
                    gpu=r.get("gpu"),
                    time=r.get("time"),
                    category=Category(r["category"]) if r.get("category") else None,
                    evidence=tuple(r.get("evidence") or ()),
                )
                out.append((f.time or 0.0, int(r["rank"]), r.get("step"), f))
            except (KeyError, TypeError, ValueError):
                continue
    out.sort(key=lambda t: t[0])
    return [(rank, step, f) for _, rank, step, f in out]


class HeartbeatWriter:
    """Appends heartbeats for one rank. One unbuffered write per beat: cheap, and a reader
    never sees half a line unless the process died mid-write (then the line is skipped)."""

    def __init__(self, run_dir: Path, rank: int, attempt: int = 0) -> None:
        path = heartbeat_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._rank, self._attempt, self._pid = rank, attempt, os.getpid()

    def beat(
        self,
        step: int,
        loss: float | None = None,
        step_time: float | None = None,
        phase: str = "train",
        now: float | None = None,
        wait: float | None = None,
    ) -> None:
        record = {
            "rank": self._rank,
            "step": step,
            "time": time.time() if now is None else now,
            "loss": loss,
            "step_time": step_time,
            "pid": self._pid,
            "attempt": self._attempt,
            "phase": phase,
        }
        if wait is not None:
            record["wait"] = wait
        os.write(self._fd, (json.dumps(record, allow_nan=True) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_tail(path: Path, nbytes: int) -> str:
    """The last ``nbytes`` of a log file as text (a rank's stderr, a launcher's log); "" when it
    cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_last_heartbeat(path: Path) -> Heartbeat | None:
    """The last complete heartbeat in a file, or None if there is none (missing, empty, torn)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.split(b"\n")):
        record = _parse(line)
        if record is not None:
            try:
                return Heartbeat(**{k: record[k] for k in record if k in Heartbeat.__slots__})
            except TypeError:
                continue
    return None


def read_heartbeats(path: Path) -> list[Heartbeat]:
    """Every complete heartbeat in a file, oldest first (for reports and straggler analysis)."""
    beats: list[Heartbeat] = []
    try:
        data = path.read_bytes()
    except OSError:
        return beats
    for line in data.split(b"\n"):
        record = _parse(line)
        if record is None:
            continue
        try:
            beats.append(Heartbeat(**{k: record[k] for k in record if k in Heartbeat.__slots__}))
        except TypeError:
            continue
    return beats


def write_error(run_dir: Path, record: ErrorRecord) -> Path:
    """Write a rank's error file atomically (temp file, fsync, rename): it is read after a crash."""
    path = error_path(run_dir, record.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({s: getattr(record, s) for s in ErrorRecord.__slots__}, indent=1)
    atomic_write_bytes(path, data.encode())
    return path


def read_errors(run_dir: Path) -> list[ErrorRecord]:
    """Every rank's error record, earliest first: the first is the root cause."""
    records: list[ErrorRecord] = []
    for path in sorted((run_dir / "errors").glob("rank*.json")):
        try:
            raw = json.loads(path.read_text())
            records.append(ErrorRecord(**{k: raw[k] for k in raw if k in ErrorRecord.__slots__}))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(records, key=lambda r: r.time)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, os.replace, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(line: bytes) -> dict[str, Any] | None:
    line = line.strip()
    if not line.startswith(b"{") or not line.endswith(b"}"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
