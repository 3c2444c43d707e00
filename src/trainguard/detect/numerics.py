"""Numerics detection for the training loop: non-finite losses, loss spikes, and what to do.

Pure and torch-free (the Guard in ``trainguard.torch.guard`` feeds it floats; the supervisor and
the agent can reuse it on heartbeat losses). Where it sits::

    Guard.step(loss) -> NumericsMonitor.observe(step, loss) -> Decision(action, findings)

A spike is a loss whose robust z-score against the last ``window`` accepted losses,
``(loss - median) / (1.4826 * MAD)``, exceeds ``threshold`` *and* that sits at least
``min_rel_jump`` (relative) above the median: minibatch losses are noisy, and near zero the MAD
is tiny, so the z-score alone would cry wolf. Only upward jumps count.

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
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from statistics import median

from trainguard.records import Action, Category, Finding, Health

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


class Policy(str, Enum):
    """What to do with a step whose numerics are wrong (and PROCEED when they are fine)."""

    PROCEED = "proceed"  # apply the update
    WARN = "warn"  # report, but apply the update anyway
    SKIP = "skip"  # drop this update
    ROLLBACK = "rollback"  # restore the last good checkpoint and replay
    STOP = "stop"  # save nothing, exit with ExitCode.NUMERICS_STOP


class Anomaly(str, Enum):
    NONE = "none"
    NONFINITE = "nonfinite"  # NaN or Inf in the loss (or the gradients)
    SPIKE = "spike"


@dataclass(frozen=True, slots=True)
class SpikeConfig:
    window: int = 100  # losses kept for the median / MAD
    threshold: float = 10.0  # robust z-score above which a loss is a spike
    min_history: int = 20  # no spike verdict before this many losses were seen
    min_rel_jump: float = 0.5  # and the loss must exceed the median by this fraction of it


@dataclass(frozen=True, slots=True)
class LossCheck:
    step: int
    loss: float | None
    anomaly: Anomaly = Anomaly.NONE
    zscore: float | None = None
    median: float | None = None
    source: str = "loss"  # "loss" or "grad"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Policy
    check: LossCheck
    findings: tuple[Finding, ...] = ()


def robust_zscore(history: Iterable[float], value: float) -> tuple[float | None, float | None]:
    """(z, median) of ``value`` against ``history``; z is None when history is empty.

    A zero MAD (a flat history) is replaced by a tiny fraction of the median so that a flat
    run followed by a jump still scores high instead of dividing by zero.
    """
    values = [v for v in history if math.isfinite(v)]
    if not values:
        return None, None
    mid = median(values)
    mad = median(abs(v - mid) for v in values)
    scale = _MAD_TO_SIGMA * mad or max(abs(mid) * 1e-6, 1e-12)
    return (value - mid) / scale, mid


def check_loss(step: int, loss: float | None, history: Iterable[float], config: SpikeConfig) -> LossCheck:
    """Classify one loss against the accepted history (pure; never raises)."""
    if loss is None:
        return LossCheck(step, None)
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        return LossCheck(step, None)
    if not math.isfinite(loss):
        return LossCheck(step, loss, Anomaly.NONFINITE)
    values = list(history)
    if len(values) < config.min_history:
        return LossCheck(step, loss)
    z, mid = robust_zscore(values, loss)
    if z is None or mid is None:
        return LossCheck(step, loss)
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
        self._replaying: dict[int, LossCheck] = {}  # step -> the anomaly we rolled back from

    def observe(
        self, step: int, loss: float | None, *, grads_finite: bool = True, time: float | None = None
    ) -> Decision:
        check = check_loss(step, loss, self._history, self.config)
        if check.anomaly is Anomaly.NONE and not grads_finite:
            check = LossCheck(step, check.loss, Anomaly.NONFINITE, source="grad")
        findings: list[Finding] = []
        first = self._replaying.pop(step, None)
        if check.anomaly is Anomaly.NONE:
            if check.loss is not None:
                self._history.append(check.loss)
            if first is not None:
                findings.append(self._transient(first, check, time))
            return Decision(Policy.PROCEED, check, tuple(findings))
        findings.append(self._anomaly(check, time))
        policy = self.on_nan if check.anomaly is Anomaly.NONFINITE else self.on_spike
        if first is not None:
            findings.append(self._data_problem(first, check, time))
            if policy is Policy.ROLLBACK:
                policy = Policy.SKIP  # rolling back again would replay the same bad batch forever
        return Decision(policy, check, tuple(findings))

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
            rule, Health.DEGRADED, Action.NONE, reason, self.gpu, time, Category.NUMERICS, _evidence(c)
        )

    def _data_problem(self, first: LossCheck, again: LossCheck, time: float | None) -> Finding:
        reason = (
            f"{again.anomaly.value} at step {again.step} repeated after a rollback on the same data: "
            "likely a data problem (a bad batch), not the machine; the step is skipped"
        )
        return Finding(
            "numerics.data_problem",
            Health.OK,
            Action.NONE,
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
            Action.RUN_DIAGNOSTICS,
            reason,
            self.gpu,
            time,
            Category.GPU_HARDWARE,
            _evidence(first) + _evidence(again),
        )


def _evidence(c: LossCheck) -> tuple[str, ...]:
    out = [f"step={c.step}", f"loss={c.loss}", f"anomaly={c.anomaly.value}", f"source={c.source}"]
    if c.zscore is not None:
        out.append(f"zscore={c.zscore:.2f}")
    if c.median is not None:
        out.append(f"median={c.median:.6g}")
    return tuple(out)
