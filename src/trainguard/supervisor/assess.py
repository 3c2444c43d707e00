"""Judge: from one `Observation` to at most one `Trouble`, the policy's input and the incident's.

Pure functions over plain data (exit codes, error records, classified log events, heartbeats,
the node verdict, numerics findings): `supervisor.observe` gathers, this module judges,
`supervisor.policy.decide` decides, the supervisor acts. Worker deaths are judged in
`supervisor.exits`. Root causes follow from evidence, not from which detector fired; where the
evidence cannot separate causes, the trouble says "unknown" and lists the suspects. When a trouble
started is what the run itself saw (the first timestamped evidence, the last progress before a
hang), never a chaos drill's injection time: a drill's report compares the two, labelled as such.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainguard.actions import StepAction
from trainguard.detect.numerics import sources_of
from trainguard.incidents import RootCause, suspects
from trainguard.records import HARDWARE_CATEGORIES, Category, Event, Health
from trainguard.supervisor.attempt import Attempt, History
from trainguard.supervisor.balance import balance_trouble, balancing, only_slow
from trainguard.supervisor.exits import Exited, exit_trouble, gpu_trouble
from trainguard.supervisor.logs import default_classifier
from trainguard.supervisor.peers import peer_node_trouble
from trainguard.supervisor.policy import Trouble, TroubleKind
from trainguard.supervisor.watch import straggler

if TYPE_CHECKING:
    from trainguard.supervisor.hang import HangReport
    from trainguard.supervisor.observe import Observation

EXIT_GRACE_S = 10.0  # a rank that said goodbye may take this long to exit once its peers have


def assess(obs: Observation, attempt: Attempt, history: History) -> Trouble | None:
    """The one trouble this look shows, most severe first: a worker exited (on a multi-node job,
    maybe because a peer node failed: `peers`), a GPU went bad, the ranks hang, the numbers went
    bad, the ranks moved their shares (`supervisor.balance`), a rank straggles, a node waits to
    join. None: all is well."""
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
            stopped=sorted(obs.stopped),
            preemption_exit_code=obs.preemption_exit_code,
        )
        lost = peer_node_trouble(
            trouble, attempt.node, attempt.ranks, attempt.peers, errors, attempt.events, obs.last_errors
        )
        if lost is not None:
            return lost
        return with_fingerprint(trouble, obs, attempt)
    if obs.verdict is not None:
        for gv in obs.verdict.gpus:
            g = gv.gpu.index
            if g not in attempt.gpu_map.gpus or gv.health in (Health.OK, Health.UNKNOWN):
                continue
            key = ("gpu", g, gv.health, tuple(gv.reasons))
            if key in history.reported:
                continue
            trouble = gpu_trouble(obs.time, g, gv.health, list(gv.findings), attempt.rank_of_gpu(g))
            # only slow, in a job that balances: its share follows its speed first (supervisor.balance)
            slow = gv.health is Health.DEGRADED and balancing(obs) and only_slow(gv.findings)
            return replace(
                trouble, extra={**trouble.extra, "key": key, **({"balancing": True} if slow else {})}
            )
    if obs.hang is not None:
        return hang_trouble(obs, attempt)
    numerics = numerics_trouble(obs, attempt, history)
    if numerics is not None:
        return numerics
    prog = obs.progress
    fresh = [r for r in prog.nan_ranks if obs.nan_steps.get(r) not in history.numerics_incidents]
    if fresh:  # heartbeats: a trainer without the Guard's findings, or before they land
        step = min((obs.nan_steps[r] for r in fresh if r in obs.nan_steps), default=None)
        named = tuple(sorted(r for r in fresh if obs.nan_steps.get(r) == step))
        return _numerics(obs, attempt, named, step, "heartbeat", obs.time, "reported a non-finite loss")
    moved = balance_trouble(obs, attempt, history)
    if moved is not None:
        return moved
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
                changes = {"action": StepAction.ROLLBACK.value, "resolved": True, "resolution": f.reason}
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


def with_fingerprint(trouble: Trouble, obs: Observation, attempt: Attempt) -> Trouble:
    """The trouble with its rank's fingerprint when it is the script's own failure before any
    step (a missing file, an import or syntax error, an exception at start-up): such a failure is
    the same on every try, and the policy stops it on the second. A hardware, network or host
    cause, or an attempt that made a step, keeps the fingerprint out."""
    own = trouble.root_cause in (RootCause.SOFTWARE_BUG, RootCause.UNKNOWN)
    if trouble.kind is not TroubleKind.PROCESS_EXIT or attempt.first_step_seen or not own:
        return trouble
    if trouble.category in HARDWARE_CATEGORIES or trouble.rank is None:
        return trouble
    found = obs.fingerprints.get(trouble.rank)
    return replace(trouble, fingerprint=found) if found else trouble


def hang_trouble(obs: Observation, attempt: Attempt) -> Trouble:
    """No progress: from heartbeats (no step within the learned timeout) or, for a script that
    writes none, from process state (every rank without CPU time or output, `supervisor.idle`)."""
    assert obs.hang is not None
    prog, report = obs.progress, obs.hang
    idle = obs.idle_since is not None
    since = obs.idle_since if obs.idle_since is not None else prog.last_progress
    timeout = obs.idle_timeout if idle else prog.timeout
    what = "every rank idle (no CPU, no output)" if idle else "no progress"
    suspects = report.laggards
    gpu = attempt.gpu_of_rank(suspects[0]) if len(suspects) == 1 else None
    named = ", ".join(f"rank {r} ({report.reasons[r]})" for r in suspects) or "no single rank stands out"
    cause, why = hang_cause(report, attempt.events)
    return Trouble(
        kind=TroubleKind.HANG,
        gpu=gpu,
        gpu_health=obs.gpu_health.get(gpu) if gpu is not None else None,
        detected_by="process_state" if idle else "heartbeat",
        time=obs.time,
        started=since,
        summary=f"{what} for {obs.time - since:.1f}s (timeout {timeout:.1f}s); laggard: {named}",
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
    """A sustained slowdown one rank causes (`watch.straggler`), reported once per attempt (and
    not at all once a degraded GPU was reported: that incident already names the cause)."""
    if attempt.straggler_reported or history.degraded_reported:
        return None
    slow = straggler(
        dict(obs.step_times),
        obs.baseline_step_time,
        dict(obs.progress.waits),
        attempt.rank_of_gpu(obs.degraded_gpu),
    )
    if slow is None:
        return None
    return Trouble(
        kind=TroubleKind.STRAGGLER,
        gpu=attempt.gpu_of_rank(slow.rank),
        fatal=False,
        detected_by="heartbeat",
        time=obs.time,
        started=obs.time,
        summary=f"steps take {slow.step_time:.2f}s vs {slow.baseline:.2f}s baseline",
        rank=slow.rank,
    )
