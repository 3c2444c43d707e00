"""`Supervisor`: launches training as torchrun does and keeps it alive.

One monitor loop per node (`monitor`), every ``monitor_interval`` seconds, in three steps::

    look    Observer.look(workers, attempt, now) -> Observation      (supervisor.observe)
    judge   assess(observation, attempt, history) -> Trouble | None  (supervisor.assess)
            Decider.decide(trouble, ...) -> JobDecision                  (supervisor.decide, .policy)
    act     record the incident; continue | restart (backoff) | exclude GPU | stop  (here)

The workers come to life through a `Launcher` (`supervisor.launch`: torch's elastic agent by
default, ``--launcher local`` for plain processes), which runs this loop over its `Workers`.

State lives in two values: the `Attempt` of the current start (thrown away on restart) and the
`History` of the run, whose ``state`` is a `RunState` (see supervisor.attempt, supervisor.state);
what happened is written down by a `Bookkeeper` (supervisor.bookkeeping). The workers start
before the loop's machinery (store, watchers, policy, bookkeeping) is imported and built, unless
the start needs it (`_machinery_first`): it then costs the ranks' import time, not the launch's.
Clock and sleep are parameters, so the loop runs on a virtual clock in tests. Usable as a library (the demo drives it with a live display)::

    launch = LaunchConfig(cmd=("python", "train.py"), nproc_per_node=2, standalone=True)
    sup = Supervisor(SupervisorConfig(launch), on_event=print)
    result = sup.run()          # -> RunResult(exit_code=ExitCode.OK, ...)
"""

from __future__ import annotations

import logging
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from trainguard.control import Control, read_control, write_control
from trainguard.rundir import ATTEMPT_ENV, RUN_DIR_ENV
from trainguard.supervisor.config import ExitCode, SupervisorConfig
from trainguard.supervisor.hang import flight_recorder_env
from trainguard.supervisor.health import Diagnose, GpuMap, NodeHealth
from trainguard.supervisor.launch import Launcher, LaunchJob, SpareReleased, Workers, launcher_for
from trainguard.supervisor.lost import LostRun, find_lost_run, next_attempt, node_name

# The loop's machinery (the incident store, detection, the policy, bookkeeping) is imported where
# it is first used, after the workers started: its imports (a quarter second of CPU) then overlap
# the ranks' own imports instead of preceding them. Each of these names is imported again inside
# the functions that use it.
if TYPE_CHECKING:
    from trainguard.chaos import ChaosExecutor
    from trainguard.supervisor.attempt import Attempt, History
    from trainguard.supervisor.bookkeeping import Bookkeeper
    from trainguard.supervisor.decide import Decider
    from trainguard.supervisor.observe import Observation, Observer
    from trainguard.supervisor.policy import JobDecision, Trouble
    from trainguard.supervisor.record import JobRecorder
    from trainguard.supervisor.result import RunEvent, RunResult
    from trainguard.supervisor.watch import ProgressWatch

