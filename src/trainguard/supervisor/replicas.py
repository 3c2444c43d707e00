"""``trainguard run --replica-groups N``: replica groups that keep training while one is replaced.

Layout: torchft's Lighthouse (`supervisor.lighthouse`), then N replica groups, each a
``trainguard run`` of its own: a torch elastic agent under the per-group monitor loop
(`supervisor.supervisor`), with its own ``REPLICA_GROUP_ID``, TCPStore, GPUs, run directory
(``<run_dir>/groups/<job>.g<i>``), restart budget, crash-loop breaker and hang watch. Inside a
group that loop does what it does for any job: a rank that dies or hangs, or whose GPU the node
agent fails, is recorded as an incident (rank, GPU, root cause), its GPU excluded, and the
group's workers restarted (from warm standbys); the restarted group heals from a live peer
through torchft while the other groups keep committing steps. Its hang timeout is set below
torchft's timeouts, so a hung group is stopped before it can stall the quorum.

This loop watches the groups and the Lighthouse, every ``monitor_interval``::

    look    look_groups(groups, lighthouse, now) -> GroupsView    exits, steps, the Lighthouse
    judge   judge(view, groups, spares, budget) -> [Act]          (pure: supervisor.groups)
    act     restart the Lighthouse | give a group a spare GPU and start it again | mark it
            stopped | every group down: restart them all from the newest durable checkpoint

and keeps the job's state (`RunState`: RUNNING, DEGRADED while k of N groups step, RECOVERING
when none does) and the partial-capacity ledger (`capacity`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.chaos import load_plan
from trainguard.chaos.plan import for_group, plan_toml
from trainguard.incidents import Incident, Interval, IntervalKind, RootCause
from trainguard.incidents.groups_report import DISCARDED, HEAL, START, groups_section
from trainguard.procs import parent_death, stop_signals
from trainguard.rundir import heartbeat_path, read_discarded, read_last_heartbeat, replica_group_env
from trainguard.supervisor.bookkeeping import RunEvent
from trainguard.supervisor.config import ExitCode, SupervisorConfig
from trainguard.supervisor.groups import Act, ActKind, Group, GroupsView, capacity, judge, thinned
from trainguard.supervisor.lighthouse import Lighthouse, LighthouseConfig
from trainguard.supervisor.record import JobRecorder, node_name
from trainguard.supervisor.state import RunState, job_state

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    groups: int = 2
    lighthouse: LighthouseConfig = field(default_factory=LighthouseConfig)
    timeout_s: float = 10.0  # torchft's collective/commit timeout (TORCHFT_TIMEOUT_SEC)
    quorum_timeout_s: float = 30.0  # TORCHFT_QUORUM_TIMEOUT_SEC
    quorum_retries: int = 20  # a group survives this many failed quorums (the Lighthouse restarting)
    job_restarts: int = 1  # every group down: restart them all from the checkpoint this often


PEER_WAIT_MARGIN_S = 5.0  # after a collective timeout: the vote, the next quorum, one step


def group_hang_floor(floor: float, replicas: ReplicaConfig) -> float:
    """A group's hang timeout floor: ``floor`` (``--hang-timeout-floor``), raised past torchft's
    collective timeout and capped at half its quorum timeout. A healthy group waits on a hung or
    slow peer in an all-reduce for up to the collective timeout, then discards the step and goes
    on: below that, the healthy group would be taken for hung and restarted for its peer's fault.
    Under the cap, a hung group is stopped before the quorum times out (the raise wins where the
    two cross)."""
    low = replicas.timeout_s + PEER_WAIT_MARGIN_S
    return max(min(floor, replicas.quorum_timeout_s / 2), low)


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
    ) -> None:
        self.config, self.replicas = config, replicas
        self.job_id = config.resolved_job_id()
        self.run_dir = (config.runs_root / self.job_id).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.clock, self.sleep, self._on_event = clock, sleep, on_event
        k = config.nproc_per_node
        all_gpus = config.gpus or tuple(range(k * replicas.groups))
        if len(all_gpus) < k * replicas.groups:
            from trainguard.errors import ConfigError

            raise ConfigError(
                f"--replica-groups {replicas.groups} x --nproc-per-node {k} needs {k * replicas.groups} GPUs; "
                f"--gpus gives {len(all_gpus)}"
            )
        self.groups = [Group(i, tuple(all_gpus[i * k : (i + 1) * k])) for i in range(replicas.groups)]
        if config.chaos is not None:
            plan = load_plan(config.chaos)
            for g in self.groups:
                g.faults = list(for_group(plan, g.index).faults)
        self.spares = list(all_gpus[k * replicas.groups :])
        self.excluded: list[int] = []
        self.lighthouse = Lighthouse(replicas.lighthouse, self.run_dir / "lighthouse.log")
        self.recorder = JobRecorder(self.job_id, self.run_dir, config.resolved_db())
        self.state = RunState.INIT
        self.job_restarts_left = replicas.job_restarts
        self.started = 0.0
        self.events: list[dict[str, Any]] = []  # state changes, for the timeline and the report
        self.ledger: list[Interval] = []  # heals and discarded steps, for each group's own ledger

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run every group to the end; the job's result as a plain dict (see `result`)."""
        self.started = self.clock()
        self.recorder.start_job(
            self.started, " ".join(self.config.cmd), self.config.nproc_per_node * len(self.groups)
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
                self._stop(g)
            self.lighthouse.stop()
        return self._finish(code, reason)

    def _monitor(self) -> tuple[ExitCode, str]:
        with stop_signals(_raise_interrupt):  # the groups are stopped on the way out
            while True:
                self.sleep(self.config.monitor_interval)
                view = self.look()
                excluded = {g.index: self._excluded_by(g) for g in self.groups if view.exits.get(g.index)}
                for act in judge(view, self.groups, excluded, self.spares, self.job_restarts_left):
                    done = self._act(act, view)
                    if done is not None:
                        return done
                self._set_state(job_state(g.state for g in self.groups))
                if all(g.state.final for g in self.groups):
                    ok = any(g.state is RunState.SUCCEEDED for g in self.groups)
                    if ok:
                        return ExitCode.OK, "training completed"
                    return ExitCode.FAILED, "every replica group stopped"

    def look(self) -> GroupsView:
        now = self.clock()
        exits: dict[int, int | None] = {}
        steps: dict[int, int | None] = {}
        for g in self.groups:
            exits[g.index] = g.proc.poll() if g.proc is not None else None
            step = self._furthest_step(g)
            if step is not None and step != g.last_step:
                self._stepped(g, step, now)
            steps[g.index] = step
        return GroupsView(now, exits, steps, self.lighthouse.exited())

    def _stepped(self, g: Group, step: int, now: float) -> None:
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
                self.ledger.append(
                    Interval(
                        self._group_job(g),
                        IntervalKind.INIT,
                        since,
                        now,
                        detail=f"{HEAL} from a live peer (to step {step})",
                    )
                )
                self._emit("group_healed", group=g.index, step=step, heal_s=round(heal, 3))
            g.state = RunState.RUNNING

    def _act(self, act: Act, view: GroupsView) -> tuple[ExitCode, str] | None:
        if act.kind is ActKind.RESTART_LIGHTHOUSE:
            self._incident(
                None,
                "lighthouse",
                f"the Lighthouse exited ({act.code}); restarted on port {self.lighthouse.port}",
                "restart_lighthouse",
                (f"exit code {act.code}", f"log: {self.lighthouse.log_path}"),
            )
            self.lighthouse.restart()
            self._emit("lighthouse_restarted", port=self.lighthouse.port, code=act.code)
            return None
        assert act.group is not None or act.kind in (ActKind.RESTART_ALL, ActKind.STOP_JOB)
        g = self.groups[act.group] if act.group is not None else None
        if act.kind is ActKind.FINISHED and g is not None:
            g.state = RunState.SUCCEEDED
            g.outcomes.append(self._group_result(g))
            return None
        if g is not None:
            g.outcomes.append(self._group_result(g))
            fired = {i.get("index") for i in g.outcomes[-1].get("injected", [])}
            g.faults = [f for n, f in enumerate(g.faults) if n not in fired]
        if act.kind is ActKind.STOP_GROUP and g is not None:
            g.state = RunState.STOPPED
            self._group_incident(g, act, "stop_group")
            self._emit("group_stopped", group=g.index, reason=act.reason)
        elif act.kind is ActKind.REPLACE and g is not None:
            lost = [x for x in g.gpus if x not in act.gpus]
            self.excluded += lost
            self.spares = [x for x in self.spares if x not in act.gpus]
            g.gpus = act.gpus
            self._group_incident(g, act, "replace_group")
            self._start(g)
        elif act.kind is ActKind.RESTART_ALL:
            self.job_restarts_left -= 1
            self._incident(
                None, "job", act.reason, "restart_all_groups", ("from the newest durable checkpoint",)
            )
            self._emit("restart_all", reason=act.reason)
            for grp in self.groups:
                if grp.state is RunState.STOPPED:
                    self._start(grp)
        elif act.kind is ActKind.STOP_JOB:
            return ExitCode.FAILED, act.reason
        return None

    # -- groups ----------------------------------------------------------------------------------

    def group_dir(self, g: Group) -> Path:
        return self.run_dir / "groups" / f"{self.job_id}.{g.name}"

    def _start(self, g: Group) -> None:
        g.starts += 1
        g.state = RunState.RECOVERING if g.starts > 1 else RunState.INIT
        g.started_at = self.clock()
        g.healing_since = g.started_at if g.starts > 1 else None
        chaos: Path | None = None
        if g.faults:  # a new group supervisor: only the faults its earlier runs did not fire
            chaos = self.run_dir / "groups" / f"{g.name}.chaos{g.starts}.toml"
            chaos.parent.mkdir(parents=True, exist_ok=True)
            chaos.write_text(plan_toml(g.faults))
        argv = group_argv(self.config, g, self.job_id, self.run_dir, self._result_path(g), chaos)
        floor = group_hang_floor(self.config.hang_timeout_floor, self.replicas)
        argv[argv.index("--hang-timeout-floor") + 1] = f"{floor:g}"
        env = {**os.environ, **self.config.env}
        env.update(
            {
                **replica_group_env(g.index, len(self.groups)),
                "TORCHFT_LIGHTHOUSE": self.lighthouse.address,
                "TORCHFT_TIMEOUT_SEC": f"{self.replicas.timeout_s:g}",
                "TORCHFT_QUORUM_TIMEOUT_SEC": f"{self.replicas.quorum_timeout_s:g}",
                "TORCHFT_QUORUM_RETRIES": str(self.replicas.quorum_retries),
                "TRAINGUARD_JOB_ID": self.job_id,
            }
        )
        log_path = self.run_dir / "groups" / f"{g.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            g.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=parent_death(signal.SIGTERM),  # its supervisor stops its workers
            )
        self._emit("group_started", group=g.index, gpus=list(g.gpus), start=g.starts)
        log.info("replica group %d started (start %d) on GPUs %s", g.index, g.starts, g.gpus)

    def _stop(self, g: Group) -> None:
        proc = g.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # its supervisor stops its workers, then exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

    def _result_path(self, g: Group) -> Path:
        return self.run_dir / "groups" / f"{g.name}.start{g.starts}.json"

    def _group_result(self, g: Group) -> dict[str, Any]:
        try:
            result: dict[str, Any] = json.loads(self._result_path(g).read_text())
        except (OSError, ValueError):
            code = g.proc.poll() if g.proc is not None else None
            result = {"exit_code": code, "incidents": []}
        result["group"], result["start"] = g.index, g.starts
        return result

    def _excluded_by(self, g: Group) -> tuple[int, ...]:
        """The GPUs the group's own loop excluded in its last run (from its result's incidents)."""
        return tuple(
            i["gpu"]
            for i in self._group_result(g).get("incidents", [])
            if i.get("action") in ("exclude_gpu", "stop_no_capacity") and i.get("gpu") is not None
        )

    def _furthest_step(self, g: Group) -> int | None:
        best: int | None = None
        for r in range(self.config.nproc_per_node):
            beat = read_last_heartbeat(heartbeat_path(self.group_dir(g), r))
            if beat is not None and beat.phase != "init":  # an exit beat holds its last step too
                best = max(best or 0, beat.step)
        return best

    # -- bookkeeping -----------------------------------------------------------------------------

    def _group_incident(self, g: Group, act: Act, action: str) -> None:
        """The group's failure in the job's record, named as the group's own loop named it: the
        rank, GPU and root cause of its last incident (unknown when it recorded none)."""
        last = (g.outcomes[-1].get("incidents") or [None])[-1] if g.outcomes else None
        evidence: tuple[Any, ...] = (act.reason, f"group {g.index} supervisor exit code {act.code}")
        if last is None:
            self._incident(None, "replica_group", f"group {g.index}: {act.reason}", action, evidence, g=g)
            return
        self.recorder.add(
            Incident(
                job=self.job_id,
                time=self.clock(),
                root_cause=RootCause(last.get("root_cause", "unknown")),
                action=action,
                summary=f"group {g.index}: {last.get('summary', '')}",
                started=last.get("started"),
                category=last.get("category"),
                evidence=(*evidence, f"group incident {last.get('id')} in job {self.job_id}.{g.name}"),
                gpu=last.get("gpu"),
                node=node_name(),
                rank=last.get("rank"),
                attempt=g.starts,
                detected_by=last.get("detected_by"),
                resolved=action == "replace_group",
                resolution=f"group {g.index} restarted on GPUs {list(g.gpus)}; healing from a live peer"
                if action == "replace_group"
                else None,
            )
        )

    def _incident(
        self,
        rank: int | None,
        category: str,
        summary: str,
        action: str,
        evidence: tuple[Any, ...],
        g: Group | None = None,
    ) -> None:
        self.recorder.add(
            Incident(
                job=self.job_id,
                time=self.clock(),
                root_cause=RootCause.UNKNOWN,
                action=action,
                summary=summary,
                category=category,
                evidence=evidence,
                node=node_name(),
                rank=rank,
                attempt=g.starts if g is not None else None,
                detected_by="exit_code",
            )
        )

    def _set_state(self, state: RunState) -> None:
        if state is not self.state:
            running = sum(g.state is RunState.RUNNING for g in self.groups)
            self.events.append({"time": self.clock(), "state": state.value, "running": running})
            self._emit("state", state=state.value, running=running, groups=len(self.groups))
            self.state = state

    def _group_job(self, g: Group) -> str:
        return f"{self.job_id}.{g.name}"

    def _discarded(self, g: Group) -> list[Interval]:
        """The steps the group's rank 0 wrote it discarded (`trainguard.torch.ft`), as lost work."""
        return [
            Interval(self._group_job(g), IntervalKind.LOST, start, end, detail=f"{DISCARDED} {step}")
            for step, start, end in read_discarded(self.group_dir(g), 0)
        ]

    def _finish(self, code: ExitCode, reason: str) -> dict[str, Any]:
        ended = self.clock()
        discarded = {g.index: self._discarded(g) for g in self.groups}
        self.recorder.add_intervals([*self.ledger, *(iv for ivs in discarded.values() for iv in ivs)])
        for g in self.groups:  # each group's line in `trainguard report --plot`, as this loop saw it
            self.recorder.add_progress(self._group_job(g), thinned(g.steps))
        summary = self.recorder.finish(self.started, ended, "succeeded" if code is ExitCode.OK else "failed")
        goodput = summary.to_dict()
        if self.recorder.store is not None:  # the job's figures are its groups' (capacity-weighted)
            try:
                section = groups_section(self.recorder.store, self.job_id, self.started, ended)
                goodput = section["goodput"] if section and section["goodput"] else goodput
            except Exception as exc:  # bookkeeping never fails the job
                log.warning("could not read the groups' ledgers: %s", exc)
        self.recorder.close()
        result = {
            "exit_code": int(code),
            "status": code.name.lower(),
            "reason": reason,
            "job_id": self.job_id,
            "run_dir": str(self.run_dir),
            "replica_groups": len(self.groups),
            "lighthouse_restarts": self.lighthouse.restarts,
            "excluded_gpus": self.excluded,
            "groups": [
                {
                    "group": g.index,
                    "state": g.state.value,
                    "starts": g.starts,
                    "gpus": list(g.gpus),
                    "final_step": g.last_step,
                    "steps": g.steps,
                    "heals_s": g.heals,
                    "discarded_steps": len(discarded[g.index]),
                    "runs": g.outcomes,
                }
                for g in self.groups
            ],
            "states": self.events,
            "capacity": capacity(self.groups, self.started, ended),
            "incidents": [i.to_dict() for i in self.recorder.incidents],
            "goodput": goodput,
        }
        self._emit("finished", exit_code=int(code), reason=reason)
        return result

    def _emit(self, what: str, /, **data: Any) -> None:
        if self._on_event is not None:
            try:
                self._on_event(RunEvent(what, self.clock(), data))
            except Exception:
                log.debug("event callback failed", exc_info=True)


