"""Look: one pass over every source of evidence, returned as a frozen `Observation`.

The `Observer` owns the readers (heartbeats: `ProgressWatch`; node health: `NodeHealth`; worker
output: `LogTail`) and, every ``--monitor-interval``, reads what is new: exit codes, log events,
progress, the node verdict, error files and numerics findings; for a script that wrote no
heartbeat yet, whether its ranks still work (`supervisor.idle`). When a worker has failed it waits
a moment for the dying ranks' last words; when the ranks hang it asks them for their stacks (that
is evidence, gathered here). It judges nothing: `supervisor.assess` does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.records import Event, Finding, Health, NodeVerdict
from trainguard.rundir import ErrorRecord, read_errors, read_findings, read_tail
from trainguard.supervisor.attempt import Attempt
from trainguard.supervisor.exits import TEARDOWN_SIGNALS, aborted_after_finishing
from trainguard.supervisor.fingerprint import read_fingerprint, read_last_error
from trainguard.supervisor.hang import HangReport, collect, proc_state
from trainguard.supervisor.health import NodeHealth
from trainguard.supervisor.idle import IdleWatch
from trainguard.supervisor.launch import Workers
from trainguard.supervisor.logs import LogTail
from trainguard.supervisor.oom import oom_kills
from trainguard.supervisor.watch import ProgressView, ProgressWatch

log = logging.getLogger(__name__)

MEMBERSHIP_EVERY_S = 1.0  # how often the rendezvous is asked whether a node waits to join
STOPPED = ("T", "t")  # stopped by a signal (SIGSTOP, SIGTSTP, a scheduler's suspend), by a tracer
LAST_WORDS_S = 0.05  # a failed worker's peers and its own error file may land just after it


FindingRow = tuple[tuple[Any, ...], int, int | None, Finding]  # (key, rank, step, finding)


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What one look saw."""

    time: float
    codes: Mapping[int, int | None]  # local rank -> exit code (None: running); teardown aborts as 0
    teardown_aborts: frozenset[int] = frozenset()  # local ranks newly seen finishing, then aborting
    events: tuple[Event, ...] = ()  # worker log lines classified since the last look
    progress: ProgressView
    phases: Mapping[int, str | None] = field(default_factory=dict)  # rank -> last heartbeat phase
    baseline_step_time: float | None = None
    verdict: NodeVerdict | None = None  # a fresh node verdict, when one was due
    gpu_health: Mapping[int, Health | None] = field(default_factory=dict)  # GPUs in use
    failed_gpu_findings: tuple[Finding, ...] = ()  # findings of FAILED GPUs in use
    degraded_gpu: int | None = None  # a DEGRADED GPU in use
    errors: tuple[ErrorRecord, ...] = ()  # error files (read only when a worker failed)
    fingerprints: Mapping[int, str] = field(default_factory=dict)  # failed rank -> `fingerprint`
    # failed rank -> the exception it died of, from torchelastic's error file or its stderr
    last_errors: Mapping[int, str] = field(default_factory=dict)
    # ranks still alive but stopped (state T or t) when a worker failed: a SIGSTOPped rank's peers
    # fail on its silence (TF's coordination service, a collective's timeout) while it never exits
    stopped: frozenset[int] = frozenset()
    findings: tuple[FindingRow, ...] = ()  # the Guard's numerics and balancing findings of this attempt
    hang: HangReport | None = None  # the ranks' stacks, when no rank progressed in time
    nodes_waiting: int = 0
    nan_steps: Mapping[int, int] = field(default_factory=dict)  # rank -> step of its non-finite loss beat
    oom_kills: int = 0  # OOM-killer kills in the workers' memory cgroup since the attempt started
    heartbeats_seen: bool = True  # a rank of this run wrote a heartbeat (else: no step is watched)
    idle_since: float | None = None  # no heartbeats: when every rank last showed work, if hung
    idle_timeout: float = 0.0
    preemption_exit_code: int | None = None  # the script's save-on-SIGTERM exit (`LaunchConfig`)
    step_times: Mapping[int, list[float]] = field(default_factory=dict)  # rank -> steady step times


