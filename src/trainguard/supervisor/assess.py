"""Judge: from one `Observation` to at most one `Trouble`, the policy's input and the incident's.

Pure functions over plain data (exit codes, error records, classified log events, heartbeats,
the node verdict, numerics findings): `supervisor.observe` gathers, this module judges,
`recover.policy.decide` decides, the supervisor acts. The root cause is the earliest causal
failure (`trainguard.incidents.first_failure`): a rank killed at t=10 makes its peers fail with
"connection closed by peer" at t=10.2; those are symptoms.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainguard.detect.numerics import sources_of
from trainguard.incidents import Evidence, RootCause, first_failure, suspects
from trainguard.records import HARDWARE_CATEGORIES, Category, Event, Finding, Health, Severity
from trainguard.recover.policy import Trouble, TroubleKind, error_signature
from trainguard.rundir import ErrorRecord, WorkerExit
from trainguard.supervisor.attempt import Attempt, History
from trainguard.supervisor.logs import default_classifier

if TYPE_CHECKING:
    from trainguard.supervisor.hang import HangReport
    from trainguard.supervisor.observe import Observation

EXIT_GRACE_S = 10.0  # a rank that said goodbye may take this long to exit once its peers have
STRAGGLER_FACTOR = 3.0  # steps this many times the run's baseline make a straggler


def assess(obs: Observation, attempt: Attempt, history: History) -> Trouble | None:
    """The one trouble this look shows, most severe first: a worker exited, a GPU went bad, the
    ranks hang, the numbers went bad, a rank straggles, a node waits to join. None: all is well."""
    failed = [
        Exited(attempt.rank_of[lr], lr, c, attempt.exits_seen.get(lr, obs.time))
        for lr, c in obs.codes.items()
        if c not in (None, 0)
    ]
    if failed:
        ranks = set(attempt.rank_of.values())
        errors = [
            e
            for e in obs.errors
            if e.rank in ranks and e.attempt == attempt.number and e.time >= attempt.started - 1
        ]
        gpu_of = {r: attempt.gpu_of_rank(r) for r in ranks}
        trouble = exit_trouble(
            obs.time,
            failed,
            errors,
            attempt.events,
            list(obs.failed_gpu_findings),
            gpu_of,
            dict(obs.gpu_health),
            default_classifier(),
            oom_killed=obs.oom_kills > 0,
        )
        return drill_started(trouble, attempt, history)
    if obs.verdict is not None:
        for gv in obs.verdict.gpus:
            g = gv.gpu.index
            if g not in attempt.gpu_map.gpus or gv.health in (Health.OK, Health.UNKNOWN):
                continue
            key = ("gpu", g, gv.health, tuple(gv.reasons))
            if key in history.reported:
                continue
            trouble = gpu_trouble(obs.time, g, gv.health, list(gv.findings), attempt.rank_of_gpu(g))
            return drill_started(replace(trouble, extra={**trouble.extra, "key": key}), attempt, history)
    if obs.hang is not None:
        return drill_started(hang_trouble(obs, attempt), attempt, history)
    numerics = numerics_trouble(obs, attempt, history)
    if numerics is not None:
        return numerics
    prog = obs.progress
    fresh = [r for r in prog.nan_ranks if obs.nan_steps.get(r) not in history.numerics_incidents]
    if fresh:  # heartbeats: a trainer without the Guard's findings, or before they land
        step = min((obs.nan_steps[r] for r in fresh if r in obs.nan_steps), default=None)
        named = tuple(sorted(r for r in fresh if obs.nan_steps.get(r) == step))
        return _numerics(obs, attempt, named, step, "heartbeat", obs.time, "reported a non-finite loss")
    straggler = straggler_trouble(obs, attempt, history)
    if straggler is not None:
        return straggler
    if obs.nodes_waiting > 0:
        return Trouble(
            kind=TroubleKind.MEMBERSHIP,
            detected_by="rendezvous",
            time=obs.time,
            started=obs.time,
            summary="a node is waiting to join: re-form the group",
        )
    return None


def workers_done(obs: Observation, attempt: Attempt, grace_s: float = EXIT_GRACE_S) -> tuple[int, ...] | None:
    """None while the job runs; once every worker finished, the local ranks still to end: those
    that said goodbye (an "exit" heartbeat) but linger, e.g. in destroy_process_group, past a
    grace after their peers exited."""
    codes = obs.codes
    if codes and all(c == 0 for c in codes.values()):
        return ()
    done = [lr for lr, c in codes.items() if c == 0]
    running = [lr for lr, c in codes.items() if c is None]
    if not done or not running or len(done) + len(running) != len(codes):
        return None
    if not all(obs.phases.get(attempt.rank_of[lr]) == "exit" for lr in running):
        return None
    if obs.time - min(attempt.exits_seen.get(lr, obs.time) for lr in done) < grace_s:
        return None
    return tuple(running)


def numerics_trouble(obs: Observation, attempt: Attempt, history: History) -> Trouble | None:
    """The earliest step with a non-finite loss or a spike the Guard reported and no incident yet,
    naming the ranks that produced it (every rank reports the agreed value; the Guard's findings
    say whose own loss it was)."""
    bad = [
        (key, rank, step, f)
        for key, rank, step, f in obs.findings
        if key not in history.reported
        and (f.rule.startswith("numerics.nonfinite") or f.rule == "numerics.loss_spike")
        and (step is None or step not in history.numerics_incidents)
    ]
    if not bad:
        return None
    step = bad[0][2]
    same = [row for row in bad if row[2] == step]
    f = same[0][3]
    named = tuple(sorted({r for _, _, _, g in same for r in sources_of(g)}))
    what = f.reason.removesuffix(", from rank " + ", ".join(map(str, sources_of(f))))
    trouble = _numerics(obs, attempt, named, step, "numerics", f.time or obs.time, what)
    evidence = (*trouble.evidence, f"{f.rule}: {f.reason}", *[str(e) for e in f.evidence[:4]])
    return replace(trouble, evidence=evidence, extra={**trouble.extra, "keys": [k for k, *_ in same]})


def _numerics(
    obs: Observation,
    attempt: Attempt,
    ranks: tuple[int, ...],
    step: int | None,
    by: str,
    started: float,
    what: str,
) -> Trouble:
    """A numerics incident: where it came from is the rank(s) and GPU(s) named; why is open
    until a rollback replays the step (`numerics_verdicts`)."""
    gpus = tuple(g for r in ranks if (g := attempt.gpu_of_rank(r)) is not None)
    where = ", ".join(
        f"rank {r}" + (f" (GPU {g})" if (g := attempt.gpu_of_rank(r)) is not None else "") for r in ranks
    )
    summary = (
        f"{where}: {what}" if ranks else f"{what} (every rank saw the agreed value; no rank's own loss was)"
    )
    return Trouble(
        kind=TroubleKind.NUMERICS,
        category="numerics",
        gpu=gpus[0] if len(gpus) == 1 else None,
        fatal=False,
        detected_by=by,
        time=obs.time,
        started=started,
        summary=summary[:300],
        root_cause=RootCause.UNKNOWN,
        rank=ranks[0] if ranks else None,
        ranks=ranks,
        gpus=gpus,
        evidence=(
            suspects(
                (RootCause.SILENT_DATA_CORRUPTION, "if it does not come back when the step is replayed"),
                (RootCause.SOFTWARE_BUG, "data, code or hyper-parameters, if it does"),
            ),
        ),
        extra={"step": step, "ranks": list(ranks), "gpus": list(gpus)},
    )


@dataclass(frozen=True, slots=True)
class NumericsUpdate:
    """What a later Guard finding tells about an open numerics incident."""

    key: tuple[Any, ...]
    step: int  # the incident's step
    changes: dict[str, Any]


def numerics_verdicts(obs: Observation, history: History) -> list[NumericsUpdate]:
    """Updates for numerics incidents: the trainer rolled back (the action taken), and the replay
    verdict: the NaN vanished (transient: silent data corruption suspect) or came back (the
    program's: data, code, hyper-parameters)."""
    out = []
    for key, _rank, step, f in obs.findings:
        if key in history.reported or step is None:
            continue
        if f.rule == "numerics.rollback":  # reported at the step in progress, after the bad one
            before = [s for s in history.numerics_incidents if s <= step]
            if before:
                changes = {"action": "rollback", "resolved": True, "resolution": f.reason}
                out.append(NumericsUpdate(key, max(before), changes))
        elif step in history.numerics_incidents and f.rule in ("numerics.transient", "numerics.data_problem"):
            cause = (
                RootCause.SILENT_DATA_CORRUPTION if f.rule == "numerics.transient" else RootCause.SOFTWARE_BUG
            )
            incident = history.numerics_incidents[step]
            evidence = (
                *[e for e in incident.evidence if not str(e).startswith("unknown; suspects")],
                f.reason,
            )
            changes = {"root_cause": cause, "evidence": evidence, "resolved": True, "resolution": f.reason}
            out.append(NumericsUpdate(key, step, changes))
    return out


def hang_trouble(obs: Observation, attempt: Attempt) -> Trouble:
    assert obs.hang is not None
    prog, report = obs.progress, obs.hang
    suspects = report.laggards
    gpu = attempt.gpu_of_rank(suspects[0]) if len(suspects) == 1 else None
    named = ", ".join(f"rank {r} ({report.reasons[r]})" for r in suspects) or "no single rank stands out"
    cause, why = hang_cause(report, attempt.events)
    return Trouble(
        kind=TroubleKind.HANG,
        gpu=gpu,
        gpu_health=obs.gpu_health.get(gpu) if gpu is not None else None,
        detected_by="heartbeat",
        time=obs.time,
        started=prog.last_progress,
        summary=f"no progress for {obs.time - prog.last_progress:.1f}s (timeout {prog.timeout:.1f}s); "
        f"laggard: {named}",
        root_cause=cause,
        rank=suspects[0] if len(suspects) == 1 else None,
        ranks=tuple(suspects),
        evidence=(*why, f"method: {report.method}", *report.dumps),
        extra={"laggards": list(suspects), "method": report.method},
    )


def hang_cause(report: HangReport, events: list[Event]) -> tuple[RootCause, tuple[str, ...]]:
    """Why the ranks stopped progressing, as far as the evidence goes. A collective timing out is
    the network's only when the collective library says so; a laggard outside any collective is
    not a network fault at all."""
    nccl = [e for e in events if e.category in (Category.NCCL_TIMEOUT_HANG, Category.NCCL_NETWORK)]
    stopped = [r for r in report.laggards if "state T" in report.reasons.get(r, "")]
    if stopped:
        return RootCause.HOST, (
            f"rank {stopped[0]}'s process was stopped (SIGSTOP, job control or a debugger)",
        )
    if report.laggards:
        where = {
            "flight_recorder": "never issued the collective the others wait in",
            "stacks": "was outside any collective while the others waited in one",
            "proc_state": "did not answer a stack dump (uninterruptible sleep?)",
        }.get(report.method, "fell behind the others")
        return RootCause.UNKNOWN, (
            suspects(
                (RootCause.SOFTWARE_BUG, f"the laggard {where}: its own code, data loading or I/O"),
                (RootCause.HOST, "the laggard's host: memory pressure, CPU, storage"),
                (RootCause.FAULTY_GPU, "the laggard's GPU stopped processing"),
            ),
        )
    if nccl:
        return RootCause.NCCL_WATCHDOG_TIMEOUT, (nccl[0].text,)
    return RootCause.UNKNOWN, (
        suspects(
            (RootCause.NETWORK_SWITCH_CABLE, "every rank waits in a collective"),
            (RootCause.HOST, "no rank stands out and no collective library reported a timeout"),
        ),
    )


def straggler_trouble(obs: Observation, attempt: Attempt, history: History) -> Trouble | None:
    """Steps much slower than the run's baseline, reported once per attempt (and not at all
    once a degraded GPU was reported: that incident already names the cause)."""
    prog, base = obs.progress, obs.baseline_step_time
    slow = base and prog.step_time and prog.step_time > STRAGGLER_FACTOR * base
    if not slow or attempt.straggler_reported or history.degraded_reported:
        return None
    assert base is not None and prog.step_time is not None
    suspect = obs.degraded_gpu
    rank = attempt.rank_of_gpu(suspect)
    if rank is None and len(prog.waits) >= 2:  # all share step_time; the straggler waits least
        rank = min(prog.waits, key=lambda r: prog.waits[r])
        suspect = attempt.gpu_of_rank(rank)
    return Trouble(
        kind=TroubleKind.STRAGGLER,
        gpu=suspect,
        fatal=False,
        detected_by="heartbeat",
        time=obs.time,
        started=obs.time,
        summary=f"steps take {prog.step_time:.2f}s vs {base:.2f}s baseline",
        rank=rank,
    )


def drill_started(trouble: Trouble, attempt: Attempt, history: History) -> Trouble:
    """A chaos drill knows when its fault really happened: that is the incident's start, so the
    detection delay is measured, not guessed (a SIGKILL leaves no timestamp of its own)."""
    for inj in reversed(history.injected):
        if inj.time >= attempt.started - 1 and (trouble.rank is None or inj.rank in (None, trouble.rank)):
            return replace(
                trouble,
                started=min(trouble.started, inj.time),
                extra={"injected": inj.index, **trouble.extra},
            )
    return trouble


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
) -> Trouble:
    """One or more local workers exited non-zero: what happened, and where it started.

    ``oom_killed``: the kernel's OOM killer fired meanwhile (the cgroup counter went up); only
    then is a SIGKILL the host's (host memory). An OOM-killer line in the logs says the same."""
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
    first = first_failure(items)
    root_rank = first.rank if first is not None else None
    if root_rank is None:
        root_rank = min(exited, key=lambda e: e.seen).rank if exited else None
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
    kind = TroubleKind.PROCESS_EXIT
    codes = {e.code for e in exited if e.rank == root_rank}
    if WorkerExit.HANG.value in codes:
        kind = TroubleKind.HANG
    elif WorkerExit.NUMERICS_STOP.value in codes:
        kind = TroubleKind.NUMERICS
    elif WorkerExit.PREEMPTED.value in codes:
        kind = TroubleKind.MEMBERSHIP
    gpu = gpu_of_rank.get(root_rank) if root_rank is not None else None
    failed_gpus = [g for g in gpu_of_rank.values() if g is not None and gpu_health.get(g) is Health.FAILED]
    category = first.category if first is not None else None
    if failed_gpus and (gpu is None or gpu not in failed_gpus):
        gpu = failed_gpus[0]
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
