"""Progress watch: reads the ranks' heartbeat files incrementally and says, per attempt, how far
training got, when it last progressed, whether it hangs, and what the numbers look like.

A hang is "no rank advanced its step within the timeout", where the timeout is learned from this
run's own step times: ``max(floor, factor x slowest recent step)``. That is seconds for a job with
sub-second steps, where NCCL's default watchdog waits ten minutes. Before the first step of an
attempt (start, rendezvous, checkpoint load) the longer ``startup_timeout`` applies, once this
run has shown heartbeats at all: a script without the Guard never writes one, and its hangs are
judged from process state (`supervisor.idle`).

A save is collective: every rank beats ``checkpoint`` before it and ``train`` after the next
step. While every local rank is in one, the job gets the save's allowance: per rank, ``factor x``
the slowest of its own recent saves, at least the floor, counted from when it began (an attempt's
first saves wait for a writer still starting up: `SETTLING_SAVES`). A rank not in the save is not
waiting for one: one rank's save never stretches the detection of another rank's hang.

A step that a replica group tried and discarded (``rundir.append_discarded``: its all-reduce
timed out on a hung peer, its quorum failed) is progress too: the group is alive and steps on
without the peer. Each step counts once, so a group that discards the same step over and over
is hung one timeout after its first try at it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.rundir import Heartbeat, discarded_path, heartbeat_path, parse_discarded

if TYPE_CHECKING:
    from trainguard.supervisor.config import SupervisorConfig


@dataclass(slots=True)
class RankProgress:
    last: Heartbeat | None = None
    step_since: float | None = None  # when this rank first reported its current step
    first_train_time: float | None = None  # first train heartbeat of this attempt
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=20))  # steady steps only
    first_step: int | None = None  # first step this rank reported in this attempt
    ckpt_step: int | None = None  # step of this rank's last checkpoint in this attempt
    ckpt_since: float | None = None  # when this rank reported a checkpoint in progress
    saves: int = 0  # saves this rank finished in this attempt (each one measured)
    nan_reported: bool = False
    discarded: tuple[int, float] | None = None  # (step, when) of the last step it discarded


@dataclass(frozen=True, slots=True)
class ProgressView:
    max_step: int | None  # the furthest step any local rank completed in this attempt
    min_step: int | None
    last_progress: float  # when a rank last advanced (attempt start if none did)
    first_step_time: float | None  # first completed step of this attempt (recovery done)
    timeout: float  # the hang timeout that applies right now
    hung: bool
    nan_ranks: tuple[int, ...]  # ranks that newly reported a non-finite loss
    step_time: float | None  # median recent step time
    loss: float | None  # rank-lowest local rank's last loss
    waits: dict[int, float] = field(default_factory=dict)  # per rank: wait in the step agreement


class ProgressWatch:
    """Follows ``heartbeat/rank<R>.jsonl`` of the local ranks for one attempt at a time."""

    def __init__(
        self,
        run_dir: Path,
        hang_timeout_floor: float = 30.0,
        hang_step_factor: float = 5.0,
        startup_timeout: float = 300.0,
    ) -> None:
        self.run_dir = run_dir
        self.floor = hang_timeout_floor
        self.factor = hang_step_factor
        self.startup_timeout = startup_timeout
        self._offsets: dict[Path, int] = {}
        self._ranks: dict[int, RankProgress] = {}
        self._attempt = 0
        self._started = 0.0
        self._recent: deque[float] = deque(maxlen=50)  # step times across attempts (learning)
        self._steady: list[float] = []  # the run's first steady step times (the baseline)
        self._save_times: dict[int, deque[float]] = {}  # per rank: its recent saves (learning)
        self.checkpoint_timeout = 60.0  # allowance for an attempt's first saves (SETTLING_SAVES)
        self.checkpoint_stalls: list[tuple[float, float]] = []  # (start, end) of visible saves
        self.baseline_step_time: float | None = None  # median of the run's first steps
        self.history: list[Heartbeat] = []  # every train heartbeat seen (for the goodput ledger)
        self.furthest_step: int | None = None  # furthest step any rank reported (train/exit beats)
        self.heartbeats_seen = False  # a rank of this run wrote one: its steps can be watched

    def begin_attempt(self, attempt: int, ranks: list[int], started: float) -> None:
        self._attempt, self._started = attempt, started
        self._ranks = {r: RankProgress() for r in ranks}

    def poll(self, now: float) -> ProgressView:
        nan_ranks: list[int] = []
        for rank, prog in self._ranks.items():
            for step, end in self._read_discards(rank):
                if end >= self._started and (prog.discarded is None or step != prog.discarded[0]):
                    prog.discarded = (step, end)
            for beat in self._read_beats(rank):
                self.heartbeats_seen = True
                if beat.attempt != self._attempt:
                    continue
                if beat.phase in ("train", "exit"):
                    self.furthest_step = max(beat.step, self.furthest_step or 0)
                if beat.phase == "checkpoint" and prog.ckpt_since is None:
                    prog.ckpt_since = beat.time
                    prog.ckpt_step = beat.step
                if beat.phase == "train":
                    self.history.append(beat)
                    if prog.ckpt_since is not None:
                        took = max(0.0, beat.time - prog.ckpt_since)
                        self._save_times.setdefault(rank, deque(maxlen=10)).append(took)
                        prog.saves += 1
                        end = max(prog.ckpt_since, beat.time - (beat.step_time or 0.0))
                        self.checkpoint_stalls.append((prog.ckpt_since, end))
                        prog.ckpt_since = None
                    first = prog.first_train_time is None
                    if first:
                        prog.first_train_time, prog.first_step = beat.time, beat.step
                    # The first step of an attempt carries warm-up (DDP buckets, caches): not
                    # a step time to learn the hang timeout from.
                    if not first and beat.step_time is not None and beat.step_time > 0:
                        self._recent.append(beat.step_time)
                        if steady(beat.step, prog.first_step, prog.ckpt_step):
                            prog.step_times.append(beat.step_time)
                            self._steady.append(beat.step_time)
                            self._learn_baseline()
                    if not prog.nan_reported and _non_finite(beat.loss):
                        prog.nan_reported = True
                        nan_ranks.append(rank)
                if prog.last is None or beat.step != prog.last.step:
                    prog.step_since = beat.time
                prog.last = beat
        return self._view(now, tuple(nan_ranks))

    def last_beats(self) -> dict[int, Heartbeat | None]:
        return {r: p.last for r, p in self._ranks.items()}

    def _view(self, now: float, nan_ranks: tuple[int, ...]) -> ProgressView:
        steps = [p.last.step for p in self._ranks.values() if p.last is not None and p.last.phase == "train"]
        since = [p.step_since for p in self._ranks.values() if p.step_since is not None]
        since += [p.discarded[1] for p in self._ranks.values() if p.discarded is not None]
        firsts = [p.first_train_time for p in self._ranks.values() if p.first_train_time is not None]
        trained = bool(firsts)
        last_progress = max(since, default=self._started) if trained else self._started
        timeout = self.timeout() if trained else max(self.startup_timeout, self.floor)
        phases = {p.last.phase for p in self._ranks.values() if p.last is not None}
        saving = {
            r: p.ckpt_since
            for r, p in self._ranks.items()
            if p.last is not None and p.last.phase == "checkpoint" and p.ckpt_since is not None
        }
        if "exit" in phases:  # the final save and teardown
            timeout = max(timeout, self.startup_timeout)
        elif saving and len(saving) == len(self._ranks):  # every rank in the save (module docstring)
            deadline = max(since + self.save_allowance(r) for r, since in saving.items())
            timeout = max(timeout, deadline - last_progress)
        recent = [t for p in self._ranks.values() for t in p.step_times]
        low = min(self._ranks) if self._ranks else None
        low_beat = self._ranks[low].last if low is not None else None
        return ProgressView(
            max_step=max(steps) if steps else None,
            min_step=min(steps) if steps else None,
            last_progress=last_progress,
            first_step_time=min(firsts) if firsts else None,
            timeout=timeout,
            # No heartbeat yet in this run: the script may never write one (no Guard), so the
            # lack of one is no evidence of a hang (`supervisor.idle` watches those jobs).
            hung=self.heartbeats_seen and now - last_progress > timeout,
            nan_ranks=nan_ranks,
            step_time=statistics.median(recent) if len(recent) >= 8 else None,  # not warm-up noise
            loss=low_beat.loss if low_beat is not None else None,
            waits={
                r: p.last.wait
                for r, p in self._ranks.items()
                if p.last is not None and p.last.wait is not None
            },
        )

    def timeout(self) -> float:
        slowest = max(self._recent, default=0.0)
        return max(self.floor, self.factor * slowest)

    def save_allowance(self, rank: int) -> float:
        """How long rank's save in progress may take: ``factor x`` the slowest of its recent saves,
        at least the floor; at least ``checkpoint_timeout`` until it finished `SETTLING_SAVES` in
        this attempt."""
        allowance = max(self.floor, self.factor * max(self._save_times.get(rank, ()), default=0.0))
        prog = self._ranks.get(rank)
        if prog is None or prog.saves < SETTLING_SAVES:
            allowance = max(allowance, self.checkpoint_timeout)
        return allowance

    def _learn_baseline(self) -> None:
        if self.baseline_step_time is None and len(self._steady) >= 5:
            self.baseline_step_time = statistics.median(self._steady)

    def steady_step_times(self) -> dict[int, list[float]]:
        """Per rank, this attempt's step times outside warm-up and checkpoints, oldest first."""
        return {r: list(p.step_times) for r, p in self._ranks.items()}

    def _read_beats(self, rank: int) -> list[Heartbeat]:
        beats = (_parse_beat(line) for line in self._read_lines(heartbeat_path(self.run_dir, rank)))
        return [b for b in beats if b is not None]

    def _read_discards(self, rank: int) -> list[tuple[int, float]]:
        """(step, end) of the steps rank R newly wrote it discarded; bad lines are skipped."""
        found = map(parse_discarded, self._read_lines(discarded_path(self.run_dir, rank)))
        return [(d[0], d[2]) for d in found if d is not None]

    def _read_lines(self, path: Path) -> list[bytes]:
        """The whole lines appended to ``path`` since the last read (a half-written last line
        waits for the next)."""
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offsets[path] = self._offsets.get(path, 0) + end
        return data[:end].split(b"\n")


