"""Numerics detection for the training loop: non-finite losses, loss spikes, and what to do.

Pure and torch-free (the Guard in ``trainguard.torch.guard`` feeds it floats; the supervisor and
the agent can reuse it on heartbeat losses). Where it sits::

    Guard.step(loss) -> NumericsMonitor.observe(step, loss) -> Ruling(action, findings)

A spike is a loss whose robust z-score against the last ``window`` accepted losses,
``(x - median) / (1.4826 * MAD)``, exceeds ``threshold``, and that sits at least ``min_rel_jump``
(relative) above the median. For positive losses ``x`` is ``log(loss)``: minibatch losses are
heavy-tailed and shrink by orders of magnitude during training, and in log space a batch at 5x
the median of a converged classifier (noise) scores ~3 while a language model jumping from 2.0
to 3.0 (a real spike) scores far above 10. Only upward jumps count. The median and MAD are
refreshed every ``refresh`` accepted losses, so a step costs O(1).

After a rollback the same steps replay on the same data. If the anomaly comes back at the same
step, the batch is the likely cause (``numerics.data_problem``) and the step is skipped instead of
rolling back again; if the step passes cleanly, the first anomaly was a transient fault of the
machine (``numerics.transient``: a silent-data-corruption suspect worth a diagnostic).

    >>> m = NumericsMonitor(on_nan=Policy.SKIP)
    >>> m.observe(0, float("nan")).action
    <Policy.SKIP: 'skip'>
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from statistics import median

from trainguard.actions import Advice
from trainguard.records import Category, Finding, Health

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


class Policy(str, Enum):
    """What to do with a step whose numerics are wrong (and PROCEED when they are fine)."""

    PROCEED = "proceed"  # apply the update
    WARN = "warn"  # report, but apply the update anyway
    SKIP = "skip"  # drop this update
    ROLLBACK = "rollback"  # restore the last good checkpoint and replay
    STOP = "stop"  # save nothing, exit with WorkerExit.NUMERICS_STOP


class Anomaly(str, Enum):
    NONE = "none"
    NONFINITE = "nonfinite"  # NaN or Inf in the loss (or the gradients)
    SPIKE = "spike"


@dataclass(frozen=True, slots=True)
class SpikeConfig:
    window: int = 100  # losses kept for the median / MAD
    threshold: float = 8.0  # robust z-score above which a loss is a spike
    min_history: int = 20  # no spike verdict before this many losses were seen
    min_rel_jump: float = 0.2  # and the loss must exceed the median by this fraction of it
    log_scale: bool = True  # score log(loss) when the losses are positive
    refresh: int = 50  # recompute median / MAD every N accepted losses (each costs ~100 us)


@dataclass(frozen=True, slots=True)
class RobustStats:
    center: float  # median (of log losses when log is True)
    scale: float  # 1.4826 * MAD, never 0
    log: bool
    n: int

    @property
    def median(self) -> float:
        return math.exp(self.center) if self.log else self.center

    def zscore(self, value: float) -> float | None:
        if self.log:
            if value <= 0:
                return None
            value = math.log(value)
        return (value - self.center) / self.scale


@dataclass(frozen=True, slots=True)
class LossCheck:
    step: int
    loss: float | None
    anomaly: Anomaly = Anomaly.NONE
    zscore: float | None = None
    median: float | None = None
    source: str = "loss"  # "loss" or "grad"


@dataclass(frozen=True, slots=True)
class Ruling:
    action: Policy
    check: LossCheck
    findings: tuple[Finding, ...] = ()


_SOURCES = "source ranks: "


def with_sources(finding: Finding, ranks: tuple[int, ...]) -> Finding:
    """The finding, naming the ranks whose own loss was non-finite (every rank reports the agreed
    value; these produced it)."""
    if not ranks:
        return finding
    named = ", ".join(map(str, ranks))
    return replace(
        finding,
        reason=f"{finding.reason}, from rank {named}",
        evidence=(f"{_SOURCES}{named}", *finding.evidence),
    )


def sources_of(finding: Finding) -> tuple[int, ...]:
    """The ranks `with_sources` named; () when the finding does not say."""
    for item in finding.evidence:
        if item.startswith(_SOURCES):
            try:
                return tuple(int(r) for r in item[len(_SOURCES) :].split(","))
            except ValueError:
                return ()
    return ()


def robust_stats(history: Iterable[float], log_scale: bool = True) -> RobustStats | None:
    """Median and MAD-based scale of the finite values (in log space if all are positive).

    A zero MAD (a flat history) becomes a tiny fraction of the median, so that a flat run
    followed by a jump still scores high instead of dividing by zero.
    """
    # C-level loops (filter/map): this runs every ``refresh`` steps inside the training loop.
    values = list(filter(math.isfinite, history))
    if not values:
        return None
    log = log_scale and min(values) > 0
    if log:
        values = list(map(math.log, values))
    mid = median(values)
    mad = median(list(map(abs, map(float(mid).__rsub__, values))))  # |v - mid|
    scale = _MAD_TO_SIGMA * mad or max(abs(mid) * 1e-6, 1e-12)
    return RobustStats(mid, scale, log, len(values))


def check_loss(step: int, loss: float | None, stats: RobustStats | None, config: SpikeConfig) -> LossCheck:
    """Classify one loss against the statistics of the accepted history (pure; never raises)."""
    if loss is None:
        return LossCheck(step, None)
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        return LossCheck(step, None)
    if not math.isfinite(loss):
        return LossCheck(step, loss, Anomaly.NONFINITE)
    if stats is None or stats.n < config.min_history:
        return LossCheck(step, loss)
    z, mid = stats.zscore(loss), stats.median
    if z is None:
        return LossCheck(step, loss, median=mid)
    spike = z > config.threshold and loss - mid > config.min_rel_jump * abs(mid)
    return LossCheck(step, loss, Anomaly.SPIKE if spike else Anomaly.NONE, z, mid)


class NumericsMonitor:
    """Stateful (but I/O-free) numerics policy for one rank: feed it every step's loss.

    ``observe`` returns what to do with the step; the caller reports ``rolled_back(step)``
    once a rollback really happened, so a repeat at the same step can be told from a transient.
    """

    def __init__(
        self,
        on_nan: Policy | str = Policy.ROLLBACK,
        on_spike: Policy | str = Policy.ROLLBACK,
        spike: SpikeConfig | None = None,
        gpu: int | None = None,
    ) -> None:
        self.on_nan, self.on_spike = Policy(on_nan), Policy(on_spike)
        self.config = spike or SpikeConfig()
        self.gpu = gpu
        self._history: deque[float] = deque(maxlen=self.config.window)
        self._stats: RobustStats | None = None
        self._stale = 0  # accepted losses since the stats were computed
        self._bound = math.inf  # losses above this may be spikes (check_loss decides)
        self._refresh_every = 0
        self._replaying: dict[int, LossCheck] = {}  # step -> the anomaly we rolled back from

    @property
    def replaying(self) -> bool:
        """A rolled-back step awaits its replay (the Guard then checks every step at once)."""
        return bool(self._replaying)

    def clean(self, loss: float | None) -> bool:
        """Fast path for the common step: True (and the loss is accepted) when ``loss`` is finite,
        no spike and no replayed step is awaited; False means "call ``observe``" (which then
        decides). No allocation: this runs on every training step."""
        if self._replaying or loss is None or not math.isfinite(loss):
            return False
        if self._stale > self._refresh_every:
            self._refresh()
        if loss > self._bound:  # the largest loss that cannot be a spike, precomputed by _refresh
            return False
        self._history.append(loss)
        self._stale += 1
        return True

    def lane(self) -> tuple[float, int]:
        """A caller's inline fast path: ``(bound, n)`` such that each of the next ``n`` losses with
        ``-MAX <= loss <= bound`` is clean and is accepted by ``history.append(loss)``, without a
        call into the monitor (the Guard's per-step path, where each call costs microseconds with
        the caches cold after backward). The ``n`` losses are counted now, so an unused lane only
        brings the next refresh forward. ``n`` is 0 while a replayed step is awaited."""
        if self._replaying:
            return -math.inf, 0
        if self._stale > self._refresh_every:
            self._refresh()
        n = max(self._refresh_every + 1 - self._stale, 0)
        self._stale += n
        return min(self._bound, sys.float_info.max), n

    @property
    def history(self) -> deque[float]:
        """The accepted losses the median / MAD are computed from (newest last)."""
        return self._history

    def _refresh(self) -> None:
        if self._stale >= self.config.refresh or (
            self._stale and len(self._history) <= self.config.min_history
        ):
            self._stats, self._stale = robust_stats(self._history, self.config.log_scale), 0
            self._bound = _spike_bound(self._stats, self.config)
            # During warm-up every accepted loss refreshes; later, every ``refresh`` losses.
            self._refresh_every = (
                self.config.refresh - 1 if len(self._history) > self.config.min_history else 0
            )

    def observe(
        self, step: int, loss: float | None, *, grads_finite: bool = True, time: float | None = None
    ) -> Ruling:
        self._refresh()
        check = check_loss(step, loss, self._stats, self.config)
        if check.anomaly is Anomaly.NONE and not grads_finite:
            check = LossCheck(step, check.loss, Anomaly.NONFINITE, source="grad")
        findings: list[Finding] = []
        first = self._replaying.pop(step, None)
        if check.anomaly is Anomaly.NONE:
            if check.loss is not None:
                self._history.append(check.loss)
                self._stale += 1
            if first is not None:
                findings.append(self._transient(first, check, time))
            return Ruling(Policy.PROCEED, check, tuple(findings))
        findings.append(self._anomaly(check, time))
        policy = self.on_nan if check.anomaly is Anomaly.NONFINITE else self.on_spike
        if first is not None:
            findings.append(self._data_problem(first, check, time))
            if policy is Policy.ROLLBACK:
                policy = Policy.SKIP  # rolling back again would replay the same bad batch forever
        return Ruling(policy, check, tuple(findings))

    def rolled_back(self, check: LossCheck) -> None:
        """The state was restored to before ``check.step``: watch that step when it replays."""
        self._replaying[check.step] = check

    def _anomaly(self, c: LossCheck, time: float | None) -> Finding:
        if c.anomaly is Anomaly.NONFINITE:
            rule, reason = f"numerics.nonfinite_{c.source}", f"non-finite {c.source} at step {c.step}"
        else:
            rule = "numerics.loss_spike"
            reason = f"loss spike at step {c.step}: {c.loss:.4g} vs median {c.median:.4g} (robust z {c.zscore:.1f})"
        return Finding(
            rule, Health.DEGRADED, Advice.NONE, reason, self.gpu, time, Category.NUMERICS, _evidence(c)
        )

    def _data_problem(self, first: LossCheck, again: LossCheck, time: float | None) -> Finding:
        reason = (
            f"{again.anomaly.value} at step {again.step} repeated after a rollback on the same data: "
            "likely a data problem (a bad batch), not the machine; the step is skipped"
        )
        return Finding(
            "numerics.data_problem",
            Health.OK,
            Advice.NONE,
            reason,
            self.gpu,
            time,
            Category.NUMERICS,
            _evidence(first) + _evidence(again),
        )

    def _transient(self, first: LossCheck, again: LossCheck, time: float | None) -> Finding:
        reason = (
            f"{first.anomaly.value} at step {first.step} did not repeat after a rollback on the same "
            "data: likely a transient fault of the machine (silent data corruption suspect)"
        )
        return Finding(
            "numerics.transient",
            Health.DEGRADED,
            Advice.RUN_DIAGNOSTICS,
            reason,
            self.gpu,
            time,
            Category.GPU_HARDWARE,
            _evidence(first) + _evidence(again),
        )


def _spike_bound(stats: RobustStats | None, config: SpikeConfig) -> float:
    """The loss above which ``check_loss`` could call a spike (a conservative fast-path bound)."""
    if stats is None or stats.n < config.min_history:
        return math.inf
    edge = stats.center + config.threshold * stats.scale
    if stats.log:
        edge = math.exp(min(edge, 700.0))
    return max(edge, stats.median + config.min_rel_jump * abs(stats.median))


def _evidence(c: LossCheck) -> tuple[str, ...]:
    out = [f"step={c.step}", f"loss={c.loss}", f"anomaly={c.anomaly.value}", f"source={c.source}"]
    if c.zscore is not None:
        out.append(f"zscore={c.zscore:.2f}")
    if c.median is not None:
        out.append(f"median={c.median:.6g}")
    return tuple(out)
