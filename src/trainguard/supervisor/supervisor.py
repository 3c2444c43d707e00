"""`Supervisor`: launches training through torch's elastic agent and keeps it alive.

One monitor loop per node (`_loop`), every ``monitor_interval`` seconds:

    exit codes  ->  error files  ->  log lines  ->  heartbeats  ->  node health  ->  chaos
         \\___________________  assess: one Trouble  ____________________/
                                      |
                         recover.policy.decide(Trouble, history)
                                      |
        restart (backoff) | exclude GPU | diagnose first | continue | stop (exit code)

Usable as a library (the demo drives it with a live display)::

    sup = Supervisor(SupervisorConfig(cmd=("python", "train.py"), nproc_per_node=2,
                                      standalone=True), on_event=print)
    result = sup.run()          # -> RunResult(exit_code=ExitCode.OK, ...)
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from trainguard.chaos import ChaosExecutor, Injected, load_plan
from trainguard.chaos.plan import refusal, step_triggered
from trainguard.incidents import Incident, IntervalKind, RootCause
from trainguard.records import Health
from trainguard.recover.policy import Failure, FailureKind, PolicyState, Verb, decide, with_diagnosis
from trainguard.rundir import ATTEMPT_ENV, RUN_DIR_ENV
from trainguard.supervisor.assess import Trouble
from trainguard.supervisor.config import ExitCode, SupervisorConfig
from trainguard.supervisor.health import Diagnose, GpuMap, NodeHealth
from trainguard.supervisor.idle import IdleWatch
from trainguard.supervisor.logs import LogTail, default_classifier
from trainguard.supervisor.lost import LostRun, find_lost_run, next_attempt
from trainguard.supervisor.observe import Observer
from trainguard.supervisor.record import JobRecorder, node_name
from trainguard.supervisor.resume import resume_point
from trainguard.supervisor.watch import ProgressWatch, watchers

log = logging.getLogger(__name__)

RUNNING_S = 10.0  # no heartbeats: restarted workers running this long count as recovered


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One thing that happened, for live displays: kind is job_started | attempt_started |
    progress | chaos | incident | diagnosis | recovered | finished | watchers (what is watched,
    at start in ``job_started`` and again when heartbeats appear)."""

    kind: str
    time: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_code: ExitCode
    job_id: str
    run_dir: Path
    reason: str
    attempts: int
    final_step: int | None
    incidents: tuple[Incident, ...] = ()
    injected: tuple[Injected, ...] = ()
    goodput: dict[str, Any] = field(default_factory=dict)
    recoveries: tuple[dict[str, Any], ...] = ()  # per restart: failure time, first step after, mttr
    world_sizes: tuple[int, ...] = ()  # per attempt: the job's world size after rendezvous