class Observer:
    def __init__(
        self,
        run_dir: Path,
        watch: ProgressWatch,
        health: NodeHealth,
        logtail: LogTail,
        attempt_dir: Callable[[int], Path],
        sleep: Callable[[float], None] = time.sleep,
        idle: IdleWatch | None = None,
        preemption_exit_code: int | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.watch = watch
        self.health = health
        self.logtail = logtail
        self.attempt_dir = attempt_dir
        self._sleep = sleep
        self.idle = idle if idle is not None else IdleWatch(0.0)
        self.preemption_exit_code = preemption_exit_code
        self._next_membership = 0.0

    def begin(self, attempt: Attempt) -> None:
        """Follow a new attempt's heartbeats and log files."""
        self.watch.begin_attempt(attempt.number, attempt.ranks, attempt.started)
        self.idle.begin_attempt(attempt.started)
        folder = self.attempt_dir(attempt.number)
        self.logtail.follow(
            {(r, s): folder / f"rank{r}.{s}" for r in attempt.rank_of.values() for s in ("stdout", "stderr")}
        )

    def look(self, workers: Workers, attempt: Attempt, now: float) -> Observation:
        raw = workers.exit_codes()
        aborts = self._teardown_aborts(raw, attempt)
        forgiven = attempt.teardown_aborts | aborts
        codes = {lr: 0 if lr in forgiven else c for lr, c in raw.items()}
        events = [ln.event for ln in self.logtail.poll() if ln.event is not None]
        progress = self.watch.poll(now)
        verdict = self.health.tick(now)
        errors: list[ErrorRecord] = []
        fingerprints: dict[int, str] = {}
        last_errors: dict[int, str] = {}
        stopped: frozenset[int] = frozenset()
        failed = any(c not in (None, 0) for c in codes.values())
        ooms = 0
        if failed:
            self._sleep(LAST_WORDS_S)
            events += [ln.event for ln in self.logtail.poll() if ln.event is not None]
            self.health.tick(now, force=True)
            errors = read_errors(self.run_dir)
            fingerprints, last_errors = self._last_words(codes, attempt)
            stopped = frozenset(
                attempt.rank_of[lr]
                for lr, p in workers.procs().items()
                if codes.get(lr) is None and proc_state(p.pid) in STOPPED
            )
            count = oom_kills()
            if count is not None and attempt.oom_kills_at_start is not None:
                ooms = count - attempt.oom_kills_at_start
        idle_since = None
        if not self.watch.heartbeats_seen and not failed:
            alive = {attempt.rank_of[lr]: p.pid for lr, p in workers.procs().items() if codes.get(lr) is None}
            idle_since = self.idle.poll(now, alive, self.attempt_dir(attempt.number))
        hang = None
        if (progress.hung or idle_since is not None) and not failed:
            hang = self._collect_stacks(workers, attempt)
        waiting = 0
        if now >= self._next_membership:
            self._next_membership = now + MEMBERSHIP_EVERY_S
            waiting = workers.nodes_waiting()
        beats = self.watch.last_beats()
        gpus = attempt.gpu_map.gpus
        last = self.health.last
        in_use = [gv for gv in (last.gpus if last is not None else ()) if gv.gpu.index in gpus]
        return Observation(
            time=now,
            codes=codes,
            teardown_aborts=frozenset(aborts),
            events=tuple(events),
            progress=progress,
            phases={r: b.phase if b is not None else None for r, b in beats.items()},
            baseline_step_time=self.watch.baseline_step_time,
            verdict=verdict,
            gpu_health={g: self.health.gpu_health(g) for g in gpus},
            # A merely degraded GPU (warm, slow) is recorded on its own and must not become the
            # root cause of an unrelated death.
            failed_gpu_findings=tuple(f for gv in in_use if gv.health is Health.FAILED for f in gv.findings),
            degraded_gpu=next((gv.gpu.index for gv in in_use if gv.health is Health.DEGRADED), None),
            errors=tuple(errors),
            fingerprints=fingerprints,
            last_errors=last_errors,
            stopped=stopped,
            findings=self._findings(attempt),
            hang=hang,
            nodes_waiting=waiting,
            nan_steps={r: b.step for r in progress.nan_ranks if (b := beats.get(r)) is not None},
            oom_kills=ooms,
            heartbeats_seen=self.watch.heartbeats_seen,
            idle_since=idle_since,
            idle_timeout=self.idle.timeout,
            preemption_exit_code=self.preemption_exit_code,
            step_times=self.watch.steady_step_times(),
        )

    def _teardown_aborts(self, codes: dict[int, int | None], attempt: Attempt) -> set[int]:
        """Local ranks that finished cleanly and then aborted in interpreter teardown (see
        ``assess.aborted_after_finishing``): torch's bug, not the job's."""
        deaths = tuple(-sig for sig in TEARDOWN_SIGNALS)
        new = [lr for lr, c in codes.items() if c in deaths and lr not in attempt.teardown_aborts]
        if not new:
            return set()
        beats = self.watch.last_beats()
        errors = {e.rank for e in read_errors(self.run_dir) if e.attempt == attempt.number}
        found = set()
        for lr in new:
            rank = attempt.rank_of[lr]
            beat = beats.get(rank)
            phase = beat.phase if beat is not None and beat.attempt == attempt.number else None
            tail = read_tail(self.attempt_dir(attempt.number) / f"rank{rank}.stderr", 4096)
            if aborted_after_finishing(codes[lr], phase, rank in errors, tail):
                found.add(lr)
        return found

    def _last_words(
        self, codes: Mapping[int, int | None], attempt: Attempt
    ) -> tuple[dict[int, str], dict[int, str]]:
        """The failed ranks' fingerprints and the exceptions they died of, from torchelastic's
        error file (what any script under torch's ``@record`` leaves) or their stderr."""
        folder = self.attempt_dir(attempt.number)
        found, last = {}, {}
        for lr, code in codes.items():
            if code in (None, 0):
                continue
            rank = attempt.rank_of[lr]
            elastic, stderr = folder / f"rank{rank}.error.json", folder / f"rank{rank}.stderr"
            if (fp := read_fingerprint(code, elastic, stderr)) is not None:
                found[rank] = fp
            if (exc := read_last_error(elastic, stderr)) is not None:
                last[rank] = exc
        return found, last

    def _collect_stacks(self, workers: Workers, attempt: Attempt) -> HangReport:
        folder = self.attempt_dir(attempt.number)
        procs = {attempt.rank_of[lr]: proc for lr, proc in workers.procs().items()}
        stderr = {r: folder / f"rank{r}.stderr" for r in attempt.rank_of.values()}
        return collect(self.run_dir, procs, stderr, self.watch.last_beats())

    def _findings(self, attempt: Attempt) -> tuple[FindingRow, ...]:
        ranks = set(attempt.rank_of.values())
        rows = []
        for rank, step, f in read_findings(self.run_dir):
            if rank not in ranks or not f.rule.startswith(("numerics.", "balance.")):
                continue
            if f.time is not None and f.time < attempt.started - 1:
                continue
            rows.append(((rank, step, f.rule, f.time), rank, step, f))
        return tuple(rows)