__all__ = ["Supervisor"]

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        on_event: Callable[[RunEvent], None] | None = None,
        diagnose: Diagnose | None = None,
        console: TextIO | None = None,
        *,
        launcher: Launcher | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        # Chosen where the supervisor is assembled: a missing dependency fails here, before
        # anything starts, with its install hint.
        self.launcher = launcher if launcher is not None else launcher_for(config.launch.launcher)
        self.launcher.check()
        self.job_id = config.resolved_job_id()
        # Pinned: a job id from the clock would differ when the launcher reads it.
        self.config = config = replace(config, record=replace(config.record, job_id=self.job_id))
        self.run_dir = (config.record.runs_root / self.job_id).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.node = node_name()
        self.clock, self.sleep = clock, sleep
        self._on_event = on_event
        self.checkpoint_dir = config.resolved_checkpoint_dir()
        gpus = config.launch.gpus or tuple(range(config.launch.nproc_per_node))
        h = config.health
        self.health = NodeHealth(
            h.backend,
            max(gpus) + 1,
            self.run_dir,
            h.kernel_log,
            h.health_interval,
            h.thresholds,
            agent_url=h.agent_url,
            agent_token_file=h.agent_token_file,
        )
        self._console = console
        self._diagnose = diagnose
        self.gpu_map = GpuMap(gpus)  # what the next start uses
        self.attempt_number = 0  # of the next (or current) start
        self.attempt: Attempt | None = None
        self.started = 0.0
        self._lost: LostRun | None = None  # this job id's previous run, killed with its supervisor
        self._heartbeats_announced = False
        self._released: str | None = None  # why a spare node ended without being admitted
        self._opened = False  # the store's job row written, the job announced (`_open_job`)
        self.chaos: ChaosExecutor | None = None
        if config.chaos is not None:  # a drill: its plan loads now, a bad one fails before any start
            from trainguard.chaos import ChaosExecutor, load_plan
            from trainguard.chaos.plan import for_this_group

            plan = for_this_group(load_plan(config.chaos))
            self.chaos = ChaosExecutor(plan, self.run_dir, 0.0, self.health.sim, self.checkpoint_dir)

    # -- the machinery, built on first use: after the workers' start unless it must come first --

    @cached_property
    def recorder(self) -> JobRecorder:
        from trainguard.supervisor.record import JobRecorder

        return JobRecorder(self.job_id, self.run_dir, self.config.resolved_db())

    @cached_property
    def watch(self) -> ProgressWatch:
        from trainguard.supervisor.watch import ProgressWatch

        w = self.config.watch
        return ProgressWatch(self.run_dir, w.hang_timeout_floor, w.hang_step_factor, w.startup_timeout)

    @cached_property
    def observer(self) -> Observer:
        from trainguard.supervisor.idle import IdleWatch
        from trainguard.supervisor.logs import LogTail, default_classifier
        from trainguard.supervisor.observe import Observer

        w = self.config.watch
        logtail = LogTail(default_classifier(), self._console, w.tee)
        return Observer(
            self.run_dir,
            self.watch,
            self.health,
            logtail,
            self.attempt_dir,
            self.sleep,
            IdleWatch(w.idle_timeout),
            preemption_exit_code=self.config.launch.preemption_exit_code,
        )

    @cached_property
    def history(self) -> History:
        from trainguard.supervisor.attempt import History

        return History()

    @cached_property
    def book(self) -> Bookkeeper:
        from trainguard.supervisor.bookkeeping import Bookkeeper

        return Bookkeeper(
            self.job_id, self.node, self.recorder, self.history, self.watch, self._emit, self.clock
        )

    @cached_property
    def decider(self) -> Decider:
        from trainguard.supervisor.decide import Decider

        return Decider(
            self.config, self.history, self.health, self.book, self._emit, self.clock, self._diagnose
        )

    # -- public --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Launch the workers and watch them until the job finishes, is stopped or interrupted."""
        cfg = self.config
        self.started = self.clock()
        self.attempt_number = next_attempt(self.run_dir)  # a re-run of a job id continues its attempts
        if self._machinery_first():
            self._lost = find_lost_run(self.recorder.job_info(), self.run_dir)
            self._open_job()
        job = LaunchJob(cfg, self.job_id, self._worker_env, lambda: self.attempt_dir(self.attempt_number))
        code, reason = ExitCode.FAILED, "launcher error"
        try:
            signame = self.launcher.launch(job, self.monitor)
            if signame is not None:
                code, reason = ExitCode.INTERRUPTED, f"supervisor received {signame}"
            elif self._released is not None:
                code, reason = ExitCode.OK, f"spare node, never needed ({self._released})"
            elif (stop := self.history.stopping) is not None:
                code, reason = ExitCode(stop[0]), stop[1]
            else:
                code, reason = ExitCode.OK, "all workers finished"
        except KeyboardInterrupt:
            code, reason = ExitCode.INTERRUPTED, "interrupted"
        except Exception as exc:
            log.exception("supervisor failed")
            code, reason = ExitCode.FAILED, f"launcher error: {exc}"
        return self._finish(code, reason)

    def _machinery_first(self) -> bool:
        """Whether the workers' start needs the machinery before it: a pre-flight on the GPUs
        (a GPU backend), a fault plan's preparations, or a previous run of this job id to judge
        (the lost-run check reads its logs before this run adds its own); or whether the start
        waits on other nodes (a rendezvous, a spare's admission: minutes, hours), before which
        the job is recorded and announced. Otherwise the workers start first and the rest is
        built while they import."""
        launch = self.config.launch
        return (
            self.config.health.backend not in ("", "none")
            or self.config.chaos is not None
            or (self.run_dir / "logs").exists()
            or launch.spare
            or (not launch.standalone and launch.nnodes.rpartition(":")[2] not in ("", "1"))
        )

    def _open_job(self) -> None:
        """The job's row in the store (a crash after it leaves a "running" job that the next
        supervisor of this job id finds lost), the fault plan armed, the job announced."""
        if self._opened:
            return
        self._opened = True
        from trainguard.supervisor.watch import watchers

        cfg = self.config
        started = self._lost.started if self._lost is not None else self.started
        self.recorder.start_job(started, shlex.join(cfg.launch.cmd), cfg.launch.nproc_per_node)
        if self.chaos is not None:
            self.chaos.started = self.started
            self.chaos.prepare()
        self._emit(
            "job_started",
            job=self.job_id,
            run_dir=str(self.run_dir),
            gpus=list(self.gpu_map.gpus),
            watchers=watchers(cfg, heartbeats=False, backend_open=self.health.active),
        )

    def request_checkpoint(self, reason: str) -> Control | None:
        """Ask the running ranks for a checkpoint at their next step boundary, through the control
        file (`trainguard.control`): a Guard with a checkpointer serves it, other trainers ignore
        it. The document written; None when it could not be (training goes on either way)."""
        current = read_control(self.run_dir) or Control()
        control = current.asking_checkpoint(reason, self.clock(), self.attempt_number)
        try:
            write_control(self.run_dir, control)
        except OSError as exc:
            log.warning("could not ask the ranks for a checkpoint: %s", exc)
            return None
        self._emit("checkpoint_requested", reason=reason, seq=control.seq, attempt=self.attempt_number)
        return control

    def attempt_dir(self, number: int) -> Path:
        return self.run_dir / "logs" / self.node.replace(":", "-") / f"attempt{number}"

    # -- the monitor loop: look, judge, act ----------------------------------------------------

    def monitor(self, workers: Workers) -> bool:
        """Watch the workers until they finish (True) or the policy stops the job (False)."""
        if self._machinery_first() and not self._preflight(None):  # only then can a pre-flight run
            return False
        try:
            workers.start(len(self.gpu_map.gpus))
        except SpareReleased as exc:
            self._released = str(exc)
            return False
        self._open_job()  # no-op when it came first
        from trainguard.incidents import IntervalKind
        from trainguard.supervisor.assess import assess, workers_done
        from trainguard.supervisor.attempt import Pending
        from trainguard.supervisor.state import RunState

        attempt = self._begin_attempt(workers)
        # The launcher's own start (rendezvous, pre-flight, starting the workers) is the job's
        # init as much as the workers' imports are; uncharged, a loaded host's slow start would
        # show in the ledger as time no interval covers. A spare's wait to be admitted is not.
        if self.config.launch.spare:
            self._spare_admitted(attempt)
        else:
            self.recorder.interval(IntervalKind.INIT, self.started, attempt.started, attempt.number, "launch")
        if self._lost is not None:
            lost = self.recorder.lost_run(self._lost, attempt.started, attempt.resume_step)
            self.history.pending.append(Pending(lost, self._lost.last_seen, self._lost.furthest_step))
        while True:
            self.sleep(self.config.launch.monitor_interval)
            workers.interrupted()
            obs = self.observer.look(workers, attempt, self.clock())
            self._remember(obs, attempt)
            self._announce_heartbeats(obs)
            self.book.progress(obs, attempt)
            self._settle(workers, obs, attempt)
            self._drill(workers, obs, attempt)
            lingering = workers_done(obs, attempt)
            if lingering is not None:
                self._end_lingering(workers, attempt, lingering)
                self.book.close_attempt(attempt, obs.time, "succeeded")
                self.history.state = RunState.SUCCEEDED
                return True
            self.book.numerics(obs)
            trouble = assess(obs, attempt, self.history)
            if trouble is None:
                continue
            trouble, decision = self.decider.decide(trouble, self.gpu_map, self.attempt_number)
            attempt = self._act(workers, attempt, obs, trouble, decision)
            if self.history.stopping is not None:
                return False

    def _remember(self, obs: Observation, attempt: Attempt) -> None:
        if obs.verdict is not None:  # the node's GPU UUIDs, stamped on the rows this job writes
            self.recorder.node_gpus(obs.verdict)
        for lr, code in obs.codes.items():
            if code is not None:
                attempt.exits_seen.setdefault(lr, obs.time)
        attempt.events += obs.events
        for lr in obs.teardown_aborts:
            rank = attempt.rank_of[lr]
            log.warning(
                "rank %s finished, then aborted in interpreter teardown (torch/gloo); counted as done", rank
            )
            self._emit("teardown_abort", rank=rank)
            attempt.teardown_aborts.add(lr)

    def _settle(self, workers: Workers, obs: Observation, attempt: Attempt) -> None:
        """Tell the launcher once the attempt is past its start-up (its first step; without
        heartbeats, its workers running ``RUNNING_S``): warm standbys import then, not beside
        the ranks' own start."""
        if attempt.settled:
            return
        from trainguard.supervisor.bookkeeping import RUNNING_S

        running = not obs.heartbeats_seen and obs.time - attempt.started > RUNNING_S
        if obs.progress.first_step_time is not None or running:
            attempt.settled = True
            workers.settled()

    def _preflight(self, ending: Attempt | None) -> bool:
        """The pre-flight on the GPUs of the next start (`Decider.preflight`); False when the
        policy stops the job instead."""
        gpus = self.decider.preflight(self.gpu_map, self.attempt_number, ending)
        if gpus is None:
            return False
        self.gpu_map = gpus
        return True

    # -- acting: the one place that changes the workers, the store and the history ---------------

    def _act(
        self, workers: Workers, attempt: Attempt, obs: Observation, trouble: Trouble, decision: JobDecision
    ) -> Attempt:
        history = self.history
        from trainguard.actions import JobAction
        from trainguard.incidents import IntervalKind
        from trainguard.supervisor.attempt import Pending
        from trainguard.supervisor.decide import stop_code
        from trainguard.supervisor.policy import TroubleKind
        from trainguard.supervisor.state import RunState

        incident = self.book.incident(trouble, decision, attempt.number)
        if trouble.kind is TroubleKind.STRAGGLER:
            attempt.straggler_reported = True
        if decision.verb.keeps_running:
            if decision.checkpoint:
                self.request_checkpoint(decision.reason)
            return attempt
        self.book.close_attempt(attempt, trouble.time, "failed", trouble)
        if decision.verb.stops:
            history.stop(stop_code(decision.verb), decision.reason)
            workers.stop()
            return attempt
        history.state = RunState.RECOVERING
        if trouble.fatal:
            history.failures_in_a_row += 1
        history.signatures.append(trouble.signature)
        history.fingerprints.append(trouble.fingerprint)
        workers.stop()
        if decision.verb is JobAction.EXCLUDE_GPU and decision.gpu is not None:
            self.gpu_map = self.gpu_map.without(decision.gpu)
        if decision.backoff_s > 0:
            now = self.clock()
            self.recorder.interval(
                IntervalKind.DOWNTIME, now, now + decision.backoff_s, attempt.number, "backoff"
            )
            self.sleep(decision.backoff_s)
        if decision.counts_as_retry:
            history.restarts_used += 1
        suspect_nodes = tuple(trouble.extra.get("suspect_nodes", ()))
        pending = Pending(incident, trouble.started, obs.progress.max_step, suspect_nodes, trouble.ranks)
        history.pending.append(pending)
        restart_at = self.clock()
        self.attempt_number += 1
        if not self._preflight(attempt):
            return attempt
        if lost_nodes := suspect_nodes or tuple(n for n in [trouble.extra.get("node")] if n):
            workers.drop_peers([str(n) for n in lost_nodes])  # the next round need not wait for them
        workers.restart(decision.counts_as_retry, len(self.gpu_map.gpus))
        log.info(
            "restart: decided %.3fs after detection, group started in %.3fs",
            restart_at - trouble.time,
            self.clock() - restart_at,
        )
        self.recorder.interval(
            IntervalKind.RESTART, trouble.time, self.clock(), self.attempt_number, decision.verb.value
        )
        return self._begin_attempt(workers)

    def _drill(self, workers: Workers, obs: Observation, attempt: Attempt) -> None:
        if self.chaos is None:
            return
        from trainguard.chaos.plan import refusal, step_triggered

        if (
            not obs.heartbeats_seen
            and not self.chaos.refused
            and obs.time - self.started > self.config.watch.startup_timeout
            and (steps := step_triggered(self.chaos.plan))
        ):
            self.chaos.refused.update(steps)  # no heartbeats by now: no step will ever be seen
            log.warning("%s", refusal(self.chaos.plan, steps))
        pids = {attempt.rank_of[lr]: pid for lr, pid in workers.pids().items() if obs.codes.get(lr) is None}
        for inj in self.chaos.tick(obs.time, obs.progress.max_step, pids, attempt.gpu_of_rank):
            self.history.injected.append(inj)
            self._emit("chaos", **inj.to_dict())

    def _end_lingering(self, workers: Workers, attempt: Attempt, local_ranks: tuple[int, ...]) -> None:
        procs = workers.procs()
        for lr in local_ranks:
            log.warning("rank %s finished but is stuck in teardown; ending it", attempt.rank_of[lr])
            procs[lr].send_signal(signal.SIGKILL)

    # -- attempts, progress, recovery ------------------------------------------------------------

    def _spare_admitted(self, attempt: Attempt) -> None:
        waited = attempt.started - self.started
        summary = f"spare node {attempt.node} admitted after waiting {waited:.0f}s (world size {attempt.world_size})"
        entry = {"kind": "spare_admitted", "node": attempt.node, "attempt": attempt.number}
        self.history.nodes.append({**entry, "waited_s": round(waited, 3), "summary": summary})
        self._emit("spare_admitted", node=attempt.node, waited_s=waited, world_size=attempt.world_size)

    def _replaced(self, before: Attempt | None, attempt: Attempt) -> None:
        """A node of the last round is gone and another took its place (a spare, or one that
        came back): the report names both."""
        if before is None or before.node is None or attempt.node is None:
            return
        lost = sorted(p for p in before.peers if p not in attempt.peers and p != attempt.node)
        joined = sorted(p for p in attempt.peers if p not in before.peers and p != before.node)
        for gone, new in zip(lost, joined, strict=False):
            summary = f"node {new} took the place of node {gone}, lost at attempt {before.number}"
            entry = {"kind": "replaced", "lost": gone, "node": new, "attempt": attempt.number}
            self.history.nodes.append({**entry, "summary": summary})
            self._emit("node_replaced", lost=gone, node=new, attempt=attempt.number)

    def _begin_attempt(self, workers: Workers) -> Attempt:
        from trainguard.supervisor.attempt import Attempt
        from trainguard.supervisor.oom import oom_kills
        from trainguard.supervisor.resume import resume_point
        from trainguard.supervisor.state import RunState

        point = resume_point(self.checkpoint_dir)
        node, peers = workers.peers()
        attempt = Attempt(
            number=self.attempt_number,
            started=self.clock(),
            rank_of=workers.ranks(),
            gpu_map=self.gpu_map,
            resume_step=point.step,
            world_size=workers.world_size(),
            node=node,
            peers=peers,
            oom_kills_at_start=oom_kills(),
            standbys=workers.standbys(),
        )
        self._replaced(self.attempt, attempt)
        self.attempt = attempt
        self.history.state = RunState.RUNNING
        for step, reason in point.skipped:
            self.book.skipped_checkpoint(attempt, step, reason)
        self.observer.begin(attempt)
        self.history.world_sizes.append(attempt.world_size)
        self._emit(
            "attempt_started",
            attempt=attempt.number,
            ranks=attempt.ranks,
            world_size=attempt.world_size,
            gpus=list(self.gpu_map.gpus),
            resume_step=attempt.resume_step,
            standbys=attempt.standbys,
        )
        return attempt

    def _worker_env(self, local_rank: int, env: dict[str, str]) -> None:
        env.update(self.config.launch.env)
        env[RUN_DIR_ENV] = str(self.run_dir)
        env[ATTEMPT_ENV] = str(self.attempt_number)
        env.update(self.gpu_map.cuda_env())
        env["TRAINGUARD_GPU"] = str(self.gpu_map.gpu_of(local_rank))
        env["TRAINGUARD_JOB_ID"] = self.job_id
        if self.health.sim is not None:  # a simulated node: its GPUs' speeds, for the ranks to run at
            from trainguard.telemetry.sim.speed import SPEEDS_ENV, SPEEDS_FILE  # the simulator: only then

            env[SPEEDS_ENV] = str(self.run_dir / SPEEDS_FILE)
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT then dumps every thread's stack (hang forensics)
        for key, value in flight_recorder_env(self.run_dir).items():  # torch's flight recorder, for hangs
            env.setdefault(key, value)
        env.setdefault("PYTHONUNBUFFERED", "1")

    def _announce_heartbeats(self, obs: Observation) -> None:
        if obs.heartbeats_seen and not self._heartbeats_announced:
            from trainguard.supervisor.watch import watchers

            self._heartbeats_announced = True
            self._emit("watchers", watchers=watchers(self.config, True, self.health.active))

    def _finish(self, code: ExitCode, reason: str) -> RunResult:
        from trainguard.supervisor.state import RunState

        self._open_job()  # a launcher that failed before its workers started: the job is recorded still
        if self.attempt is not None:
            self.book.close_attempt(self.attempt, self.clock(), code.name.lower())
        self.observer.logtail.poll(final=True)
        if code is ExitCode.INTERRUPTED:
            self.history.state = RunState.INTERRUPTED
        elif code is not ExitCode.OK and not self.history.state.final:
            self.history.stop(int(code), reason)
        result = self.book.finish(
            code,
            reason,
            self.started,
            self.attempt,
            self.run_dir,
            self.attempt_number + (self._released is None),  # a released spare started none
            self.decider.reports,
        )
        self.health.close()
        self.recorder.close()
        self._emit(
            "finished",
            exit_code=int(code),
            reason=reason,
            ettr=result.goodput.get("ettr"),
            final_step=result.final_step,
        )
        return result

    def _emit(self, what: str, /, **data: Any) -> None:
        if self._on_event is None:
            return
        from trainguard.supervisor.result import RunEvent

        try:
            self._on_event(RunEvent(what, self.clock(), data))
        except Exception:
            log.debug("event callback failed", exc_info=True)
