"""The replica loop: ``trainguard run --replica-groups N`` keeps training while a group is replaced.

The same frame as the job loop (`supervisor.supervisor`), one level up: its workers are whole
groups, each a ``trainguard run`` of its own (`replicas.start`), under torchft's Lighthouse
(`replicas.lighthouse`). Every ``monitor_interval``::

    look    look() -> GroupsView       exits, the GPUs each exited group's own loop took out of
                                       service (its typed `RunResult`), steps and restarts (its
                                       ranks' heartbeats), the Lighthouse; the groups' output to
                                       the console
    judge   judge(view, ...) -> [GroupDecision]  (pure: `replicas.judge`)
    act     restart the Lighthouse | give a group a spare GPU and start it again | mark it
            stopped | every group down: restart them all from the newest durable checkpoint

Inside a group its own loop does what it does for any job: a rank that dies or hangs, or whose
GPU fails, is an incident (rank, GPU, root cause), its GPU excluded, its workers restarted; the
restarted group heals from a live peer through torchft while the other groups keep committing
steps. Its hang floor is below torchft's timeouts, so a hung group is stopped before it stalls
the quorum. The job's state is a `RunState` (RUNNING, DEGRADED while k of N groups step,
RECOVERING when none does); its incidents are built as the job loop's are (`incident_of`), its
events are `RunEvent`s, and its result is a `ReplicaResult`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from trainguard.actions import GroupAction
from trainguard.chaos import load_plan
from trainguard.chaos.plan import for_group, plan_toml
from trainguard.incidents import Interval, IntervalKind, RootCause
from trainguard.incidents.groups_report import DISCARDED, HEAL, START, groups_section
from trainguard.procs import stop_signals
from trainguard.rundir import heartbeat_path, read_discarded, read_last_heartbeat
from trainguard.supervisor.bookkeeping import incident_of
from trainguard.supervisor.config import ExitCode, SupervisorConfig
from trainguard.supervisor.lost import node_name
from trainguard.supervisor.policy import Trouble, TroubleKind
from trainguard.supervisor.record import JobRecorder
from trainguard.supervisor.replicas.console import GroupConsole
from trainguard.supervisor.replicas.judge import (
    GroupDecision,
    GroupsView,
    ReplicaGroup,
    capacity,
    judge,
    thinned,
)
from trainguard.supervisor.replicas.lighthouse import Lighthouse
from trainguard.supervisor.replicas.result import GroupResult, GroupRun, ReplicaResult
from trainguard.supervisor.replicas.start import (
    ReplicaConfig,
    group_config,
    group_env,
    start_group,
    stop_group,
)
from trainguard.supervisor.result import RunEvent, RunResult
from trainguard.supervisor.state import RunState, job_state

log = logging.getLogger(__name__)


class ReplicaSupervisor:
    """Runs N replica groups under one Lighthouse and keeps k of N stepping."""

    def __init__(
        self,
        config: SupervisorConfig,
        replicas: ReplicaConfig,
        on_event: Callable[[RunEvent], None] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        console: TextIO | None = None,
    ) -> None:
        self.job_id = config.resolved_job_id()
        # Pinned: a job id from the clock would differ at each group's (re)start.
        self.config = replace(config, record=replace(config.record, job_id=self.job_id))
        self.replicas = replicas
        self.run_dir = (config.record.runs_root / self.job_id).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.clock, self.sleep, self._on_event = clock, sleep, on_event
        config = self.config
        k = config.launch.nproc_per_node
        all_gpus = config.launch.gpus or tuple(range(k * replicas.groups))
        if len(all_gpus) < k * replicas.groups:
            from trainguard.errors import ConfigError

            raise ConfigError(
                f"--replica-groups {replicas.groups} x --nproc-per-node {k} needs {k * replicas.groups} GPUs; "
                f"--gpu-ids gives {len(all_gpus)}"
            )
        self.groups = [ReplicaGroup(i, tuple(all_gpus[i * k : (i + 1) * k])) for i in range(replicas.groups)]
        if config.chaos is not None:
            plan = load_plan(config.chaos)
            for g in self.groups:
                g.faults = list(for_group(plan, g.index).faults)
        self.spares = list(all_gpus[k * replicas.groups :])
        self.excluded: list[int] = []
        self.lighthouse = Lighthouse(replicas.lighthouse, self.run_dir / "lighthouse.log")
        self.recorder = JobRecorder(self.job_id, self.run_dir, config.resolved_db())
        self.node = node_name()
        self.state = RunState.INIT
        self.job_restarts_left = replicas.job_restarts
        self.started = 0.0
        self.states: list[dict[str, Any]] = []  # state changes, for the timeline and the report
        self.ledger: list[Interval] = []  # heals and discarded steps, for each group's own ledger
        self.console = GroupConsole(console) if config.watch.tee else None  # the groups' output

    # -- the loop: look, judge, act --------------------------------------------------------------

    def run(self) -> ReplicaResult:
        """Run every group to the end."""
        self.started = self.clock()
        self.recorder.start_job(
            self.started,
            " ".join(self.config.launch.cmd),
            self.config.launch.nproc_per_node * len(self.groups),
        )
        code, reason = ExitCode.FAILED, "launcher error"
        try:
            self.lighthouse.start()
            for g in self.groups:
                self._start(g)
            code, reason = self._monitor()
        except KeyboardInterrupt:
            code, reason = ExitCode.INTERRUPTED, "interrupted"
        finally:
            for g in self.groups:
                stop_group(g.proc)
            self.lighthouse.stop()
            self._tee(final=True)
        return self._finish(code, reason)

    def _monitor(self) -> tuple[ExitCode, str]:
        with stop_signals(_raise_interrupt):  # the groups are stopped on the way out
            while True:
                self.sleep(self.config.launch.monitor_interval)
                view = self.look()
                for act in judge(view, self.groups, self.spares, self.job_restarts_left):
                    done = self._act(act, view)
                    if done is not None:
                        return done
                self._set_state(job_state(g.state for g in self.groups))
                if all(g.state.final for g in self.groups):
                    if any(g.state is RunState.SUCCEEDED for g in self.groups):
                        return ExitCode.OK, "training completed"
                    return ExitCode.FAILED, "every replica group stopped"

    def look(self) -> GroupsView:
        self._tee()
        now = self.clock()
        exits: dict[int, int | None] = {}
        steps: dict[int, int | None] = {}
        lost: dict[int, tuple[int, ...]] = {}
        for g in self.groups:
            exits[g.index] = code = g.proc.poll() if g.proc is not None else None
            if code is not None and not g.state.final:
                lost[g.index] = self._group_run(g).lost_gpus
            step, attempt = self._progress(g)
            if attempt > g.attempt:
                self._restarted(g, attempt, now)
            if step is not None and step != g.last_step:
                self._stepped(g, step, now)
            steps[g.index] = step
        return GroupsView(now, exits, lost, steps, self.lighthouse.exited())

    def _restarted(self, g: ReplicaGroup, attempt: int, now: float) -> None:
        """The group's own loop restarted its workers (a new attempt's heartbeat: torchft heals
        a restarted rank before its first commit, so its step need not fall): it heals."""
        g.attempt = attempt
        if g.state is RunState.RUNNING:
            g.state, g.healing_since = RunState.RECOVERING, now

    def _stepped(self, g: ReplicaGroup, step: int, now: float) -> None:
        """A new furthest step of a group. A step below its last one: the group's workers were
        restarted (by its own loop) and heal; healed once it reaches the live groups' step."""
        if g.last_step is not None and step < g.last_step and g.state is RunState.RUNNING:
            g.state, g.healing_since = RunState.RECOVERING, now
        g.last_step, g.last_step_at = step, now
        g.steps.append((now, step))
        others = [o.last_step for o in self.groups if o is not g and o.state is RunState.RUNNING]
        peer = max((x for x in others if x is not None), default=None)
        if g.state is RunState.INIT or (
            g.state is RunState.RECOVERING and (peer is None or step >= peer - 1)
        ):
            if g.state is RunState.INIT:  # its start: launch to the first step seen
                self.ledger.append(
                    Interval(self._group_job(g), IntervalKind.INIT, g.started_at, now, detail=START)
                )
            if g.state is RunState.RECOVERING:
                since = g.healing_since or g.started_at
                heal = now - since
                g.heals.append(round(heal, 3))
                detail = f"{HEAL} from a live peer (to step {step})"
                self.ledger.append(Interval(self._group_job(g), IntervalKind.INIT, since, now, detail=detail))
                self._emit("group_healed", group=g.index, step=step, heal_s=round(heal, 3))
            g.state = RunState.RUNNING

    def _act(self, act: GroupDecision, view: GroupsView) -> tuple[ExitCode, str] | None:
        if act.kind is GroupAction.RESTART_LIGHTHOUSE:
            self.lighthouse.restart()
            evidence = (f"exit code {act.code}", f"log: {self.lighthouse.log_path}")
            summary = f"the Lighthouse exited ({act.code}); restarted on port {self.lighthouse.port}"
            self._incident(self._trouble("lighthouse", summary, evidence), act, None)
            self._emit("lighthouse_restarted", port=self.lighthouse.port, code=act.code)
            return None
        g = self.groups[act.group] if act.group is not None else None
        if g is not None:
            g.runs.append(self._group_run(g))
            if act.kind is GroupAction.FINISHED:
                g.state = RunState.SUCCEEDED
                return None
            fired = {i.index for i in g.runs[-1].result.injected} if g.runs[-1].result is not None else set()
            g.faults = [f for n, f in enumerate(g.faults) if n not in fired]
        if act.kind is GroupAction.STOP_GROUP and g is not None:
            g.state = RunState.STOPPED
            self._group_incident(g, act)
            self._emit("group_stopped", group=g.index, reason=act.reason)
        elif act.kind is GroupAction.REPLACE and g is not None:
            self.excluded += [x for x in g.gpus if x not in act.gpus]
            self.spares = [x for x in self.spares if x not in act.gpus]
            g.gpus = act.gpus
            self._group_incident(g, act)
            self._start(g)
        elif act.kind is GroupAction.RESTART_ALL:
            self.job_restarts_left -= 1
            self._incident(
                self._trouble("job", act.reason, ("from the newest durable checkpoint",)), act, None
            )
            self._emit("restart_all", reason=act.reason)
            for grp in self.groups:
                if grp.state is RunState.STOPPED:
                    self._start(grp)
        elif act.kind is GroupAction.STOP_JOB:
            return ExitCode.FAILED, act.reason
        return None

    # -- groups ----------------------------------------------------------------------------------

    def group_dir(self, g: ReplicaGroup) -> Path:
        return self.run_dir / "groups" / self._group_job(g)

    def _start(self, g: ReplicaGroup) -> None:
        g.starts += 1
        g.state = RunState.RECOVERING if g.starts > 1 else RunState.INIT
        g.started_at = self.clock()
        g.start_times.append(g.started_at)
        g.healing_since = g.started_at if g.starts > 1 else None
        g.attempt = 0  # a new `trainguard run`: its attempts count from 0 again
        chaos: Path | None = None
        if g.faults:  # a new group supervisor: only the faults its earlier runs did not fire
            chaos = self.run_dir / "groups" / f"{g.name}.chaos{g.starts}.toml"
            chaos.parent.mkdir(parents=True, exist_ok=True)
            chaos.write_text(plan_toml(g.faults))
        cfg = group_config(
            self.config, self.replicas, g.name, g.gpus, self.run_dir, self._result_path(g), chaos
        )
        env = group_env(self.config, self.replicas, g.index, self.lighthouse.address)
        g.proc = start_group(cfg, env, self._log_path(g))
        self._emit("group_started", group=g.index, gpus=list(g.gpus), start=g.starts)
        log.info("replica group %d started (start %d) on GPUs %s", g.index, g.starts, g.gpus)

    def _log_path(self, g: ReplicaGroup) -> Path:
        return self.run_dir / "groups" / f"{g.name}.log"

    def _tee(self, final: bool = False) -> None:
        """The groups' new output to the console (`replicas.console`)."""
        if self.console is not None:
            self.console.poll({g.index: self._log_path(g) for g in self.groups}, final)

    def _result_path(self, g: ReplicaGroup) -> Path:
        return self.run_dir / "groups" / f"{g.name}.start{g.starts}.json"

    def _group_run(self, g: ReplicaGroup) -> GroupRun:
        """How the group's last ``trainguard run`` ended: its result file, read back typed."""
        code = g.proc.poll() if g.proc is not None else None
        try:
            result: RunResult | None = RunResult.from_dict(json.loads(self._result_path(g).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            result = None
        return GroupRun(g.index, g.starts, result.exit_code if result is not None else code, result)

    def _progress(self, g: ReplicaGroup) -> tuple[int | None, int]:
        """The group's furthest step (None before its first) and its ranks' newest attempt."""
        best: int | None = None
        attempt = g.attempt
        for r in range(self.config.launch.nproc_per_node):
            beat = read_last_heartbeat(heartbeat_path(self.group_dir(g), r))
            if beat is None:
                continue
            if beat.time >= g.started_at:  # not its last `trainguard run`'s (one dir for both)
                attempt = max(attempt, beat.attempt)
            if beat.phase != "init":  # an exit beat holds its last step too
                best = max(best or 0, beat.step)
        return best, attempt

    # -- bookkeeping -----------------------------------------------------------------------------

    def _trouble(self, category: str, summary: str, evidence: tuple[str, ...], **known: Any) -> Trouble:
        now = self.clock()
        fields: dict[str, Any] = {"time": now, "started": now, "detected_by": "exit_code", **known}
        return Trouble(
            kind=TroubleKind.PROCESS_EXIT, category=category, summary=summary, evidence=evidence, **fields
        )

    def _group_incident(self, g: ReplicaGroup, act: GroupDecision) -> None:
        """The group's failure in the job's record, named as the group's own loop named it: the
        rank, GPU and root cause of its last incident (unknown when it recorded none)."""
        evidence: tuple[str, ...] = (f"group {g.index} supervisor exit code {act.code}",)
        last = g.runs[-1].last_incident if g.runs else None
        if last is None:
            trouble = self._trouble("replica_group", f"group {g.index}: {act.reason}", evidence)
        else:
            evidence += (f"group incident {last.id} in job {self._group_job(g)}",)
            trouble = self._trouble(
                last.category or "replica_group",
                f"group {g.index}: {last.summary}",
                evidence,
                root_cause=RootCause(last.root_cause),
                gpu=last.gpu,
                rank=last.rank,
                started=last.started if last.started is not None else self.clock(),
                detected_by=last.detected_by or "",
            )
        resolution = None
        if act.kind is GroupAction.REPLACE:
            resolution = f"group {g.index} restarted on GPUs {list(act.gpus)}; healing from a live peer"
        self._incident(trouble, act, g, resolution)

    def _incident(
        self, trouble: Trouble, act: GroupDecision, g: ReplicaGroup | None, resolution: str | None = None
    ) -> None:
        attempt = g.starts if g is not None else None
        self.recorder.add(
            incident_of(self.job_id, self.node, trouble, act.kind.value, act.reason, attempt, resolution)
        )

    def _set_state(self, state: RunState) -> None:
        if state is not self.state:
            running = sum(g.state is RunState.RUNNING for g in self.groups)
            self.states.append({"time": self.clock(), "state": state.value, "running": running})
            self._emit("state", state=state.value, running=running, groups=len(self.groups))
            self.state = state

    def _group_job(self, g: ReplicaGroup) -> str:
        return f"{self.job_id}.{g.name}"

    def _discarded(self, g: ReplicaGroup) -> list[Interval]:
        """The steps the group's rank 0 wrote it discarded (`trainguard.torch.ft`), as lost work."""
        return [
            Interval(self._group_job(g), IntervalKind.LOST, start, end, detail=f"{DISCARDED} {step}")
            for step, start, end in read_discarded(self.group_dir(g), 0)
        ]

    def _finish(self, code: ExitCode, reason: str) -> ReplicaResult:
        ended = self.clock()
        discarded = {g.index: self._discarded(g) for g in self.groups}
        self.recorder.add_intervals([*self.ledger, *(iv for ivs in discarded.values() for iv in ivs)])
        for g in self.groups:  # each group's line in `trainguard report --plot`, as this loop saw it
            self.recorder.add_progress(self._group_job(g), thinned(g.steps))
        summary = self.recorder.finish(self.started, ended, "succeeded" if code is ExitCode.OK else "failed")
        goodput = summary.to_dict()
        # The job's figures are its groups' ledgers' (capacity-weighted), as the report prints
        # them; without a store, the steps this loop saw (`judge.capacity`).
        cap = capacity(self.groups, self.started, ended)
        if self.recorder.store is not None:
            try:
                section = groups_section(self.recorder.store, self.job_id, self.started, ended)
                goodput = section["goodput"] if section and section["goodput"] else goodput
                if section:
                    cap = ledger_capacity(section)
            except Exception as exc:  # bookkeeping never fails the job
                log.warning("could not read the groups' ledgers: %s", exc)
        self.recorder.close()
        groups = tuple(
            GroupResult(
                g.index,
                g.state,
                g.starts,
                tuple(g.start_times),
                g.gpus,
                g.last_step,
                tuple(g.steps),
                tuple(g.heals),
                len(discarded[g.index]),
                tuple(g.runs),
            )
            for g in self.groups
        )
        result = ReplicaResult(
            code,
            self.job_id,
            self.run_dir,
            reason,
            groups,
            self.lighthouse.restarts,
            tuple(self.excluded),
            tuple(self.states),
            cap,
            tuple(self.recorder.incidents),
            goodput,
        )
        self._emit("finished", exit_code=int(code), reason=reason)
        return result

    def _emit(self, what: str, /, **data: Any) -> None:
        if self._on_event is not None:
            try:
                self._on_event(RunEvent(what, self.clock(), data))
            except Exception:
                log.debug("event callback failed", exc_info=True)


def ledger_capacity(section: dict[str, Any]) -> dict[str, float]:
    """The report's capacity (`groups_report.groups_summary`) in `judge.capacity`'s shape; empty
    where it was not measured."""
    if section.get("capacity") is None:
        return {}
    return {"capacity": section["capacity"], **{f"{k}_s": v for k, v in section["k_of_n_s"].items()}}


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
