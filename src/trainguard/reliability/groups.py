"""The replica-group mode of `trainguard simulate` (`trainguard run --replica-groups`), with the
uncertainty of its inputs carried into the interval it prints.

A failure of a replica-local kind (a GPU, its memory, a host) takes its group out for ``heal_s``
(restart and heal from a live peer) while the others train on, so the job loses ``1 / groups`` of
its capacity for that time; but the healthy groups stall too, for ``stall_s`` (the quorum drops the
failed group and the communicators are re-created: ~1 s on the loopback here, minutes at 100K
GPUs). A failure of a job-wide kind (incidents.taxonomy.JOB_WIDE_CAUSES: a software bug, SDC, the
fabric) stops every group: the job restarts in ``restart_s`` and redoes the work since its last
checkpoint, as in the restart mode. A failure during a stall or a restart starts it again (the
blocked time is the union of the failures' blocks). Every step costs ``1 + overhead / step_s``
plain DDP steps (torchft's quorum and commit RPCs).

Three inputs are uncertain, and each trial draws its own value of each, so the spread of the
trials' ETTR holds both the inputs' uncertainty and one run's luck with its failures:

- the job-wide share of failures, from the counts behind the failure mix (Table 5's 419 for
  Llama 3): Beta(k + 1/2, n - k + 1/2), Jeffreys' prior;
- the per-step overhead, an `Estimate` (mean +/- a 95% half-width: normal, clipped at 0);
- the stall, an `Estimate` (a range ``lo..hi``: log-uniform, for what is known only to within an
  order of magnitude).

    >>> from trainguard.reliability.simulate import SimConfig
    >>> cfg = SimConfig(gpus=16_384, days=7, trials=50, seed=0)
    >>> m = GroupModel(groups=128, heal_s=600, stall_s=Estimate.parse("1..600"))
    >>> ettr = simulate_groups(cfg, m)
    >>> 0.8 < float(ettr.mean()) < 1.0
    True
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError
from trainguard.reliability import need
from trainguard.reliability.models import DAY_S, LLAMA3_INTERRUPTIONS
from trainguard.reliability.simulate import SimConfig, _committed, _failures

_PLUS_MINUS = re.compile(r"^\s*([-+0-9.eE]+)\s*(?:\+-|\+/-|±)\s*([0-9.eE+]+)\s*$")
_RANGE = re.compile(r"^\s*([0-9.eE+]+)\s*\.\.\s*([0-9.eE+]+)\s*$")


@dataclass(frozen=True, slots=True)
class Estimate:
    """A model input and how well it is known: ``value`` +/- ``half95`` (normal, clipped at 0), or,
    with ``hi`` set, anywhere from ``value`` to ``hi`` (log-uniform)."""

    value: float
    half95: float = 0.0  # half-width of a 95% interval; 0: known exactly
    hi: float | None = None  # upper end of a log-uniform range

    @classmethod
    def parse(cls, text: str) -> Estimate:
        """``"18.8"``, ``"18.8+-48.3"`` (also ``+/-``) or ``"1..600"``."""
        try:
            if m := _RANGE.match(text):
                lo, hi = float(m[1]), float(m[2])
                if not 0 < lo <= hi:
                    raise ValueError("a range needs 0 < lo <= hi")
                return cls(lo, hi=hi)
            m = _PLUS_MINUS.match(text)
            est = cls(float(m[1]), float(m[2])) if m else cls(float(text))
        except ValueError as exc:
            raise ConfigError(
                f"{text!r}: give a number, a number +- its 95% half-width (18.8+-48.3) or a range lo..hi "
                f"(1..600) ({exc})"
            ) from None
        if not (math.isfinite(est.value) and est.half95 >= 0):
            raise ConfigError(f"{text!r}: the value must be finite and the half-width not negative")
        return est

    def draw(self, rng: Any, n: int) -> Any:
        np = need("numpy")
        if self.hi is not None:
            return np.exp(rng.uniform(math.log(self.value), math.log(self.hi), n))
        if self.half95 == 0:
            return np.full(n, max(0.0, self.value))
        return np.maximum(0.0, rng.normal(self.value, self.half95 / 1.96, n))

    def __str__(self) -> str:
        if self.hi is not None:
            return f"{self.value:g}..{self.hi:g}"
        return f"{self.value:g}" + (f" +/- {self.half95:g}" if self.half95 else "")


@dataclass(frozen=True, slots=True)
class GroupModel:
    groups: int
    heal_s: float  # the failed group's restart and heal, from the failure
    stall_s: Estimate  # the healthy groups' stall per replica-local failure
    overhead_ms: Estimate = Estimate(0.0)  # per step, over a plain DDP step
    step_s: float = 5.0  # one step of the simulated job
    share_obs: int = LLAMA3_INTERRUPTIONS  # failures behind the mix's shares; 0: shares exact

    def __post_init__(self) -> None:
        if self.groups < 1 or self.heal_s < 0 or not self.step_s > 0 or self.share_obs < 0:
            raise ConfigError(
                "replica groups: give 1 or more groups, a heal time >= 0 and a step time above 0"
            )


def job_wide_share(cfg: SimConfig) -> float:
    """The share of the failure rate whose kinds stop every group."""
    total = sum(c.per_gpu_day for c in cfg.categories)
    return sum(c.per_gpu_day for c in cfg.categories if c.job_wide) / total if total else 0.0


def simulate_groups(cfg: SimConfig, model: GroupModel) -> Any:
    """ETTR per trial in the replica-group mode: the same failure times as `simulate` with the
    same seed (its restart mode), each trial with its own draw of the uncertain inputs."""
    np = need("numpy")
    rng = np.random.default_rng(cfg.seed)
    horizon, n = cfg.days * DAY_S, cfg.trials
    if cfg.rate_per_s == 0:
        times = np.full((n, 1), np.inf)
        failed = np.zeros((n, 1), dtype=bool)
    else:
        times, _, failed = _failures(cfg, rng)
    draws = np.random.default_rng([cfg.seed, 1])  # the inputs' draws leave the failures alone
    share = job_wide_share(cfg)
    if model.share_obs and 0 < share < 1:
        k = share * model.share_obs
        p = draws.beta(k + 0.5, model.share_obs - k + 0.5, n)
    else:
        p = np.full(n, share)
    stall = model.stall_s.draw(draws, n)
    step_cost = 1.0 + model.overhead_ms.draw(draws, n) / 1000.0 / model.step_s
    wide = (draws.random(times.shape) < p[:, None]) & failed

    # Blocked time: the union of [t, t + block) over the failures; the job trains in the gaps.
    block = np.where(wide, cfg.restart_s, stall[:, None])
    ends = np.where(failed, times + block, 0.0)
    before = np.concatenate([np.zeros((n, 1)), np.maximum.accumulate(ends, axis=1)[:, :-1]], axis=1)
    gaps = np.where(failed, np.maximum(0.0, np.minimum(times, horizon) - before), 0.0)
    tail = np.maximum(0.0, horizon - np.maximum(before[:, -1], ends[:, -1]))
    # A job-wide failure ends a run: the run keeps only what reached a checkpoint.
    compute = np.cumsum(gaps, axis=1)
    cols = np.arange(times.shape[1])
    last_wide = np.maximum.accumulate(np.where(wide, cols, -1), axis=1)
    prev_wide = np.concatenate([np.full((n, 1), -1), last_wide[:, :-1]], axis=1)
    start = np.where(prev_wide >= 0, np.take_along_axis(compute, np.maximum(prev_wide, 0), axis=1), 0.0)
    runs = np.where(wide, compute - start, 0.0)
    final_start = np.where(
        last_wide[:, -1] >= 0,
        np.take_along_axis(compute, np.maximum(last_wide[:, -1:], 0), axis=1)[:, 0],
        0.0,
    )
    useful = np.where(wide, _committed(runs, cfg, final=False), 0.0).sum(axis=1)
    useful = useful + _committed(compute[:, -1] - final_start + tail, cfg, final=True)
    # A replica-local failure takes its group's share of the capacity for the heal beyond the stall.
    healing = np.minimum(model.heal_s, np.maximum(0.0, horizon - times)) - stall[:, None]
    capacity = np.where(failed & ~wide, np.maximum(0.0, healing), 0.0).sum(axis=1) / model.groups
    useful = np.maximum(0.0, useful - capacity * cfg.interval_s / (cfg.interval_s + cfg.write_s))
    return useful / horizon / step_cost


def interval(x: Any, level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` range of the trials."""
    np = need("numpy")
    lo, hi = np.quantile(x, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