# An asynchronous checkpointer's first save of an attempt is handed to a writer process still
# importing torch and returns at once; the second waits for that writer. A rank's own save times
# say how long its saves take from then on.
SETTLING_SAVES = 2
WARMUP_STEPS = 5  # after a (re)start: caches, allocator, DDP buckets; not a step to judge
CKPT_STEPS = 2  # steps after a checkpoint carry its copy or write (async saves overlap them)
STRAGGLER_FACTOR = 3.0  # slower than this many times the baseline ...
STRAGGLER_MIN_EXTRA_S = 0.1  # ... and by at least this much (a GC pause is not a straggler)
SUSTAINED_STEPS = 3  # ... over every one of a rank's last this many steady steps


def steady(step: int, first_step: int | None, ckpt_step: int | None) -> bool:
    """Is this step's time the job's normal pace (not warm-up, not a checkpoint's)?"""
    if first_step is not None and step < first_step + WARMUP_STEPS:
        return False
    return ckpt_step is None or not ckpt_step <= step <= ckpt_step + CKPT_STEPS


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int | None  # the rank the others wait for (None: only the node's telemetry points)
    step_time: float  # the sustained step time
    baseline: float


def straggler(
    step_times: dict[int, list[float]],
    baseline: float | None,
    waits: dict[int, float],
    degraded_rank: int | None = None,
) -> Straggler | None:
    """A sustained slowdown of a minimum size that one rank causes (pure).

    Ranks of a synchronous job share their step time; the one that makes the others wait waits
    least in the step agreement (``waits``). A slowdown every rank shares alike (a loaded host, a
    slow filesystem) is no straggler unless node telemetry names a degraded GPU (``degraded_rank``).

        >>> straggler({0: [0.6] * 3, 1: [0.6] * 3}, 0.1, {0: 0.5, 1: 0.0}).rank
        1
        >>> straggler({0: [0.6] * 3, 1: [0.6] * 3}, 0.1, {0: 0.0, 1: 0.0}) is None
        True
    """
    if baseline is None:
        return None
    floor = max(STRAGGLER_FACTOR * baseline, baseline + STRAGGLER_MIN_EXTRA_S)
    windows = [ts[-SUSTAINED_STEPS:] for ts in step_times.values() if len(ts) >= SUSTAINED_STEPS]
    slow = [w for w in windows if min(w) > floor]
    if not slow:
        return None
    step_time = statistics.median([t for w in slow for t in w])
    if degraded_rank is not None:
        return Straggler(degraded_rank, step_time, baseline)
    if len(waits) < 2:
        return None
    rank = min(waits, key=lambda r: waits[r])
    gap = min(w for r, w in waits.items() if r != rank) - waits[rank]
    if gap < 0.5 * (step_time - baseline):  # the others do not wait for it: nobody stands out
        return None
    return Straggler(rank, step_time, baseline)


