"""The Guard's loss window: which steps' losses are read, when, and what the ranks agreed.

A step's loss is recorded in the current window (``Guard.step`` appends to `LossWindow.losses`:
no kernel, no sync). A window is launched (``trainguard.torch.agreement``: one packed tensor,
asynchronous all-reduces, a non-blocking copy to the host) when it holds ``every`` steps, and
collected ``lag`` steps later, when the GPU has normally finished it. The Guard drives it one
way, step by step: `collect` the window in flight, judge it, `launch` the next one once full
(read at once with lag 0: judge it), then `settle` the window on the verdicts. A flush (before a
checkpoint: a checkpoint never holds an unchecked update) is `collect` then `launch(now=True)`. One process with host
values and ``every=1`` ("direct") reads each loss inline instead. See docs/guard.md, "When the
loss is read".
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trainguard.detect.numerics import NumericsMonitor, Policy
from trainguard.errors import ConfigError
from trainguard.torch.agreement import Agreement, Window

__all__ = ["LossWindow", "check_mode", "window_size"]

AUTO_EVERY = 8  # steps per window by default, on a GPU or with several ranks
# With short steps a window grows until it spans this much training time: its fixed cost
# (packing, one all-reduce, reading it back: ~0.2 ms of CPU) then stays under 1% of the steps'.
WINDOW_S = 0.1
MAX_AUTO_EVERY = 64


class LossWindow:
    """The steps recorded since the last launch, the window in flight, and the check mode."""

    def __init__(
        self,
        monitor: NumericsMonitor,
        world_size: int,
        backend: str | None,
        rank: int,
        check_every: int | None,
        check_lag: int | None,
    ) -> None:
        self._monitor = monitor
        self._world = world_size
        self.agreement = Agreement(world_size, backend, rank)
        self._args = check_mode(monitor, check_every, check_lag)
        self.every, self.lag = self._args[0] or 1, self._args[1] or 0
        self.losses: list[Any] = []  # one list for the window's life: the Guard caches its append
        self._grads: dict[int, torch.Tensor] = {}  # step -> check_grads flag
        self._arrivals: dict[int, float] = {}  # step -> arrival, where chaos delayed it
        self._inflight: Any = None  # the launched window, collected ``lag`` steps later
        self.mode_set = False
        self.direct = False  # one process, host values, every step: the Guard reads inline
        self._lazy = (self.every, self.lag)  # the mode outside rollback replays
        # What is kept of a recorded loss tensor: detached on a device (read later, without a
        # sync), its value at once on the host (item() is no sync there, and cheaper than detach).
        self.take: Any = torch.Tensor.detach

    @property
    def pending(self) -> bool:
        return bool(self.losses) or self._inflight is not None

    def record(self, step: int, loss: Any, grads: torch.Tensor | None) -> None:
        self.losses.append(self.keep(loss))
        if grads is not None:
            self._grads[step] = grads

    def keep(self, loss: Any) -> Any:
        """What is kept of any loss a user passes (``take`` of a one-element tensor)."""
        if not isinstance(loss, torch.Tensor):
            return loss
        try:
            return self.take(loss)
        except (RuntimeError, ValueError):  # not one element: host_value reads the first
            return loss.detach()

    def arrived(self, step: int, at: float) -> None:
        """``step`` reached ``guard.step`` at ``at`` (perf_counter), later than its step time says."""
        self._arrivals[step] = at

    def collect(self, fit: bool = True) -> Window | None:
        """The window in flight, agreed; None when none is. ``fit``: size the automatic windows
        to its step time (not at a flush, which is not where every rank samples it)."""
        if self._inflight is None:
            return None
        job, self._inflight = self._inflight, None
        agreed = self.agreement.collect(job)
        if fit:
            self._fit(agreed)
        return agreed

    def launch(
        self, step: int, times: Any, t_last: float, preempt: bool, now: bool = False, save: bool = False
    ) -> Window | None:
        """Launch the window that ends with ``step`` once it holds ``every`` steps (``now``: any
        recorded steps, read at once: a flush). Returns its agreed numbers when it is read at
        once (lag 0), else None: it is in flight, `collect`ed ``lag`` steps later."""
        if not (self.losses if now else len(self.losses) >= self.every):
            return None
        job = self._launch(step, times, t_last, preempt, save)
        if now or self.lag == 0:
            return self.agreement.collect(job)
        self._inflight = job
        return None

    def settle(self, rejected: bool) -> bool:
        """After the Guard's verdict on a window: a rejected one (rollback, skip) drops what
        is recorded (it replays anyway); either way the check mode is chosen again. Returns
        whether the Guard now reads losses inline (see `set_mode`)."""
        if rejected:
            self.drop()
        return self.set_mode(None)

    def drop(self) -> None:
        """Forget the recorded steps: after a rollback or a skip they replay anyway."""
        self.losses.clear()
        if self._inflight is not None:  # its collective still runs (on every rank): let it land
            self.agreement.settle(self._inflight)  # before its buffer is reused
        self._inflight = None
        self._grads.clear()
        self._arrivals.clear()

    def next_step(self, step: int) -> int:
        """The next step after ``step`` that launches or collects a window."""
        if self.direct:
            return 1 << 62
        if self._inflight is not None:
            return step + 1
        return step + max(1, self.every - len(self.losses))

    def set_mode(self, loss: Any) -> bool:
        """Resolve the automatic check mode once (from the first loss's device); after a
        rollback check every step at once until the replayed step is judged (so that a repeat
        can still be skipped). Returns whether the Guard reads losses inline ("direct")."""
        if not self.mode_set and loss is not None:
            self.mode_set = True
            self.agreement.choose_device(loss)
            device = self.agreement.device
            if device is None or device.type == "cpu":
                self.take = torch.Tensor.item
            on_device = isinstance(loss, torch.Tensor) and loss.device.type != "cpu"
            every, lag = self._args
            lazy = on_device or self._world > 1
            self._lazy = (
                every or (AUTO_EVERY if lazy else 1),
                lag if lag is not None else (1 if lazy else 0),
            )
        if self.mode_set and not self.pending:
            self.every, self.lag = (1, 0) if self._monitor.replaying else self._lazy
            self.direct = (self.every, self.lag, self._world) == (1, 0, 1) and self.agreement.device is None
        return self.direct

    def _fit(self, agreed: Window) -> None:
        """Size the automatic windows to the agreed step time: every rank sees the same arrivals,
        so every rank picks the same size at the same step (windows are collectives)."""
        if self._args[0] is not None or agreed.step_s is None or self._lazy[0] == 1:
            return
        every = window_size(agreed.step_s)
        self._lazy = (every, self._lazy[1])
        if self.every > 1:  # not during a rollback's replay, which checks every step
            self.every = every

    def _launch(self, step: int, times: Any, t_last: float, preempt: bool, save: bool = False) -> Any:
        """Start reading the window that ends with ``step`` (consecutive steps)."""
        losses = self.losses[:]
        self.losses.clear()
        n = len(losses)
        dts = [times[i] for i in range(-n, 0)] if n <= len(times) else [0.0] * n
        # Arrivals, backwards from the last: each step arrived one step time after the previous.
        arrivals = [t_last] * n
        for i in range(n - 1, 0, -1):
            arrivals[i - 1] = arrivals[i] - dts[i]
        first = step - n + 1
        if self._arrivals:
            arrivals = [self._arrivals.get(first + i, a) for i, a in enumerate(arrivals)]
            self._arrivals.clear()
        grads = self._grads
        entries = [(first + i, losses[i], dts[i], arrivals[i], grads.get(first + i)) for i in range(n)]
        grads.clear()
        return self.agreement.launch(entries, preempt, save)


def check_mode(monitor: NumericsMonitor, every: int | None, lag: int | None) -> tuple[int | None, int | None]:
    """(check_every, check_lag) as given, (1, 0) under a skip policy (None: decided at step 0)."""
    if every is not None and not 1 <= every <= 256:
        raise ConfigError(f"check_every={every}: use 1 (every step) to 256")
    if lag is not None and lag not in (0, 1):
        raise ConfigError(f"check_lag={lag}: use 0 (read at once) or 1 (one step later, no device stall)")
    if Policy.SKIP in (monitor.on_nan, monitor.on_spike):
        if (every or 1) > 1 or (lag or 0) > 0:
            raise ConfigError(
                "a 'skip' policy needs each step checked before its update: use check_every=1, "
                "check_lag=0 (the default under skip), or the 'rollback' policy"
            )
        return 1, 0
    return every, lag


def window_size(step_s: float) -> int:
    """Steps per automatic window: 8, or as many as span ``WINDOW_S`` of short steps (up to 64).

    >>> window_size(0.2), window_size(0.0026), window_size(0.0001)
    (8, 39, 64)
    """
    if step_s <= 0:
        return MAX_AUTO_EVERY
    return min(MAX_AUTO_EVERY, max(AUTO_EVERY, math.ceil(WINDOW_S / step_s)))
