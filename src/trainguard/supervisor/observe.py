"""The supervisor's eyes: one pass over every source of evidence, folded into one ``Trouble``.

``Observer._observe`` runs every ``--monitor-interval``: worker exit codes, worker output (the
training-log classifier), heartbeats (hangs, stragglers, non-finite losses), the Guard's numerics
findings, node health and chaos drills. It returns the first trouble found (or that the workers
are done); ``Supervisor`` (which mixes this in) decides and acts on it. The pure folds live in
``supervisor.assess``; here is the gathering, which needs the supervisor's state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from trainguard.chaos import Injected
from trainguard.incidents import Incident, RootCause
from trainguard.records import Finding, Health
from trainguard.recover.policy import Failure, FailureKind
from trainguard.rundir import read_errors
from trainguard.supervisor.assess import (
    TEARDOWN_SIGNALS,
    Exited,
    Trouble,
    aborted_after_finishing,
    exit_trouble,
    gpu_trouble,
)
from trainguard.supervisor.health import GpuMap, NodeHealth
from trainguard.supervisor.idle import IdleWatch
from trainguard.supervisor.logs import LogTail, default_classifier
from trainguard.supervisor.record import JobRecorder
from trainguard.supervisor.watch import ProgressWatch, straggler

log = logging.getLogger(__name__)

EXIT_GRACE_S = 10.0  # a rank that said goodbye may take this long to exit once its peers have


class Observer:
    """Mixed into ``Supervisor``: the state it reads is the supervisor's own (declared here)."""

    run_dir: Path
    attempt: int
    watch: ProgressWatch
    idle: IdleWatch
    health: NodeHealth
    logtail: LogTail
    recorder: JobRecorder
    gpu_map: GpuMap
    chaos: Any
    injected: list[Injected]
    _agent: Any
    _rank_of: dict[int, int]  # local rank -> global rank, this attempt
    _exit_seen: dict[int, float]
    _teardown_aborts: set[int]
    _events: list[Any]
    _straggler_seen: bool
    _degraded_reported: bool
    _numerics_steps: dict[int, Incident]
    _findings_seen: set[tuple[Any, ...]]
    _gpu_seen: set[tuple[int, Health, tuple[str, ...]]]
    _attempt_started: float

    def _attempt_dir(self) -> Path:
        raise NotImplementedError

    def _progress(self, prog: Any, now: float) -> None:
        raise NotImplementedError

    def _emit(self, what: str, /, **data: Any) -> None:
        raise NotImplementedError

    def _observe(self, now: float) -> tuple[Trouble | None, bool]:
        agent = self._agent
        codes = self._forgive_teardown_aborts(agent.exit_codes())
        for lr, code in codes.items():
            if code is not None and lr not in self._exit_seen:
                self._exit_seen[lr] = now
        lines = self.logtail.poll()
        self._events += [ln.event for ln in lines if ln.event is not None]
        prog = self.watch.poll(now)
        self._progress(prog, now)
        verdict = self.health.tick(now)
        if self.chaos is not None:
            pids = {self._rank_of[lr]: pid for lr, pid in agent.pids().items() if codes.get(lr) is None}
            for inj in self.chaos.tick(now, prog.max_step, pids, self._gpu_of_rank):
                self.injected.append(inj)
                self._emit("chaos", **inj.to_dict())
        if codes and all(c == 0 for c in codes.values()):
            return None, True
        if self._stuck_in_teardown(now, codes):
            return None, True
        ranks_alive = {self._rank_of[lr]: pid for lr, pid in agent.pids().items() if codes.get(lr) is None}
        failed = [
            Exited(self._rank_of[lr], lr, c, self._exit_seen[lr])
            for lr, c in codes.items()
            if c not in (None, 0)
        ]
        if failed:
            return self._exit_trouble(now, failed), False
        if verdict is not None:
            trouble = self._gpu_trouble(now, verdict)
            if trouble is not None:
                return trouble, False
        if prog.hung:
            return self._hang_trouble(now, prog.last_progress, prog.timeout), False
        if not self.watch.heartbeats_seen:
            since = self.idle.poll(now, ranks_alive, self._attempt_dir())
            if since is not None:
                return self._hang_trouble(now, since, self.idle.timeout, idle=True), False
        numerics = self._numerics_trouble(now)
        if numerics is not None:
            return numerics, False
        if prog.nan_ranks and not self._numerics_steps:  # a trainer without the Guard's numerics
            r = prog.nan_ranks[0]
            return Trouble(
                Failure(FailureKind.NUMERICS, gpu=self._gpu_of_rank(r), fatal=False),
                "heartbeat",
                now,
                now,
                f"rank {r} reported a non-finite loss",
                RootCause.SILENT_DATA_CORRUPTION,
                r,
            ), False
        base = self.watch.baseline_step_time
        slow = straggler(
            self.watch.steady_step_times(), base, prog.waits, self._rank_of_gpu(self._degraded_gpu())
        )
        if slow and not self._straggler_seen and not self._degraded_reported:
            self._straggler_seen = True
            return Trouble(
                Failure(FailureKind.STRAGGLER, gpu=self._gpu_of_rank(slow.rank), fatal=False),
                "heartbeat",
                now,
                now,
                f"steps take {slow.step_time:.2f}s vs {slow.baseline:.2f}s baseline",
                RootCause.UNKNOWN,
                slow.rank,
            ), False
        return None, False

    def _forgive_teardown_aborts(self, codes: dict[int, int | None]) -> dict[int, int | None]:
        """Exit codes with a finished rank's abort in interpreter teardown counted as 0 (see
        ``assess.aborted_after_finishing``); logged, since it is torch's bug, not the job's."""
        deaths = tuple(-sig for sig in TEARDOWN_SIGNALS)
        aborted = [lr for lr, c in codes.items() if c in deaths and lr not in self._teardown_aborts]
        if aborted:
            beats = self.watch.last_beats()
            errors = {e.rank for e in read_errors(self.run_dir) if e.attempt == self.attempt}
            for lr in aborted:
                rank = self._rank_of[lr]
                beat = beats.get(rank)
                phase = beat.phase if beat is not None and beat.attempt == self.attempt else None
                tail = _tail(self._attempt_dir() / f"rank{rank}.stderr")
                if aborted_after_finishing(codes[lr], phase, rank in errors, tail):
                    log.warning(
                        "rank %s finished, then aborted in interpreter teardown (torch/gloo); counted as done",
                        rank,
                    )
                    self._emit("teardown_abort", rank=rank)
                    self._teardown_aborts.add(lr)
        return {lr: 0 if lr in self._teardown_aborts else c for lr, c in codes.items()}

    def _stuck_in_teardown(self, now: float, codes: dict[int, int | None]) -> bool:
        """Some ranks finished (exit 0) and the others said goodbye (an "exit" heartbeat) but
        linger, e.g. blocked in destroy_process_group: after a grace, end them and succeed."""
        done = [lr for lr, c in codes.items() if c == 0]
        running = [lr for lr, c in codes.items() if c is None]
        if not done or not running or len(done) + len(running) != len(codes):
            return False
        beats = self.watch.last_beats()
        if not all((b := beats.get(self._rank_of[lr])) is not None and b.phase == "exit" for lr in running):
            return False
        if now - min(self._exit_seen[lr] for lr in done) < EXIT_GRACE_S:
            return False
        pids = self._agent.pids()
        for lr in running:
            log.warning("rank %s finished but is stuck in teardown; ending it", self._rank_of[lr])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[lr], signal.SIGKILL)
        return True

    def _numerics_trouble(self, now: float) -> Trouble | None:
        """The Guard's numerics findings: one incident per bad step; its verdict (transient =
        silent data corruption suspect, repeated = data/program) updates the incident later."""
        from trainguard.rundir import read_findings

        ranks = set(self._rank_of.values())
        for rank, step, f in read_findings(self.run_dir):
            key = (rank, step, f.rule, f.time)
            if key in self._findings_seen or rank not in ranks or not f.rule.startswith("numerics."):
                continue
            self._findings_seen.add(key)
            if f.time is not None and f.time < self._attempt_started - 1:
                continue
            incident = self._numerics_steps.get(step) if step is not None else None
            if f.rule in ("numerics.transient", "numerics.data_problem") and incident is not None:
                cause = (
                    RootCause.SILENT_DATA_CORRUPTION
                    if f.rule == "numerics.transient"
                    else RootCause.SOFTWARE_BUG
                )
                self._numerics_steps[step] = self.recorder.update(  # type: ignore[index]
                    incident, root_cause=cause, resolved=True, resolution=f.reason
                )
                continue
            if (
                f.rule.startswith("numerics.nonfinite") or f.rule == "numerics.loss_spike"
            ) and incident is None:
                return Trouble(
                    Failure(FailureKind.NUMERICS, category="numerics", fatal=False),
                    "numerics",
                    now,
                    f.time or now,
                    f"rank {rank}: {f.reason}",
                    RootCause.SILENT_DATA_CORRUPTION,
                    rank,
                    [f"{f.rule}: {f.reason}", *f.evidence[:4]],
                    {"step": step},
                )
        return None

    def _exit_trouble(self, now: float, failed: list[Exited]) -> Trouble:
        time.sleep(0.05)  # the dying ranks' last log lines and error files
        self._events += [ln.event for ln in self.logtail.poll() if ln.event is not None]
        verdict = self.health.tick(now, force=True)
        del verdict
        ranks = set(self._rank_of.values())
        errors = [
            e
            for e in read_errors(self.run_dir)
            if e.rank in ranks and e.attempt == self.attempt and e.time >= self._attempt_started - 1
        ]
        findings = self._gpu_findings()
        gpu_of = {r: self._gpu_of_rank(r) for r in ranks}
        health = {g: self.health.gpu_health(g) for g in self.gpu_map.gpus}
        trouble = exit_trouble(
            now, failed, errors, self._events, findings, gpu_of, health, default_classifier()
        )
        self._chaos_started(trouble)
        return trouble

    def _gpu_trouble(self, now: float, verdict: Any) -> Trouble | None:
        for gv in verdict.gpus:
            g = gv.gpu.index
            if g not in self.gpu_map.gpus or gv.health in (Health.OK, Health.UNKNOWN):
                continue
            key = (g, gv.health, tuple(gv.reasons))
            if key in self._gpu_seen:
                continue
            self._gpu_seen.add(key)
            trouble = gpu_trouble(now, g, gv.health, list(gv.findings), self._rank_of_gpu(g))
            self._chaos_started(trouble)
            return trouble
        return None

    def _hang_trouble(self, now: float, since: float, timeout: float, idle: bool = False) -> Trouble:
        from trainguard.supervisor.hang import collect

        procs = {self._rank_of[lr]: proc for lr, proc in self._agent.procs().items()}
        stderr = {
            self._rank_of[lr]: self._attempt_dir() / f"rank{self._rank_of[lr]}.stderr" for lr in self._rank_of
        }
        report = collect(self.run_dir, procs, stderr, self.watch.last_beats())
        suspects = report.laggards
        gpu = self._gpu_of_rank(suspects[0]) if len(suspects) == 1 else None
        named = ", ".join(f"rank {r} ({report.reasons[r]})" for r in suspects) or "no single rank stands out"
        trouble = Trouble(
            Failure(
                FailureKind.HANG, gpu=gpu, gpu_health=self.health.gpu_health(gpu) if gpu is not None else None
            ),
            "process_state" if idle else "heartbeat",
            now,
            since,
            f"{'every rank idle (no CPU, no output)' if idle else 'no progress'} for {now - since:.1f}s "
            f"(timeout {timeout:.1f}s); laggard: {named}",
            RootCause.UNKNOWN if idle else RootCause.NCCL_WATCHDOG_TIMEOUT,
            suspects[0] if len(suspects) == 1 else None,
            [f"method: {report.method}", *report.dumps],
            {"laggards": list(suspects), "method": report.method},
        )
        self._chaos_started(trouble)
        return trouble

    def _gpu_of_rank(self, rank: int | None) -> int | None:
        for lr, r in self._rank_of.items():
            if r == rank:
                return self.gpu_map.gpu_of(lr)
        return None

    def _rank_of_gpu(self, gpu: int | None) -> int | None:
        lr = self.gpu_map.local_rank_of(gpu) if gpu is not None else None
        return self._rank_of.get(lr) if lr is not None else None

    def _gpu_findings(self) -> list[Finding]:
        """Findings of FAILED GPUs in use: evidence for a crash. A merely degraded GPU (warm,
        slow) is recorded on its own and must not become the root cause of an unrelated death."""
        last = self.health.last
        if last is None:
            return []
        return [
            f
            for gv in last.gpus
            if gv.gpu.index in self.gpu_map.gpus and gv.health is Health.FAILED
            for f in gv.findings
        ]

    def _degraded_gpu(self) -> int | None:
        last = self.health.last
        for gv in last.gpus if last is not None else ():
            if gv.gpu.index in self.gpu_map.gpus and gv.health is Health.DEGRADED:
                return gv.gpu.index
        return None

    def _chaos_started(self, trouble: Trouble) -> None:
        """A drill knows when its fault really happened: use it as the incident's start, so the
        detection delay is measured, not guessed (a SIGKILL leaves no timestamp of its own)."""
        if self.chaos is None:
            return
        for inj in reversed(self.injected):
            if inj.time >= self._attempt_started - 1 and (
                trouble.rank is None or inj.rank in (None, trouble.rank)
            ):
                if inj.time < trouble.started:
                    trouble.started = inj.time
                trouble.extra.setdefault("injected", inj.index)
                return


def _tail(path: Path, nbytes: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - nbytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