def watchers(config: SupervisorConfig, heartbeats: bool, backend_open: bool = True) -> str:
    """What the supervisor watches in this job, said once at start and when heartbeats appear."""
    seen, w = "exit codes, error files, worker logs", config.watch
    if config.health.backend != "none":
        seen += f", node health ({config.health.backend})"
    if heartbeats:
        hangs = (
            f"hangs from heartbeats (no step for max({w.hang_timeout_floor:g}s, "
            f"{w.hang_step_factor:g} x slowest step); first step within {w.startup_timeout:g}s)"
        )
    elif w.idle_timeout > 0:
        hangs = (
            "no heartbeats yet (the Guard writes them): hangs from process state only (every rank "
            f"without CPU time or output for {w.idle_timeout:g}s)"
        )
    else:
        hangs = "no heartbeats yet (the Guard writes them), and --idle-timeout 0: no hang detection"

    from trainguard.supervisor.diagnostics import preflight_off

    off = preflight_off(config, backend_open)
    checks = (
        f"no pre-flight diagnostics ({off})"
        if off
        else "pre-flight diagnostics (level 1 + SDC) before each start"
    )
    return f"watching {seen}; {hangs}; {checks}"


def _parse_beat(line: bytes) -> Heartbeat | None:
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        raw = json.loads(line)
        return Heartbeat(**{k: raw[k] for k in raw if k in Heartbeat.__slots__})
    except (ValueError, TypeError):
        return None


def _non_finite(value: float | None) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