def group_argv(
    config: SupervisorConfig, g: Group, job_id: str, run_dir: Path, result: Path, chaos: Path | None = None
) -> list[str]:
    """The ``trainguard run`` command line of one replica group: one node of its own
    (standalone), the job's options, its GPUs, and at least as many GPUs as it started with
    (fewer: it exits NO_CAPACITY and this loop gives it a spare)."""
    c = config
    argv = [sys.executable, "-m", "trainguard.cli", "run", "--standalone"]
    argv += ["--nproc-per-node", str(c.nproc_per_node), "--min-nproc", str(c.nproc_per_node)]
    argv += ["--max-restarts", str(c.max_restarts), "--monitor-interval", f"{c.monitor_interval:g}"]
    argv += ["--job-id", f"{job_id}.{g.name}", "--runs-dir", str(run_dir / "groups")]
    argv += ["--db", str(c.resolved_db()), "--gpus", ",".join(map(str, g.gpus)), "--json", str(result)]
    argv += [
        "--hang-timeout-floor",
        f"{c.hang_timeout_floor:g}",
        "--hang-step-factor",
        f"{c.hang_step_factor:g}",
    ]
    argv += ["--startup-timeout", f"{c.startup_timeout:g}", "--idle-timeout", f"{c.idle_timeout:g}"]
    argv += ["--backend", c.backend, "--crash-loop-after", str(c.crash_loop_after)]
    argv += ["--backoff-base", f"{c.backoff_base_s:g}"]
    if c.checkpoint_dir is not None:
        argv += ["--checkpoint-dir", str(c.checkpoint_dir)]
    if chaos is not None:
        argv += ["--chaos", str(chaos)]
    if not c.preflight:
        argv.append("--no-preflight")
    argv.append("--warm-standby" if c.warm_standby else "--no-warm-standby")
    argv += ["--warm-standby-sets", str(c.warm_standby_sets)]
    if not c.tee:
        argv.append("--no-tee")
    return [*argv, *c.extra_torchrun_args, "--", *c.cmd]


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
