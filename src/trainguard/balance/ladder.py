"""The ladder of answers to a slow rank: rebalance the shares, restore them, exclude the GPU.

Pure and stdlib-only: `judge` takes the ladder's state and one agreed `Measure` (every rank's
own compute seconds and samples over a window of steps) and returns the next state and at most
one `Move`. Every rank runs it on the same agreed numbers, so every rank takes the same move at
the same step (``trainguard.torch.balance`` applies it). The rules, with ``s_i`` each rank's
measured speed (samples per second of its own compute, waiting excluded) and ``b_i`` its share:

- **rebalance** when the ranks would idle more than ``threshold`` of the slowest rank's step
  under the current shares (``1 - mean(b_i/s_i) / max(b_i/s_i)``), moving to shares in
  proportion to speed would idle materially less, and that held for ``persist`` windows in a row
  (one noisy window is not a trend). The new shares follow the median speeds of those windows.
- **restore** uniform shares once uniform shares would idle less than ``restore`` (the band
  between ``restore`` and ``threshold`` is the hysteresis), for ``persist`` windows.
- **exclude** the slowest rank's GPU (a restart without it, done by the supervisor) when keeping
  it costs more than dropping it, for ``persist`` windows, or when it keeps degrading. With the
  best split's step time ``T_keep = max_i b_i/s_i + O`` and that of the others alone ``T_drop``
  (``O``: the step's measured time beyond the slowest compute: all-reduce tail, optimizer, data),
  throughput ``X = B / T``; the slowness has lasted ``H`` seconds and is expected to last as long
  again (a fail-slow that lasted H tends to last about H more); a restart costs ``R`` seconds::

      exclude  iff  (H - R) * X_drop  >  H * X_keep

  With shares free to move, ``X_keep > X_drop`` unless a share hits its floor (one sample) or its
  cap (``max_share``, memory), so a merely slow GPU is kept. "Keeps degrading": its speed fell at
  ``degrading`` rebalances in a row.

    >>> cfg = LadderConfig(persist=2)
    >>> state = LadderState.start((32, 32, 32, 32))
    >>> m = Measure(step=9, compute_s=(1.0, 1.0, 1.0, 2.0), samples=(320,) * 4, wall_s=2.2, steps=10)
    >>> state, move = judge(state, m, cfg)
    >>> move is None, state.streak                   # once is not a trend
    (True, 1)
    >>> state, move = judge(state, m, cfg)
    >>> move.verb, move.rank, move.shares
    ('rebalance', 3, (37, 37, 36, 18))
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from trainguard.balance.shares import idle_fraction, split, step_times, uniform
from trainguard.errors import ConfigError

__all__ = ["LadderConfig", "LadderState", "Measure", "Move", "Rung", "judge"]


class Rung(str, Enum):
    """Where the job stands on the ladder. The state machine::

    UNIFORM ──a rank slower for `persist` windows──> REBALANCED
    REBALANCED ──speeds moved again──> REBALANCED (new shares)
    REBALANCED ──uniform shares would idle < `restore`──> UNIFORM (shares restored)
    REBALANCED ──keeping costs more than dropping, or it keeps degrading──> EXCLUDING
    EXCLUDING: the supervisor restarts without the GPU; until then shares still follow speeds
    """

    UNIFORM = "uniform"
    REBALANCED = "rebalanced"
    EXCLUDING = "excluding"


@dataclass(frozen=True, slots=True)
class LadderConfig:
    threshold: float = 0.10  # idle share of the slowest rank's step above which shares move
    restore: float = 0.05  # uniform shares idling less than this: restore them
    persist: int = 3  # windows in a row a condition must hold before a move
    restart_s: float = 120.0  # what a restart without the GPU costs the job (R), in seconds
    degrading: int = 3  # the slowest rank slower at this many rebalances in a row: exclude
    max_share: float | None = None  # a share holds at most this many times the uniform one
    min_world: int = 2  # never exclude below this many ranks

    def __post_init__(self) -> None:
        if not 0 < self.restore < self.threshold < 1:
            raise ConfigError(
                f"need 0 < restore < threshold < 1 (restore={self.restore}, threshold={self.threshold})"
            )
        if self.persist < 1 or self.degrading < 1:
            raise ConfigError("persist and degrading count windows: use 1 or more")


@dataclass(frozen=True, slots=True)
class Measure:
    """One window as every rank agreed it: per rank, its own compute seconds and samples."""

    step: int  # the window's last step
    compute_s: tuple[float, ...]
    samples: tuple[int, ...]
    wall_s: float  # how long the window took (the job's time, waits included)
    steps: int

    @property
    def speeds(self) -> tuple[float, ...] | None:
        """Samples per second of each rank's own compute; None when a rank reported none."""
        if any(c <= 0 or n <= 0 for c, n in zip(self.compute_s, self.samples, strict=True)):
            return None
        return tuple(n / c for c, n in zip(self.compute_s, self.samples, strict=True))

    @property
    def overhead_s(self) -> float:
        """Seconds per step beyond the slowest rank's compute (all-reduce tail, optimizer, data)."""
        return max(0.0, (self.wall_s - max(self.compute_s)) / max(self.steps, 1))


