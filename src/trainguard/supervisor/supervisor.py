"""`Supervisor`: launches training as torchrun does and keeps it alive.

One monitor loop per node (`monitor`), every ``monitor_interval`` seconds, in three steps::

    look    Observer.look(workers, attempt, now) -> Observation      (supervisor.observe)
    judge   assess(observation, attempt, history) -> Trouble | None  (supervisor.assess)
            decide(trouble, history.policy_state(...)) -> Decision    (recover.policy)
    act     record the incident; continue | restart (backoff) | exclude GPU | stop  (here)

State lives in two values: the `Attempt` of the current start (thrown away on restart) and the
`History` of the run, whose ``state`` is a `RunState` (see supervisor.attempt, supervisor.state);
what happened is written down by a `Bookkeeper` (supervisor.bookkeeping). Clock and sleep are parameters, so the loop runs
on a virtual clock in tests. Usable as a library (the demo drives it with a live display)::

    sup = Supervisor(SupervisorConfig(cmd=("python", "train.py"), nproc_per_node=2,
                                      standalone=True), on_event=print)
    result = sup.run()          # -> RunResult(exit_code=ExitCode.OK, ...)
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from trainguard.chaos import ChaosExecutor, load_plan
from trainguard.chaos.plan import GROUP_ENV, for_group, refusal, step_triggered
from trainguard.errors import MissingDependency
from trainguard.incidents import IntervalKind
from trainguard.records import Health
from trainguard.recover.policy import Decision, Trouble, TroubleKind, Verb, decide, with_diagnosis
from trainguard.rundir import ATTEMPT_ENV, RUN_DIR_ENV
from trainguard.supervisor.assess import assess, workers_done
from trainguard.supervisor.attempt import Attempt, History, Pending
from trainguard.supervisor.bookkeeping import HEALTHY_AFTER_S, Bookkeeper, RunEvent, RunResult
from trainguard.supervisor.config import ExitCode, SupervisorConfig
from trainguard.supervisor.diagnostics import Diagnostics, measured, preflight_off, preflight_troubles
from trainguard.supervisor.hang import flight_recorder_env
from trainguard.supervisor.health import Diagnose, GpuMap, NodeHealth
from trainguard.supervisor.idle import IdleWatch
from trainguard.supervisor.logs import LogTail, default_classifier, make_logs_specs
from trainguard.supervisor.lost import LostRun, find_lost_run, next_attempt
from trainguard.supervisor.observe import Observation, Observer
from trainguard.supervisor.oom import oom_kills
from trainguard.supervisor.record import JobRecorder, node_name
from trainguard.supervisor.resume import resume_point
from trainguard.supervisor.state import RunState
from trainguard.supervisor.watch import ProgressWatch, watchers

if TYPE_CHECKING:
    from trainguard.diagnose import Report

__all__ = ["HEALTHY_AFTER_S", "Launcher", "RunEvent", "RunResult", "Supervisor"]

log = logging.getLogger(__name__)

_STOP_CODES = {Verb.STOP_CRASH_LOOP: ExitCode.CRASH_LOOP, Verb.STOP_NO_CAPACITY: ExitCode.NO_CAPACITY}


class Launcher(Protocol):
    """The workers as the loop drives them (`elastic.GuardedAgent`; a fake one in tests)."""

    def start(self, local_world_size: int | None = None) -> None: ...

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None: ...

    def stop(self) -> None: ...

    def ranks(self) -> dict[int, int]: ...

    def world_size(self) -> int: ...

    def exit_codes(self) -> dict[int, int | None]: ...

    def procs(self) -> dict[int, Any]: ...

    def pids(self) -> dict[int, int]: ...

    def nodes_waiting(self) -> int: ...

    def peers(self) -> tuple[str | None, dict[str, tuple[int, ...]]]:
        """This node's rendezvous name and the other nodes' -> their global ranks."""

    def interrupted(self) -> None:
        """Raise the stop signal the supervisor received, if a handler swallowed it."""


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        on_event: Callable[[RunEvent], None] | None = None,
        diagnose: Diagnose | None = None,
        console: TextIO | None = None,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if importlib.util.find_spec("torch") is None:
            raise MissingDependency(
                "trainguard run launches workers with torch: pip install 'trainguard[torch]'"
            )
        self.config = config
        self.job_id = config.resolved_job_id()
        self.run_dir = (config.runs_root / self.job_id).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.node = node_name()
        self.clock, self.sleep = clock, sleep
        self._on_event = on_event
        self._diagnose_hook = diagnose
        self.checkpoint_dir = config.resolved_checkpoint_dir()
        self.recorder = JobRecorder(self.job_id, self.run_dir, config.resolved_db())
        gpus = config.gpus or tuple(range(config.nproc_per_node))
        self.health = NodeHealth(
            config.backend,
            max(gpus) + 1,
            self.run_dir,
            config.kernel_log,
            config.health_interval,
            config.thresholds,
            agent_url=config.agent_url,
            agent_token_file=config.agent_token_file,
        )
        watch = ProgressWatch(
            self.run_dir, config.hang_timeout_floor, config.hang_step_factor, config.startup_timeout
        )
        self.observer = Observer(
            self.run_dir,
            watch,
            self.health,
            LogTail(default_classifier(), console, config.tee),
            self.attempt_dir,
            sleep,
            IdleWatch(config.idle_timeout),
        )
        self.chaos: ChaosExecutor | None = None
        if config.chaos is not None:
            self.chaos = ChaosExecutor(
                for_group(load_plan(config.chaos), os.environ.get(GROUP_ENV)),
                self.run_dir,
                0.0,
                self.health.fleet,
                self.checkpoint_dir,
            )
        self.history = History()
        self.book = Bookkeeper(self.job_id, self.node, self.recorder, self.history, watch, self._emit, clock)
        # Active diagnostics need GPUs to test: the simulated fleet's or NVML's.
        self.diagnostics: Diagnostics | None = None
        if config.backend in ("sim", "nvml") and self.health.active:
            self.diagnostics = Diagnostics(config.backend, self.health.fleet, self.run_dir)
        self._preflight_on = preflight_off(config, self.health.active) is None
        self.gpu_map = GpuMap(gpus)  # what the next start uses
        self.attempt_number = 0  # of the next (or current) start
        self.attempt: Attempt | None = None
        self.started = 0.0
        self._pool: Any = None
        self._lost: LostRun | None = None  # this job id's previous run, killed with its supervisor
        self._heartbeats_announced = False

    # -- public --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Launch the workers and watch them until the job finishes, is stopped or interrupted."""
        try:
            from trainguard.supervisor.elastic import launch
        except ImportError as exc:
            raise ImportError(
                f"trainguard run needs torch ({exc}): pip install 'trainguard[torch]'"
            ) from None
        cfg = self.config
        self.started = self.clock()
        self._lost = find_lost_run(self.recorder.job_info(), self.run_dir)
        self.attempt_number = next_attempt(self.run_dir)  # a re-run of a job id continues its attempts
        started = self._lost.started if self._lost is not None else self.started
        self.recorder.start_job(started, shlex.join(cfg.cmd), cfg.nproc_per_node)
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
        if cfg.warm_standby:
            from trainguard.supervisor.warm import WarmPool

            self._pool = WarmPool(
                cfg.preload, refill_delay_s=cfg.warm_refill_delay_s, refill_nice=cfg.warm_refill_nice
            )
            self._pool.fill(
                cfg.nproc_per_node * cfg.warm_standby_sets
            )  # they import while the rendezvous runs
        # Workers host a fresh TCPStore per attempt (torch's own opt-out of sharing the agent's):
        # a shared store keeps the dead attempt's gloo addresses, and a restarted rank that reads
        # a stale peer address before the peer rewrites it times out connecting.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        code, reason = ExitCode.FAILED, "launcher error"
        try:
            signame = launch(
                self.torchrun_argv(),
                self.monitor,
                self._worker_env,
                make_logs_specs(lambda: self.attempt_dir(self.attempt_number)),
                self._pool,
                cfg.kill_grace_s,
            )
            if signame is not None:
                code, reason = ExitCode.INTERRUPTED, f"supervisor received {signame}"
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

    def torchrun_argv(self) -> list[str]:
        """The torchrun command line this job is (after ``torchrun``)."""
        cfg = self.config
        argv = ["--nproc-per-node", str(cfg.nproc_per_node), "--nnodes", cfg.nnodes]
        argv += ["--max-restarts", str(cfg.max_restarts), "--monitor-interval", str(cfg.monitor_interval)]
        if cfg.standalone:  # what torchrun's run() does for --standalone
            argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", self.job_id]
        else:
            argv += ["--rdzv-backend", cfg.rdzv_backend, "--rdzv-endpoint", cfg.rdzv_endpoint]
            argv += ["--rdzv-id", cfg.rdzv_id or self.job_id]
        if cfg.rdzv_conf:
            argv += ["--rdzv-conf", cfg.rdzv_conf]
        return [*argv, *cfg.extra_torchrun_args, "--no-python", *cfg.cmd]

    def attempt_dir(self, number: int) -> Path:
        return self.run_dir / "logs" / self.node.replace(":", "-") / f"attempt{number}"

    # -- the monitor loop: look, judge, act ----------------------------------------------------

    def monitor(self, workers: Launcher) -> bool:
        """Watch the workers until they finish (True) or the policy stops the job (False)."""
        if not self._preflight(None):
            return False
        workers.start(len(self.gpu_map.gpus))
        attempt = self._begin_attempt(workers)
        # The launcher's own start (rendezvous, pre-flight, starting the workers) is the job's
        # init as much as the workers' imports are; uncharged, a loaded host's slow start would
        # show in the ledger as time no interval covers.
        self.recorder.interval(IntervalKind.INIT, self.started, attempt.started, attempt.number, "launch")
        if self._lost is not None:
            lost = self.recorder.lost_run(self._lost, attempt.started, attempt.resume_step)
            self.history.pending.append(Pending(lost, self._lost.last_seen, self._lost.furthest_step))
        while True:
            self.sleep(self.config.monitor_interval)
            workers.interrupted()
            obs = self.observer.look(workers, attempt, self.clock())
            self._remember(obs, attempt)
            self._announce_heartbeats(obs)
            self.book.progress(obs, attempt)
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
            trouble, decision = self._decide(trouble)
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

    def _decide(self, trouble: Trouble) -> tuple[Trouble, Decision]:
        state = self.history.policy_state(self.config, len(self.gpu_map.gpus), trouble.fatal)
        decision = decide(trouble, state)
        if decision.verb is Verb.DIAGNOSE and decision.gpu is not None:
            health, lines, report = self._diagnose(decision.gpu)
            summary = report.summary() if report is not None else None
            self._emit(
                "diagnosis", gpu=decision.gpu, health=health.value, summary=summary, measured=list(lines)
            )
            trouble = with_diagnosis(trouble, health)
            extra = (
                {**trouble.extra, "diagnostics": summary, "report": report.to_dict()}
                if report
                else trouble.extra
            )
            trouble = replace(trouble, evidence=(*trouble.evidence, *lines), extra=extra)
            decision = decide(trouble, state)
        return trouble, decision

    def _diagnose(self, gpu: int) -> tuple[Health, tuple[str, ...], Report | None]:
        """The GPU's health after diagnostics, the figures measured and the report:
        the caller's hook, else the compute and SDC tests against the job's other GPUs, else
        (no GPU backend) a fresh look at the node's telemetry."""
        try:
            if self._diagnose_hook is None and self.diagnostics is not None:
                report = self.diagnostics.after_incident(gpu, self.gpu_map.gpus, self.attempt_number)
                return report.gpu_health(gpu), measured(report, gpu), report
            return (self._diagnose_hook or self.health.diagnose_builtin)(gpu), (), None
        except Exception as exc:
            log.warning("diagnostics on GPU %s failed: %s", gpu, exc)
            return Health.UNKNOWN, (f"diagnostics on GPU {gpu} could not run: {exc}",), None

    def _preflight(self, ending: Attempt | None) -> bool:
        """Diagnostics on the GPUs the next start uses; each GPU that fails them is an incident,
        and excluded (the policy's call). False when the policy stops the job instead."""
        if not self._preflight_on or self.diagnostics is None:
            return True
        try:
            report = self.diagnostics.preflight(self.gpu_map.gpus, self.attempt_number)
        except Exception as exc:  # a broken test must not keep training from starting
            log.warning("pre-flight diagnostics could not run: %s", exc)
            return True
        self._emit(
            "preflight",
            attempt=self.attempt_number,
            gpus=list(self.gpu_map.gpus),
            verdict=report.verdict.value,
            summary=report.summary(),
            seconds=round(report.seconds, 3),
        )
        rank_of_gpu = ending.rank_of_gpu if ending is not None else (lambda g: None)
        for trouble in preflight_troubles(report, self.gpu_map.gpus, self.clock(), rank_of_gpu):
            decision = decide(trouble, self.history.policy_state(self.config, len(self.gpu_map.gpus), True))
            incident = self.book.incident(trouble, decision, self.attempt_number)
            if decision.verb.stops:
                self.history.stop(int(_STOP_CODES.get(decision.verb, ExitCode.FAILED)), decision.reason)
                return False
            if decision.verb is Verb.EXCLUDE_GPU and decision.gpu is not None:
                self.gpu_map = self.gpu_map.without(decision.gpu)
                resolution = f"GPU {decision.gpu} excluded before attempt {self.attempt_number} started"
                self.recorder.update(incident, resolved=True, resolution=resolution)
        return True

    # -- acting: the one place that changes the workers, the store and the history ---------------

    def _act(
        self, workers: Launcher, attempt: Attempt, obs: Observation, trouble: Trouble, decision: Decision
    ) -> Attempt:
        history = self.history
        incident = self.book.incident(trouble, decision, attempt.number)
        if trouble.kind is TroubleKind.STRAGGLER:
            attempt.straggler_reported = True
        if decision.verb is Verb.CONTINUE:
            return attempt
        self.book.close_attempt(attempt, trouble.time, "failed", trouble)
        if decision.verb.stops:
            history.stop(int(_STOP_CODES.get(decision.verb, ExitCode.FAILED)), decision.reason)
            workers.stop()
            return attempt
        history.state = RunState.RECOVERING
        if trouble.fatal:
            history.failures_in_a_row += 1
        history.signatures.append(trouble.signature)
        workers.stop()
        if decision.verb is Verb.EXCLUDE_GPU and decision.gpu is not None:
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

    def _drill(self, workers: Launcher, obs: Observation, attempt: Attempt) -> None:
        if self.chaos is None:
            return
        if (
            not obs.heartbeats_seen
            and not self.chaos.refused
            and obs.time - self.started > self.config.startup_timeout
            and (steps := step_triggered(self.chaos.plan))
        ):
            self.chaos.refused.update(steps)  # no heartbeats by now: no step will ever be seen
            log.warning("%s", refusal(self.chaos.plan, steps))
        pids = {attempt.rank_of[lr]: pid for lr, pid in workers.pids().items() if obs.codes.get(lr) is None}
        for inj in self.chaos.tick(obs.time, obs.progress.max_step, pids, attempt.gpu_of_rank):
            self.history.injected.append(inj)
            self._emit("chaos", **inj.to_dict())

    def _end_lingering(self, workers: Launcher, attempt: Attempt, local_ranks: tuple[int, ...]) -> None:
        procs = workers.procs()
        for lr in local_ranks:
            log.warning("rank %s finished but is stuck in teardown; ending it", attempt.rank_of[lr])
            procs[lr].send_signal(signal.SIGKILL)

    # -- attempts, progress, recovery ------------------------------------------------------------

    def _begin_attempt(self, workers: Launcher) -> Attempt:
        point = resume_point(self.checkpoint_dir)
        node, peers = workers.peers()
        use = self._pool.take_use() if self._pool is not None else None
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
            standbys=use.to_dict() if use is not None else None,
        )
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
        env.update(self.config.env)
        env[RUN_DIR_ENV] = str(self.run_dir)
        env[ATTEMPT_ENV] = str(self.attempt_number)
        env.update(self.gpu_map.cuda_env())
        env["TRAINGUARD_GPU"] = str(self.gpu_map.gpu_of(local_rank))
        env["TRAINGUARD_JOB_ID"] = self.job_id
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT then dumps every thread's stack (hang forensics)
        for key, value in flight_recorder_env(self.run_dir).items():  # torch's flight recorder, for hangs
            env.setdefault(key, value)
        env.setdefault("PYTHONUNBUFFERED", "1")

    def _announce_heartbeats(self, obs: Observation) -> None:
        if obs.heartbeats_seen and not self._heartbeats_announced:
            self._heartbeats_announced = True
            self._emit("watchers", watchers=watchers(self.config, True, self.health.active))

    def _finish(self, code: ExitCode, reason: str) -> RunResult:
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
            self.attempt_number + 1,
            tuple(self.diagnostics.reports) if self.diagnostics is not None else (),
        )
        self.health.close()
        if self._pool is not None:
            self._pool.close()
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
        try:
            self._on_event(RunEvent(what, self.clock(), data))
        except Exception:
            log.debug("event callback failed", exc_info=True)
