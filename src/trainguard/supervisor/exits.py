"""Judging worker deaths: which rank failed first and why (pure).

The root cause of a group's failure is the earliest causal failure
(`trainguard.incidents.first_failure`): a rank killed at t=10 makes its peers fail with
"connection closed by peer" at t=10.2; those are symptoms. `supervisor.assess` calls these for
the exits an `Observation` shows; a GPU the node agent failed is judged here too.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.incidents import Evidence, RootCause, first_failure, suspects
from trainguard.records import HARDWARE_CATEGORIES, Category, Event, Finding, Health, Severity
from trainguard.rundir import ErrorRecord, WorkerExit
from trainguard.supervisor.policy import Trouble, TroubleKind, error_signature

# A process stopped by a signal never exits; whoever sent it is not in the evidence.
STOPPED_SUSPECTS = (
    (RootCause.DEPENDENCY, "the scheduler suspended it, or an operator stopped it (SIGSTOP, SIGTSTP)"),
    (RootCause.HOST, "its host stopped it: a debugger attached, a frozen cgroup"),
)


@dataclass(frozen=True, slots=True)
class Exited:
    rank: int  # global rank
    local_rank: int
    code: int  # negative: killed by signal -code
    seen: float  # when the supervisor first saw it exited


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    try:
        return f"exited {code} ({WorkerExit(code).name})"
    except ValueError:
        return f"exited {code}"


def exit_trouble(
    now: float,
    exited: list[Exited],
    errors: list[ErrorRecord],
    events: list[Event],
    findings: list[Finding],
    gpu_of_rank: dict[int, int | None],
    gpu_health: dict[int, Health | None],
    classify: Any = None,
    oom_killed: bool = False,
    stopped: Sequence[int] = (),
    preemption_exit_code: int | None = None,
) -> Trouble:
    """One or more local workers exited non-zero: what happened, and where it started.

    ``oom_killed``: the kernel's OOM killer fired meanwhile (the cgroup counter went up); only
    then is a SIGKILL the host's (host memory). An OOM-killer line in the logs says the same.
    ``stopped``: ranks alive but stopped (process state T) meanwhile: a failure of their own,
    which their peers' reports of a lost task (TF's coordination service) only follow.
    ``preemption_exit_code``: the script's own save-on-SIGTERM exit (TF's
    PreemptionCheckpointHandler exits 42 on every worker once they saved): read as the Guard's
    PREEMPTED, a membership change restarted free, not a crash."""
    items: list[Any] = list(errors) + list(events) + list(findings)
    for rec in errors:  # an error file's CUDA message says more than "an exception"
        ev = classify(f"{rec.exc_type}: {rec.message}") if classify else None
        if ev is not None and ev.category in HARDWARE_CATEGORIES:
            items.append(
                Evidence(
                    _hw_cause(ev.category),
                    rec.time,
                    ev.text,
                    source="error_file",
                    category=ev.category.value,
                    rank=rec.rank,
                )
            )
    for ex in exited:
        if ex.code < 0 and not any(r.rank == ex.rank for r in errors):
            cause = RootCause.HOST if ex.code == -signal.SIGKILL else RootCause.UNKNOWN
            items.append(
                Evidence(
                    cause,
                    ex.seen,
                    f"rank {ex.rank} {describe_exit(ex.code)}",
                    source="exit_code",
                    rank=ex.rank,
                )
            )
    for rank in stopped:
        items.append(
            Evidence(
                RootCause.UNKNOWN,
                None,  # seen now, not when it stopped: it counts after any timed failure
                f"rank {rank} is stopped (process state T) while its peers failed",
                source="process_state",
                rank=rank,
                suspects=STOPPED_SUSPECTS,
            )
        )
    first = first_failure(items)
    root_rank, gpu = culprit(first, exited, gpu_of_rank, gpu_health)
    root_err = next((r for r in errors if r.rank == root_rank), None)
    cause = first.cause if first is not None else RootCause.UNKNOWN
    notes: list[str] = []
    unproven_kill = first is not None and first.source == "exit_code" and first.cause is RootCause.HOST
    if unproven_kill and oom_killed:
        notes.append("the kernel's OOM killer fired (memory cgroup oom_kill counter went up)")
    elif unproven_kill:
        cause = RootCause.UNKNOWN
        notes.append(
            suspects(
                (RootCause.HOST, "an OOM killer, but no OOM-killer line or cgroup oom_kill event was seen"),
                (RootCause.DEPENDENCY, "the scheduler, an operator or a drill killed it"),
            )
        )
    elif first is not None and first.cause is RootCause.UNKNOWN and first.suspects:
        notes.append(suspects(*first.suspects))  # what the line cannot decide between, for the reader
    kind = TroubleKind.PROCESS_EXIT
    codes = {e.code for e in exited if e.rank == root_rank}
    if WorkerExit.HANG.value in codes:
        kind = TroubleKind.HANG
    elif WorkerExit.NUMERICS_STOP.value in codes:
        kind = TroubleKind.NUMERICS
    elif WorkerExit.PREEMPTED.value in codes or (
        preemption_exit_code is not None and preemption_exit_code in codes
    ):
        kind = TroubleKind.MEMBERSHIP
        if WorkerExit.PREEMPTED.value not in codes:
            notes.append(f"exit {preemption_exit_code}: the script's preemption handler saved, then exited")
    category = first.category if first is not None else None
    hw = category in HARDWARE_CATEGORIES or (gpu is not None and gpu_health.get(gpu) is Health.FAILED)
    signature = None
    if root_err is not None and not hw and (first is None or first.cause is RootCause.SOFTWARE_BUG):
        signature = error_signature(root_err.exc_type, root_err.message, root_err.traceback)
    started = wall_time(first.time, now) if first is not None else None
    if started is None:
        started = min((e.seen for e in exited), default=now)
    how = "; ".join(f"rank {e.rank} {describe_exit(e.code)}" for e in sorted(exited, key=lambda e: e.seen))
    summary = first.text if first is not None and first.text else how
    evidence = [*notes, how, *[f"rank {r.rank}: {r.exc_type}: {r.message}" for r in errors][:8]]
    evidence += [e.text for e in events if e.severity in (Severity.ERROR, Severity.FATAL)][:8]
    evidence += [f"{f.rule}: {f.reason}" for f in findings][:8]
    return Trouble(
        kind=kind,
        signature=signature,
        category=category,
        gpu=gpu,
        gpu_health=gpu_health.get(gpu) if gpu is not None else None,
        detected_by="error_file" if root_err is not None else "exit_code",
        time=now,
        started=min(started, now),
        summary=summary[:300],
        root_cause=cause,
        rank=root_rank,
        evidence=tuple(evidence),
    )


def culprit(
    first: Evidence | None,
    exited: list[Exited],
    gpu_of_rank: dict[int, int | None],
    gpu_health: dict[int, Health | None],
) -> tuple[int | None, int | None]:
    """The rank and GPU a failure started on, the rank always the one on that GPU.

    A GPU of ours that the agent failed is the culprit (the failed GPU the first failure names or
    whose rank it names, else the first failed one), and so is the rank on it, whichever rank the
    evidence or the exits named first: a GPU that fell off the bus leaves an Xid that names no
    rank, and one slow poll can see its peers' exits together with its own. Without a failed GPU:
    the first failure's rank, else the rank whose exit was seen first."""
    rank = first.rank if first is not None else None
    ours = [g for g in gpu_of_rank.values() if g is not None]
    gpu = gpu_of_rank.get(rank) if rank is not None else None
    if first is not None and first.gpu in ours:
        gpu = first.gpu
    failed = [g for g in ours if gpu_health.get(g) is Health.FAILED]
    if failed and gpu not in failed:
        gpu = failed[0]
    on_gpu = [r for r, g in gpu_of_rank.items() if gpu is not None and g == gpu]
    if on_gpu and rank not in on_gpu:
        seen = {e.rank: e.seen for e in exited}
        rank = min(on_gpu, key=lambda r: (seen.get(r, math.inf), r))
    if rank is None and exited:
        rank = min(exited, key=lambda e: e.seen).rank
    if gpu is None and rank is not None:
        gpu = gpu_of_rank.get(rank)
    return rank, gpu


