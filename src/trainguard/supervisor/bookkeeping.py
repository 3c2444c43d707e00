"""The job's bookkeeping for the monitor loop: incidents, recoveries under way, the ledger's
intervals per attempt, and the finish (`RunResult`).

The loop (`supervisor.supervisor`) decides and acts; it hands what happened to a `Bookkeeper`,
which writes it through the `JobRecorder` (store + run directory) and updates the `History`.
It never touches workers. With replica groups (`supervisor.replicas`) each group has its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainguard.actions import JobAction
from trainguard.incidents import Incident, IntervalKind
from trainguard.rundir import Heartbeat
from trainguard.supervisor.assess import numerics_verdicts
from trainguard.supervisor.attempt import Attempt, History, Pending
from trainguard.supervisor.config import ExitCode
from trainguard.supervisor.observe import Observation
from trainguard.supervisor.peers import peer_left
from trainguard.supervisor.policy import JobDecision, Trouble, TroubleKind
from trainguard.supervisor.record import JobRecorder
from trainguard.supervisor.result import RunResult
from trainguard.supervisor.torn import torn_cause
from trainguard.supervisor.watch import ProgressWatch

log = logging.getLogger(__name__)

HEALTHY_AFTER_S = 10.0  # steady progress this long after a restart: backoff starts over
RUNNING_S = 10.0  # no heartbeats: restarted workers running this long count as recovered

STATUS = {
    ExitCode.OK: "succeeded",
    ExitCode.CRASH_LOOP: "crash_loop",
    ExitCode.NO_CAPACITY: "no_capacity",
    ExitCode.INTERRUPTED: "interrupted",
}


Emit = Callable[..., None]  # emit(kind, **data)


def redone_since(beats: Sequence[Heartbeat], failed_at: float, resume: int, step_time: float) -> float | None:
    """When the work that a failure at ``failed_at`` makes redo began: when the last attempt that
    trained past the resume checkpoint (``resume`` steps done) finished its step ``resume - 1``,
    from its heartbeats (its first beat at or past that step, less the steps between at
    ``step_time``), never before that attempt's first step. The step count as `lost.step_reached_at`
    reads it for a run whose supervisor was lost, within one attempt: a step redone now may have
    been passed by an earlier attempt too. (A count of steps times a step time learned earlier
    misplaces it on a host whose pace changed, as far back as the attempt's start-up, which the
    ledger books already.) None without a beat that far."""
    kept = resume - 1  # the last step whose work the checkpoint holds (steps count from 0)
    before = [b for b in beats if b.time <= failed_at]
    past = [b for b in before if b.step >= kept]
    if not past:
        return None
    last = max(b.attempt for b in past)
    reached = min((b for b in past if b.attempt == last), key=lambda b: (b.step, b.time))
    first = min(b.time for b in before if b.attempt == last)
    return max(first, reached.time - (reached.step - kept) * step_time)


def incident_of(
    job: str,
    node: str,
    trouble: Trouble,
    action: str,
    reason: str,
    attempt: int | None,
    resolution: str | None = None,
) -> Incident:
    """The incident that records ``trouble`` and the ``action`` taken on it for ``reason`` (pure;
    the job loop's and the replica loop's incidents alike). A ``resolution``: resolved already."""
    return Incident(
        job=job,
        time=trouble.time,
        root_cause=trouble.root_cause,
        action=action,
        summary=trouble.summary,
        started=trouble.started,
        category=trouble.category or trouble.kind.value,
        # A diagnostics report is stored whole, after the lines that say what it measured.
        evidence=(reason, *trouble.evidence, *[r for r in [trouble.extra.get("report")] if r]),
        gpu=trouble.gpu,
        node=trouble.extra.get("node") or node,  # a failed peer node: that one
        rank=trouble.rank,
        attempt=attempt,
        detected_by=trouble.detected_by,
        detection_delay_s=max(0.0, trouble.time - trouble.started),
        resolved=resolution is not None,
        resolution=resolution,
    )


class Bookkeeper:
    """Records what the loop saw and did; owns no workers and decides nothing."""

    def __init__(
        self,
        job_id: str,
        node: str,
        recorder: JobRecorder,
        history: History,
        watch: ProgressWatch,
        emit: Emit,
        clock: Callable[[], float],
    ) -> None:
        self.job_id, self.node = job_id, node
        self.recorder, self.history, self.watch = recorder, history, watch
        self.emit, self.clock = emit, clock

    # -- incidents -------------------------------------------------------------------------------

    def incident(self, trouble: Trouble, decision: JobDecision, attempt: int) -> Incident:
        history = self.history
        continuing = decision.verb.keeps_running
        resolution = "workers kept running" if continuing else None
        incident = self.recorder.add(
            incident_of(
                self.job_id, self.node, trouble, decision.verb.value, decision.reason, attempt, resolution
            )
        )
        if "key" in trouble.extra:
            history.reported.add(trouble.extra["key"])
        history.reported.update(trouble.extra.get("keys", ()))
        if trouble.kind is TroubleKind.NUMERICS and trouble.extra.get("step") is not None:
            history.numerics_incidents[trouble.extra["step"]] = incident
        if trouble.kind is TroubleKind.GPU_DEGRADED:
            history.degraded_reported = True
        extra = {k: v for k, v in trouble.extra.items() if k != "report"}  # in the evidence already
        self.emit("incident", **incident.to_dict(), kind=trouble.kind.value, extra=extra)
        log.warning(
            "incident %s: %s -> %s (%s)", incident.id, trouble.summary, decision.verb.value, decision.reason
        )
        return incident

    def numerics(self, obs: Observation) -> None:
        """The Guard's later word on an open numerics incident: its rollback, its replay verdict."""
        history = self.history
        for update in numerics_verdicts(obs, history):
            history.reported.add(update.key)
            incident = history.numerics_incidents[update.step]
            history.numerics_incidents[update.step] = self.recorder.update(incident, **update.changes)

    def skipped_checkpoint(self, attempt: Attempt, step: int, reason: str) -> None:
        """A checkpoint the resume must skip is an incident of its own (storage lost data the job
        relied on), recorded once per checkpoint; the resume itself goes on from an older one."""
        if step in self.history.skipped_checkpoints:
            return
        self.history.skipped_checkpoints.add(step)
        resume = attempt.resume_step
        cause, why = torn_cause(reason)  # what the verification found tells storage from a torn save
        incident = self.recorder.add(
            Incident(
                job=self.job_id,
                time=self.clock(),
                root_cause=cause,
                action=JobAction.SKIP_TORN_CHECKPOINT,
                summary=f"checkpoint step {step} failed verification; resuming from step {resume}",
                category="checkpoint",
                evidence=(reason, *why, {"skipped_step": step, "resume_step": resume}),
                node=self.node,
                attempt=attempt.number,
                detected_by="checkpoint_verify",
                resolved=True,
                resolution=f"resumed from step {resume}",
            )
        )
        self.emit("incident", **incident.to_dict(), kind="checkpoint", extra={"step": step})
        log.warning("incident %s: checkpoint step %d is invalid (%s); skipped", incident.id, step, reason)

    # -- progress and recoveries -----------------------------------------------------------------

    def progress(self, obs: Observation, attempt: Attempt) -> None:
        prog, history = obs.progress, self.history
        first = prog.first_step_time
        if history.failures_in_a_row and first is not None and obs.time - first > HEALTHY_AFTER_S:
            history.failures_in_a_row = 0
        if first is not None and not attempt.first_step_seen:
            attempt.first_step_seen = True
            self.recorder.interval(IntervalKind.INIT, attempt.started, first, attempt.number)
            self.resolve_pending(attempt, first)
        elif history.pending and not obs.heartbeats_seen and obs.time - attempt.started > RUNNING_S:
            self.resolve_pending(attempt, None)  # no heartbeats: the restarted workers run, steps unknown
        if prog.max_step is not None and prog.max_step != attempt.last_step_emitted:
            attempt.last_step_emitted = prog.max_step
            self.emit(
                "progress",
                step=prog.max_step,
                loss=prog.loss,
                step_time=prog.step_time,
                attempt=attempt.number,
            )
            if prog.max_step % 10 == 0:
                self.recorder.progress(obs.time, prog.max_step, prog.loss, attempt.number)

    def resolve_pending(self, attempt: Attempt, first_step_time: float | None) -> None:
        step_time = self.watch.baseline_step_time or 0.0
        resume = attempt.resume_step
        for p in self.history.pending:
            decided = peer_left(p.suspect_nodes, p.suspect_ranks, attempt.peers) if attempt.node else None
            if p.suspect_nodes and decided is not None:
                why = f"node {decided['node']} left the rendezvous: attempt {attempt.number} re-formed without it"
                p.incident = self.recorder.update(p.incident, evidence=(*p.incident.evidence, why), **decided)
            if first_step_time is None:
                self._resolve_unmeasured(attempt, p)
                continue
            known = p.step_before is not None and resume is not None  # else: not measured
            redone = max(0, (p.step_before or 0) - (resume or 0)) if known else 0
            since = redone_since(self.watch.history, p.failed_at, resume or 0, step_time) if redone else None
            if since is None and redone and step_time:  # no heartbeat past the resume step
                since = p.failed_at - redone * step_time
            lost = (first_step_time - p.failed_at) + (p.failed_at - since if since is not None else 0.0)
            if since is not None and since < p.failed_at:
                self.recorder.interval(IntervalKind.LOST, since, p.failed_at, attempt.number - 1)
            self.recorder.update(
                p.incident,
                time_lost_s=round(lost, 3),
                resolved=True,
                resolution=f"resumed at step {resume or 0} (attempt {attempt.number})",
            )
            rec = {
                "incident": p.incident.id,
                "failed_at": p.failed_at,
                "first_step_at": first_step_time,
                "mttr_s": first_step_time - p.failed_at,
                "resume_step": resume,
                "steps_redone": redone,
                "standbys": attempt.standbys,
            }
            self.history.recoveries.append(rec)
            self.emit("recovered", **rec)
        self.history.pending = []

    def _resolve_unmeasured(self, attempt: Attempt, p: Pending) -> None:
        """Recovered, for a script without heartbeats: its restarted workers run. The restart
        time is known; the first step after it and the work redone are not."""
        resolution = f"workers restarted (attempt {attempt.number}); no step reported since (no heartbeats)"
        self.recorder.update(p.incident, resolved=True, resolution=resolution)
        rec = {
            "incident": p.incident.id,
            "failed_at": p.failed_at,
            "first_step_at": None,
            "mttr_s": None,
            "restart_s": attempt.started - p.failed_at,
            "resume_step": None,
            "steps_redone": None,
            "standbys": attempt.standbys,
        }
        self.history.recoveries.append(rec)
        self.emit("recovered", **rec)

    # -- attempts and the finish -----------------------------------------------------------------

    def close_attempt(
        self, attempt: Attempt, end: float, outcome: str, trouble: Trouble | None = None
    ) -> None:
        """The ledger's intervals of an attempt that ended (once; later calls do nothing)."""
        if attempt.closed:
            return
        attempt.outcome = outcome
        watch = self.watch
        prog_start = watch.poll(end).first_step_time
        stop = trouble.started if trouble is not None else end
        if prog_start is not None:
            self.recorder.interval(IntervalKind.PRODUCTIVE, prog_start, stop, attempt.number, outcome)
        elif not watch.heartbeats_seen:  # it ran; how productively, nothing says
            self.recorder.interval(IntervalKind.UNMEASURED, attempt.started, stop, attempt.number, outcome)
        if outcome == "succeeded" and self.history.pending:  # finished before reporting a step
            self.resolve_pending(attempt, None)
        if trouble is not None and trouble.time > trouble.started:
            self.recorder.interval(IntervalKind.DETECTION, trouble.started, trouble.time, attempt.number)
        for start, stop_ in watch.checkpoint_stalls:  # saves the heartbeats made visible
            self.recorder.interval(IntervalKind.CHECKPOINT, start, stop_, attempt.number)
        watch.checkpoint_stalls.clear()

    def finish(
        self,
        code: ExitCode,
        reason: str,
        started: float,
        attempt: Attempt | None,
        run_dir: Path,
        attempts: int,
        diagnostics: tuple[dict[str, Any], ...] = (),
    ) -> RunResult:
        """Close the last attempt and the job in the store; the run's result."""
        ended = self.clock()
        if attempt is not None:
            self.close_attempt(attempt, ended, code.name.lower())
        summary = self.recorder.finish(started, ended, STATUS.get(code, "failed"))
        history = self.history
        return RunResult(
            code,
            self.job_id,
            run_dir,
            reason,
            attempts,
            self.watch.furthest_step,
            tuple(self.recorder.incidents),
            tuple(history.injected),
            summary.to_dict(),
            tuple(history.recoveries),
            tuple(history.world_sizes),
            diagnostics,
            tuple(history.nodes),
        )