class Supervisor(Observer):
    def __init__(
        self,
        config: SupervisorConfig,
        on_event: Callable[[RunEvent], None] | None = None,
        diagnose: Diagnose | None = None,
        console: TextIO | None = None,
    ) -> None:
        self.config = config
        self.job_id = config.resolved_job_id()
        self.run_dir = (config.runs_root / self.job_id).resolve()
        self.node = node_name()
        self._on_event = on_event
        self._diagnose_hook = diagnose
        self._console = console
        self.attempt = 0
        self.gpu_map = GpuMap(tuple(range(config.nproc_per_node)))
        self._stopping: tuple[ExitCode, str] | None = None
        self._straggler_seen = False
        self._attempt_closed = False
        self._failures_in_a_row = 0
        self._degraded_reported = False
        self._pool: Any = None
        self._findings_seen: set[tuple[Any, ...]] = set()
        self.world_sizes: list[int] = []
        self._numerics_steps: dict[int, Incident] = {}
        self._heartbeats_announced = False
        self._lost: LostRun | None = None

    # -- public --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.ckpt_dir = cfg.resolved_checkpoint_dir()
        self.recorder = JobRecorder(self.job_id, self.run_dir, cfg.resolved_db())
        self._lost = find_lost_run(self.recorder.job_info(), self.run_dir)  # this job, killed before
        self.attempt = next_attempt(self.run_dir)  # a re-run of a job id continues its attempts
        started = self._lost.started if self._lost is not None else self.started
        self.recorder.start_job(started, shlex.join(cfg.cmd), cfg.nproc_per_node)
        self.health = NodeHealth(
            cfg.backend, cfg.nproc_per_node, self.run_dir, cfg.kernel_log, cfg.health_interval, cfg.thresholds
        )
        self.watch = ProgressWatch(
            self.run_dir, cfg.hang_timeout_floor, cfg.hang_step_factor, cfg.startup_timeout
        )
        self.idle = IdleWatch(cfg.idle_timeout)
        self.logtail = LogTail(default_classifier(), self._console, cfg.tee)
        self.chaos = None
        if cfg.chaos is not None:
            self.chaos = ChaosExecutor(
                load_plan(cfg.chaos), self.run_dir, self.started, self.health.fleet, self.ckpt_dir
            )
            self.chaos.prepare()
        self._emit(
            "job_started",
            job=self.job_id,
            run_dir=str(self.run_dir),
            gpus=list(self.gpu_map.gpus),
            watchers=watchers(cfg, heartbeats=False),
        )
        agent, spec = self._build_agent()
        self._agent = agent
        code, reason = ExitCode.FAILED, "launcher error"
        previous = _handle_signals()
        try:
            agent.run()
            code, reason = self._stopping or (ExitCode.OK, "all workers finished")
        except SignalException as exc:
            code, reason = ExitCode.INTERRUPTED, f"supervisor received {exc.sigval.name}"
        except KeyboardInterrupt:
            code, reason = ExitCode.INTERRUPTED, "interrupted"
        except Exception as exc:
            log.exception("supervisor failed")
            code, reason = ExitCode.FAILED, f"launcher error: {exc}"
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # Like torchrun: a node that is told to go (a signal) leaves the rendezvous open, so the
        # other nodes re-form the group without it; a finished job closes it.
        if code is not ExitCode.INTERRUPTED:
            try:
                spec.rdzv_handler.shutdown()
            except Exception:
                log.debug("rendezvous shutdown failed", exc_info=True)
        return self._finish(code, reason)

    # -- setup ---------------------------------------------------------------------------------

    def _build_agent(self) -> tuple[Any, Any]:
        from torch.distributed.elastic.agent.server.api import WorkerSpec
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous import registry as rdzv_registry
        from torch.distributed.run import config_from_args, get_args_parser

        from trainguard.supervisor.elastic import GuardedAgent
        from trainguard.supervisor.logs import make_logs_specs

        cfg = self.config
        # Workers host a fresh TCPStore per attempt (torch's own opt-out of sharing the agent's):
        # a shared store keeps the dead attempt's gloo addresses, and a restarted rank that reads
        # a stale peer address before the peer rewrites it times out connecting.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        argv = [
            "--nproc-per-node",
            str(cfg.nproc_per_node),
            "--nnodes",
            cfg.nnodes,
            "--max-restarts",
            str(cfg.max_restarts),
            "--monitor-interval",
            str(cfg.monitor_interval),
        ]
        if cfg.standalone:  # what torchrun's run() does for --standalone
            argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", self.job_id]
        else:
            argv += [
                "--rdzv-backend",
                cfg.rdzv_backend,
                "--rdzv-endpoint",
                cfg.rdzv_endpoint,
                "--rdzv-id",
                cfg.rdzv_id or self.job_id,
            ]
        if cfg.rdzv_conf:
            argv += ["--rdzv-conf", cfg.rdzv_conf]
        argv += [*cfg.extra_torchrun_args, "--no-python", *cfg.cmd]
        # torchrun's own parser and config: every torchrun flag means what it means there.
        launch, entrypoint, args = config_from_args(get_args_parser().parse_args(argv))
        params = RendezvousParameters(
            backend=launch.rdzv_backend,
            endpoint=launch.rdzv_endpoint,
            run_id=launch.run_id,
            min_nodes=launch.min_nodes,
            max_nodes=launch.max_nodes,
            local_addr=launch.local_addr,
            **launch.rdzv_configs,
        )
        spec = WorkerSpec(
            role=launch.role,
            local_world_size=cfg.nproc_per_node,
            entrypoint=entrypoint,
            args=tuple(args),
            rdzv_handler=rdzv_registry.get_rendezvous_handler(params),
            max_restarts=cfg.max_restarts,
            monitor_interval=cfg.monitor_interval,
            local_addr=launch.local_addr,
        )
        pool = None
        if cfg.warm_standby:
            from trainguard.supervisor.warm import WarmPool

            pool = WarmPool(cfg.preload)
            pool.fill(cfg.nproc_per_node)  # they import torch while the rendezvous runs
        agent = GuardedAgent(
            spec,
            make_logs_specs(self._attempt_dir),
            loop=self._loop,
            env_hook=self._worker_env,
            pool=pool,
            start_method=launch.start_method,
            exit_barrier_timeout=60,
        )
        agent.stop_grace_s = cfg.kill_grace_s
        self._pool = pool
        return agent, spec

    def _attempt_dir(self) -> Path:
        return self.run_dir / "logs" / self.node.replace(":", "-") / f"attempt{self.attempt}"

    def _worker_env(self, local_rank: int, env: dict[str, str]) -> None:
        env.update(self.config.env)
        env[RUN_DIR_ENV] = str(self.run_dir)
        env[ATTEMPT_ENV] = str(self.attempt)
        env["CUDA_VISIBLE_DEVICES"] = self.gpu_map.cuda_visible_devices()
        env["TRAINGUARD_GPU"] = str(self.gpu_map.gpu_of(local_rank))
        env["TRAINGUARD_JOB_ID"] = self.job_id
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT then dumps every thread's stack (hang forensics)
        env.setdefault("PYTHONUNBUFFERED", "1")

    # -- the monitor loop ----------------------------------------------------------------------

    def _loop(self, agent: Any) -> Any:
        from torch.distributed.elastic.agent.server.api import RunResult as TorchResult
        from torch.distributed.elastic.agent.server.api import WorkerState

        self._agent = agent
        self._failures_in_a_row = 0
        self._restarts_used = 0
        self._signatures: list[str | None] = []
        self._pending: list[tuple[Incident, float, int | None]] = []  # incident, failure time, step before
        self.recoveries: list[dict[str, Any]] = []
        self._start_attempt(first=True)
        if self._lost is not None:
            lost = self.recorder.lost_run(self._lost, self._attempt_started, self.resume_step)
            self._pending.append((lost, self._lost.last_seen, self._lost.furthest_step))
        next_membership = 0.0
        while True:
            time.sleep(self.config.monitor_interval)
            now = time.time()
            trouble, done = self._observe(now)
            if done:
                agent.exit_barrier()
                self._close_attempt(now, "succeeded")
                return TorchResult(WorkerState.SUCCEEDED, dict.fromkeys(self._rank_of.values()))
            if trouble is not None and self._handle(trouble):
                if self._stopping is not None:
                    return TorchResult(state=WorkerState.FAILED)
                continue
            if now >= next_membership:
                next_membership = now + 1.0
                if agent.nodes_waiting() > 0:
                    self._handle(
                        Trouble(
                            Failure(FailureKind.MEMBERSHIP),
                            "rendezvous",
                            now,
                            now,
                            "a node is waiting to join: re-form the group",
                        )
                    )

    # -- acting --------------------------------------------------------------------------------

    def _handle(self, trouble: Trouble) -> bool:
        """Decide and act; True when the workers were restarted or stopped."""
        cfg = self.config
        state = PolicyState(
            max_restarts=cfg.max_restarts,
            restarts_used=self._restarts_used,
            failures_in_a_row=self._failures_in_a_row + (1 if trouble.failure.fatal else 0),
            recent_signatures=tuple(self._signatures),
            crash_loop_after=cfg.crash_loop_after,
            gpus_in_use=len(self.gpu_map.gpus),
            min_gpus=cfg.min_nproc,
            backoff_base_s=cfg.backoff_base_s,
            backoff_max_s=cfg.backoff_max_s,
        )
        decision = decide(trouble.failure, state)
        if decision.verb is Verb.DIAGNOSE and decision.gpu is not None:
            health = self._diagnose(decision.gpu)
            self._emit("diagnosis", gpu=decision.gpu, health=health.value)
            trouble.failure = with_diagnosis(trouble.failure, health)
            trouble.evidence.append(f"diagnostics on GPU {decision.gpu}: {health.value}")
            decision = decide(trouble.failure, state)
        incident = self.recorder.add(
            Incident(
                job=self.job_id,
                time=trouble.time,
                root_cause=trouble.root_cause,
                action=decision.verb.value,
                summary=trouble.summary,
                started=trouble.started,
                category=trouble.failure.category or trouble.failure.kind.value,
                evidence=tuple([decision.reason, *trouble.evidence]),
                gpu=trouble.failure.gpu,
                node=self.node,
                rank=trouble.rank,
                attempt=self.attempt,
                detected_by=trouble.detected_by,
                detection_delay_s=max(0.0, trouble.time - trouble.started),
                resolved=decision.verb is Verb.CONTINUE,
                resolution="workers kept running" if decision.verb is Verb.CONTINUE else None,
            )
        )
        if trouble.failure.kind is FailureKind.NUMERICS and "step" in trouble.extra:
            self._numerics_steps[trouble.extra["step"]] = incident
        if trouble.failure.kind is FailureKind.GPU_DEGRADED:
            self._degraded_reported = True
        self._emit("incident", **incident.to_dict(), kind=trouble.failure.kind.value, extra=trouble.extra)
        log.warning(
            "incident %s: %s -> %s (%s)", incident.id, trouble.summary, decision.verb.value, decision.reason
        )
        if decision.verb is Verb.CONTINUE:
            return False
        step_before = self.watch.poll(time.time()).max_step
        self._close_attempt(trouble.time, "failed", trouble)
        if decision.verb.stops:
            code = {
                Verb.STOP_CRASH_LOOP: ExitCode.CRASH_LOOP,
                Verb.STOP_NO_CAPACITY: ExitCode.NO_CAPACITY,
            }.get(decision.verb, ExitCode.FAILED)
            self._stopping = (code, decision.reason)
            self._agent.stop_group()
            return True
        if trouble.failure.fatal:
            self._failures_in_a_row += 1
        self._signatures.append(trouble.failure.signature)
        self._agent.stop_group()
        if decision.verb is Verb.EXCLUDE_GPU and decision.gpu is not None:
            self.gpu_map = self.gpu_map.without(decision.gpu)
            self._agent.group.spec.local_world_size = len(self.gpu_map.gpus)
        if decision.backoff_s > 0:
            self.recorder.interval(
                IntervalKind.DOWNTIME, time.time(), time.time() + decision.backoff_s, self.attempt, "backoff"
            )
            time.sleep(decision.backoff_s)
        if decision.counts_as_retry:
            self._restarts_used += 1
        self._pending.append((incident, trouble.started, step_before))
        restart_at = time.time()
        self.attempt += 1
        self._agent.restart_group(decision.counts_as_retry)
        log.info(
            "restart: decided %.3fs after detection, group started in %.3fs",
            restart_at - trouble.time,
            time.time() - restart_at,
        )
        self.recorder.interval(
            IntervalKind.RESTART, trouble.time, time.time(), self.attempt, decision.verb.value
        )
        self._start_attempt()
        return True

    def _diagnose(self, gpu: int) -> Health:
        hook = self._diagnose_hook or self.health.diagnose_builtin
        try:
            return hook(gpu)
        except Exception as exc:
            log.warning("diagnostics on GPU %s failed: %s", gpu, exc)
            return Health.UNKNOWN

    # -- attempts, progress, recovery ------------------------------------------------------------

    def _start_attempt(self, first: bool = False) -> None:
        group = self._agent.group
        if first:
            self._agent.start_group()
            self.injected: list[Injected] = []
            self._gpu_seen: set[tuple[int, Health, tuple[str, ...]]] = set()
            self._skipped_checkpoints: set[int] = set()
        self._attempt_started = time.time()
        self._attempt_closed = False
        self._rank_of = {w.local_rank: w.global_rank for w in group.workers}
        self._exit_seen: dict[int, float] = {}
        self._teardown_aborts: set[int] = set()  # local ranks that finished, then aborted at exit
        self._events: list[Any] = []
        self._straggler_seen = False
        self._last_step_emitted: int | None = None
        self._first_step_seen = False
        point = resume_point(self.ckpt_dir)
        self.resume_step = point.step
        for step, reason in point.skipped:
            self._record_skipped_checkpoint(step, reason)
        self.watch.begin_attempt(self.attempt, sorted(self._rank_of.values()), self._attempt_started)
        self.idle.begin_attempt(self._attempt_started)
        files = {}
        for rank in self._rank_of.values():
            for stream in ("stdout", "stderr"):
                files[(rank, stream)] = self._attempt_dir() / f"rank{rank}.{stream}"
        self.logtail.follow(files)
        self.world_sizes.append(group.workers[0].world_size if group.workers else 0)
        self._emit(
            "attempt_started",
            attempt=self.attempt,
            ranks=sorted(self._rank_of.values()),
            world_size=group.workers[0].world_size if group.workers else 0,
            gpus=list(self.gpu_map.gpus),
            resume_step=self.resume_step,
        )

    def _record_skipped_checkpoint(self, step: int, reason: str) -> None:
        """A checkpoint the resume must skip is an incident of its own (storage lost data the job
        relied on), recorded once per checkpoint; the resume itself goes on from an older one."""
        if step in self._skipped_checkpoints:
            return
        self._skipped_checkpoints.add(step)
        incident = self.recorder.add(
            Incident(
                job=self.job_id,
                time=time.time(),
                root_cause=RootCause.DEPENDENCY,
                action="skip_torn_checkpoint",
                summary=f"checkpoint step {step} failed verification; resuming from step {self.resume_step}",
                category="checkpoint",
                evidence=(reason, {"skipped_step": step, "resume_step": self.resume_step}),
                node=self.node,
                attempt=self.attempt,
                detected_by="checkpoint_verify",
                resolved=True,
                resolution=f"resumed from step {self.resume_step}",
            )
        )
        self._emit("incident", **incident.to_dict(), kind="checkpoint", extra={"step": step})
        log.warning("incident %s: checkpoint step %d is invalid (%s); skipped", incident.id, step, reason)

    def _progress(self, prog: Any, now: float) -> None:
        if self._failures_in_a_row and prog.first_step_time is not None and now - prog.first_step_time > 10:
            self._failures_in_a_row = 0  # healthy progress since the last failure: backoff starts over
        if self.watch.heartbeats_seen and not self._heartbeats_announced:
            self._heartbeats_announced = True
            self._emit("watchers", watchers=watchers(self.config, heartbeats=True))
        elif (
            self.chaos is not None
            and not self.watch.heartbeats_seen
            and not self.chaos.refused
            and now - self.started > self.config.startup_timeout
            and (steps := step_triggered(self.chaos.plan))
        ):
            self.chaos.refused.update(steps)  # no heartbeats by now: no step will ever be seen
            log.warning("%s", refusal(self.chaos.plan, steps))
        if prog.first_step_time is not None and not self._first_step_seen:
            self._first_step_seen = True
            self.recorder.interval(
                IntervalKind.INIT, self._attempt_started, prog.first_step_time, self.attempt
            )
            self._resolve_pending(prog.first_step_time)
        elif self._pending and not self.watch.heartbeats_seen and now - self._attempt_started > RUNNING_S:
            self._resolve_pending(None)  # no heartbeats: the restarted workers run, steps unknown
        if prog.max_step is not None and prog.max_step != self._last_step_emitted:
            self._last_step_emitted = prog.max_step
            self._emit(
                "progress", step=prog.max_step, loss=prog.loss, step_time=prog.step_time, attempt=self.attempt
            )
            if prog.max_step % 10 == 0:
                self.recorder.progress(now, prog.max_step, prog.loss, self.attempt)

    def _resolve_pending(self, first_step_time: float | None) -> None:
        step_time = self.watch.baseline_step_time or 0.0
        for incident, failed_at, step_before in self._pending:
            if first_step_time is None:
                self._resolve_unmeasured(incident, failed_at)
                continue
            known = step_before is not None and self.resume_step is not None  # else: not measured
            redone = max(0, (step_before or 0) - (self.resume_step or 0)) if known else 0
            lost = (first_step_time - failed_at) + redone * step_time
            if redone and step_time:
                self.recorder.interval(
                    IntervalKind.LOST, failed_at - redone * step_time, failed_at, self.attempt - 1
                )
            self.recorder.update(
                incident,
                time_lost_s=round(lost, 3),
                resolved=True,
                resolution=f"resumed at step {self.resume_step or 0} (attempt {self.attempt})",
            )
            rec = {
                "incident": incident.id,
                "failed_at": failed_at,
                "first_step_at": first_step_time,
                "mttr_s": first_step_time - failed_at,
                "resume_step": self.resume_step,
                "steps_redone": redone,
            }
            self.recoveries.append(rec)
            self._emit("recovered", **rec)
        self._pending = []

    def _resolve_unmeasured(self, incident: Incident, failed_at: float) -> None:
        """Recovered, for a script without heartbeats: its restarted workers run. The restart
        time is known; the first step after it and the work redone are not."""
        resolution = f"workers restarted (attempt {self.attempt}); no step reported since (no heartbeats)"
        self.recorder.update(incident, resolved=True, resolution=resolution)
        rec = {
            "incident": incident.id,
            "failed_at": failed_at,
            "first_step_at": None,
            "mttr_s": None,
            "restart_s": self._attempt_started - failed_at,
            "resume_step": None,
            "steps_redone": None,
        }
        self.recoveries.append(rec)
        self._emit("recovered", **rec)

    def _close_attempt(self, end: float, outcome: str, trouble: Trouble | None = None) -> None:
        if self._attempt_closed:
            return
        self._attempt_closed = True
        prog_start = self.watch.poll(end).first_step_time
        stop = trouble.started if trouble is not None else end
        if prog_start is not None:
            self.recorder.interval(IntervalKind.PRODUCTIVE, prog_start, stop, self.attempt, outcome)
        elif not self.watch.heartbeats_seen:  # it ran; how productively, nothing says
            self.recorder.interval(
                IntervalKind.UNMEASURED, self._attempt_started, stop, self.attempt, outcome
            )
        if outcome == "succeeded" and self._pending:  # finished before reporting a step
            self._resolve_pending(None)
        if trouble is not None and trouble.time > trouble.started:
            self.recorder.interval(IntervalKind.DETECTION, trouble.started, trouble.time, self.attempt)
        for start, stop_ in self.watch.checkpoint_stalls:  # saves the heartbeats made visible
            self.recorder.interval(IntervalKind.CHECKPOINT, start, stop_, self.attempt)
        self.watch.checkpoint_stalls.clear()

    def _finish(self, code: ExitCode, reason: str) -> RunResult:
        ended = time.time()
        if hasattr(self, "_attempt_started"):
            self._close_attempt(ended, code.name.lower())
        self.logtail.poll(final=True)
        status = {
            ExitCode.OK: "succeeded",
            ExitCode.CRASH_LOOP: "crash_loop",
            ExitCode.NO_CAPACITY: "no_capacity",
            ExitCode.INTERRUPTED: "interrupted",
        }.get(code, "failed")
        summary = self.recorder.finish(self.started, ended, status)
        self.health.close()
        if self._pool is not None:
            self._pool.close()
        final_step = self.watch.furthest_step
        result = RunResult(
            code,
            self.job_id,
            self.run_dir,
            reason,
            self.attempt + 1,
            final_step,
            tuple(self.recorder.incidents),
            tuple(getattr(self, "injected", [])),
            summary.to_dict(),
            tuple(getattr(self, "recoveries", [])),
            tuple(self.world_sizes),
        )
        self.recorder.close()
        self._emit("finished", exit_code=int(code), reason=reason, ettr=summary.ettr, final_step=final_step)
        return result

    # -- helpers -------------------------------------------------------------------------------

    def _emit(self, what: str, /, **data: Any) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(RunEvent(what, time.time(), data))
        except Exception:
            log.debug("event callback failed", exc_info=True)


def _handle_signals() -> dict[signal.Signals, Any]:
    """SIGTERM/SIGINT/SIGHUP raise torch's SignalException in the main thread, so the agent
    stops the workers (torch registers the same only when it starts processes itself; warm
    standbys bypass that). Returns the previous handlers."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def _raise(signum: int, _frame: Any) -> None:
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _raise)
    return previous