def gpu_trouble(now: float, gpu: int, health: Health, findings: list[Finding], rank: int | None) -> Trouble:
    """The node agent says a GPU one of our ranks uses is FAILED or DEGRADED."""
    first = first_failure(findings)
    fatal = health is Health.FAILED
    kind = TroubleKind.GPU_FAILED if fatal else TroubleKind.GPU_DEGRADED
    reasons = [f.reason for f in findings] or [f"GPU {gpu} is {health.value}"]
    times = [t for f in findings if (t := wall_time(f.time, now)) is not None]
    return Trouble(
        kind=kind,
        category=first.category if first else None,
        gpu=gpu,
        gpu_health=health,
        fatal=fatal,
        detected_by="kernel_log" if any("xid" in f.rule.lower() for f in findings) else "telemetry",
        time=now,
        started=min(times, default=now),
        summary=f"GPU {gpu} {health.value}: {reasons[0]}"[:300],
        root_cause=first.cause if first else RootCause.UNKNOWN,
        rank=rank,
        evidence=tuple(reasons[:8]),
    )


def wall_time(t: float | None, now: float) -> float | None:
    """A timestamp if it is wall-clock time near ``now``; kernel-log lines carry seconds since
    boot (dmesg), which must not be mistaken for when a failure started."""
    return t if t is not None and now - 86400 < t <= now + 5 else None


def _hw_cause(category: Category) -> RootCause:
    return RootCause.GPU_HBM_MEMORY if category is Category.GPU_MEMORY_ECC else RootCause.FAULTY_GPU


TEARDOWN_SIGNALS = (signal.SIGABRT, signal.SIGSEGV)  # abort(), or faulthandler crashing while it reports one


def aborted_after_finishing(
    code: int | None, last_phase: str | None, has_error: bool, stderr_tail: str
) -> bool:
    """A rank that finished cleanly and then died in interpreter teardown.

    With DDP or FSDP on gloo, the process group's C++ threads can outlive
    ``destroy_process_group``; at exit their destructor calls ``std::terminate`` ("terminate called
    without an active exception"), and faulthandler reports the abort with no Python frame left
    (or itself crashes with SIGSEGV while walking the dying threads). The work is done: the rank
    said goodbye (its last heartbeat is "exit") and left no error file. Restarting would redo
    nothing and abort again.
    """
    if code not in tuple(-s for s in TEARDOWN_SIGNALS) or last_phase != "exit" or has_error:
        return False
    cxx_terminate = "terminate called without an active exception" in stderr_tail
    outside_python = "Fatal Python error: Aborted" in stderr_tail and "<no Python frame>" in stderr_tail
    return cxx_terminate or outside_python