@dataclass(frozen=True, slots=True)
class LadderState:
    rung: Rung
    shares: tuple[int, ...]
    want: str | None = None  # the move the last windows asked for
    streak: int = 0  # windows in a row that asked for it
    seen: tuple[tuple[float, ...], ...] = ()  # their speeds
    slow_rank: int | None = None  # the rank slower than its peers, while it is
    slow_s: float = 0.0  # for how long (seconds of job time)
    # The slow rank's speed in the first window after the last move, at its new share (a share's
    # speed, since per-step costs that do not shrink with the share make a smaller one slower
    # per sample); None until that window. Only a fall at the same share is the GPU degrading.
    base_speed: float | None = None
    fresh: bool = False  # a move was just made: the next window measures the new shares
    falls: int = 0  # rebalances in a row that found the slow rank slower than at its share's start

    @classmethod
    def start(cls, shares: tuple[int, ...]) -> LadderState:
        """The ladder of a job running with ``shares`` (a resumed job may start rebalanced)."""
        even = shares == uniform(sum(shares), len(shares))
        return cls(Rung.UNIFORM if even else Rung.REBALANCED, shares)


@dataclass(frozen=True, slots=True)
class Move:
    """One decision and its evidence (the incident and the report show it)."""

    verb: str  # rebalance | restore | exclude
    step: int  # the window it was decided on (shares change from a later common step)
    rank: int | None  # the rank it is about (the slowest), None for a restore
    shares: tuple[int, ...]  # the shares from now on (unchanged for an exclude)
    old_shares: tuple[int, ...]
    speeds: tuple[float, ...]  # samples/s of own compute, per rank
    reason: str
    figures: dict[str, float]

    def describe(self, gpus: list[int | None] | None = None) -> str:
        """One line: the move, the rank and its GPU, why, and the shares."""
        where = "all ranks"
        if self.rank is not None:
            gpu = gpus[self.rank] if gpus is not None and self.rank < len(gpus) else None
            where = f"rank {self.rank}" + (f" (GPU {gpu})" if gpu is not None else "")
            where += f" at {self.figures['relative_speed']:.0%} of its peers' median speed"
        old, new = "/".join(map(str, self.old_shares)), "/".join(map(str, self.shares))
        shares = f"shares {old} -> {new}" if new != old else f"shares {new}"
        return f"{self.verb}: {where}: {self.reason}; {shares}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verb": self.verb,
            "step": self.step,
            "rank": self.rank,
            "shares": list(self.shares),
            "old_shares": list(self.old_shares),
            "speeds": [round(s, 3) for s in self.speeds],
            "reason": self.reason,
            **{k: round(v, 4) for k, v in self.figures.items()},
        }


def judge(state: LadderState, m: Measure, cfg: LadderConfig) -> tuple[LadderState, Move | None]:
    """The ladder's next state and move (None: keep going as is) after one agreed window."""
    speeds = m.speeds
    if speeds is None or len(speeds) != len(state.shares):
        return state, None  # a window with no measurement (a rank did no work) says nothing
    total, world = sum(state.shares), len(state.shares)
    cap = None if cfg.max_share is None else max(1, math.ceil(cfg.max_share * total / world))
    state = _track_slow(state, speeds, m.wall_s, cfg)
    if state.fresh:  # the first window at the shares the last move set
        k = state.slow_rank
        state = replace(state, fresh=False, base_speed=speeds[k] if k is not None else None)
    even = uniform(total, world)
    want: str | None = None
    if state.rung is not Rung.UNIFORM and idle_fraction(step_times(even, speeds)) < cfg.restore:
        want = "restore"
    elif _unbalanced(state.shares, speeds, total, cap, cfg):
        want = "rebalance"
    elif state.rung is Rung.REBALANCED and world > cfg.min_world and _costs_more(state, speeds, m, cap, cfg):
        want = "exclude"
    if want is None:
        return replace(state, want=None, streak=0, seen=()), None
    streak = state.streak + 1 if want == state.want else 1
    seen = (*state.seen, speeds)[-cfg.persist :] if want == state.want else (speeds,)
    state = replace(state, want=want, streak=streak, seen=seen)
    if streak < cfg.persist:
        return state, None
    typical = tuple(statistics.median(s[i] for s in seen) for i in range(world))
    state = replace(state, want=None, streak=0, seen=())
    if want == "restore":
        move = _move("restore", m, None, even, state.shares, typical, "speeds even again: uniform shares")
        return replace(state, rung=Rung.UNIFORM, shares=even, base_speed=None, falls=0), move
    if want == "exclude":
        return _exclude(state, m, typical, cap, cfg, "keeping it costs more than dropping it")
    return _rebalance(state, m, typical, total, cap, cfg)


def _track_slow(
    state: LadderState, speeds: tuple[float, ...], wall_s: float, cfg: LadderConfig
) -> LadderState:
    """Which rank is slower than its peers (by more than the threshold), and for how long."""
    rel = _relative(speeds)
    k = min(range(len(speeds)), key=lambda i: (rel[i], i))
    if rel[k] >= 1 - cfg.threshold:
        return replace(state, slow_rank=None, slow_s=0.0)
    if k != state.slow_rank:
        return replace(state, slow_rank=k, slow_s=wall_s, base_speed=None, falls=0)
    return replace(state, slow_s=state.slow_s + wall_s)


def _unbalanced(
    shares: tuple[int, ...], speeds: tuple[float, ...], total: int, cap: int | None, cfg: LadderConfig
) -> bool:
    target = split(total, speeds, cap=cap)
    now = idle_fraction(step_times(shares, speeds))
    then = idle_fraction(step_times(target, speeds))
    return target != shares and now > cfg.threshold and now - then > cfg.threshold / 2


def _rebalance(
    state: LadderState, m: Measure, speeds: tuple[float, ...], total: int, cap: int | None, cfg: LadderConfig
) -> tuple[LadderState, Move | None]:
    target = split(total, speeds, cap=cap)
    k = state.slow_rank
    falls = state.falls
    if k is not None and state.base_speed is not None:
        falls = falls + 1 if speeds[k] < state.base_speed * (1 - cfg.restore) else 0
    state = replace(state, falls=falls, base_speed=None, fresh=True)
    degrading = falls >= cfg.degrading and state.rung is not Rung.EXCLUDING
    if k is not None and degrading and len(speeds) > cfg.min_world:
        why = f"its speed fell at {falls} rebalances in a row: it keeps degrading"
        return _exclude(state, m, speeds, cap, cfg, why)
    before = idle_fraction(step_times(state.shares, speeds))
    after = idle_fraction(step_times(target, speeds))
    why = f"idle {before:.0%} of the slowest rank's step under the current shares, {after:.0%} after"
    slowest = min(range(len(speeds)), key=lambda i: (speeds[i], i))
    move = _move(
        "rebalance", m, slowest, target, state.shares, speeds, why, idle_before=before, idle_after=after
    )
    rung = Rung.EXCLUDING if state.rung is Rung.EXCLUDING else Rung.REBALANCED
    return replace(state, rung=rung, shares=target), move


def _throughputs(
    speeds: tuple[float, ...], k: int, total: int, overhead: float, cap: int | None
) -> tuple[float, float | None]:
    """(X_keep, X_drop): samples/s with the best split of all ranks, and of all but rank ``k``
    (None where the others cannot hold the global batch under the cap)."""
    keep = max(step_times(split(total, speeds, cap=cap), speeds)) + overhead
    rest = speeds[:k] + speeds[k + 1 :]
    if cap is not None and total > cap * len(rest):
        return total / keep, None
    drop = max(step_times(split(total, rest, cap=cap), rest)) + overhead
    return total / keep, total / drop


def _costs_more(
    state: LadderState, speeds: tuple[float, ...], m: Measure, cap: int | None, cfg: LadderConfig
) -> bool:
    k = state.slow_rank
    if k is None:
        return False
    keep, drop = _throughputs(speeds, k, sum(state.shares), m.overhead_s, cap)
    return drop is not None and (state.slow_s - cfg.restart_s) * drop > state.slow_s * keep


def _exclude(
    state: LadderState, m: Measure, speeds: tuple[float, ...], cap: int | None, cfg: LadderConfig, why: str
) -> tuple[LadderState, Move | None]:
    k = state.slow_rank
    if k is None:
        return state, None
    keep, drop = _throughputs(speeds, k, sum(state.shares), m.overhead_s, cap)
    figures = {"x_keep": keep, "x_drop": drop or 0.0, "slow_for_s": state.slow_s, "restart_s": cfg.restart_s}
    move = _move("exclude", m, k, state.shares, state.shares, speeds, why, **figures)
    return replace(state, rung=Rung.EXCLUDING), move


def _relative(speeds: tuple[float, ...]) -> tuple[float, ...]:
    mid = statistics.median(speeds)
    return tuple(s / mid for s in speeds)


def _move(
    verb: str,
    m: Measure,
    rank: int | None,
    shares: tuple[int, ...],
    old: tuple[int, ...],
    speeds: tuple[float, ...],
    why: str,
    **figures: float,
) -> Move:
    rel = _relative(speeds)
    figures = {"relative_speed": rel[rank] if rank is not None else 1.0, **figures}
    return Move(verb, m.step, rank, shares, old, speeds, why, figures)
