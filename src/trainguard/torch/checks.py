"""The Guard's check machinery: when a step's loss is read, agreed on and judged.

Part of the Guard (``trainguard.torch.guard``, which mixes this in; the per-step common path
stays in ``Guard.step``). A step is recorded in the current window; a window is launched
(``trainguard.torch.agreement``: one packed tensor, asynchronous all-reduces, a non-blocking copy
to the host) when it holds ``check_every`` steps, and collected ``check_lag`` steps later, when
the GPU has normally finished it. ``_flush`` checks everything at once before a checkpoint, so a
checkpoint never holds an unchecked update. One process with host values and ``check_every=1``
("direct") reads each loss inline instead. See docs/guard.md, "When the loss is read".
"""

from __future__ import annotations

import math
import time
from collections import deque
from enum import Enum
from typing import Any

import torch

from trainguard.detect.numerics import NumericsMonitor, Policy
from trainguard.errors import ConfigError
from trainguard.torch.agreement import Agreement, Window, host_value
from trainguard.torch.preemption import PreemptionHandler

__all__ = ["StepAction", "WindowChecks", "check_mode"]


class StepAction(str, Enum):
    PROCEED = "proceed"  # apply the update
    SKIP = "skip"  # drop the update of this step and go on
    ROLLBACK = "rollback"  # the state was restored; continue from guard.resume_step


class WindowChecks:
    """Mixin for ``Guard``: the attributes below are set up by ``Guard.__init__``."""

    step_times: deque[float]
    monitor: NumericsMonitor
    rank: int
    world_size: int
    check_every: int
    check_lag: int
    heartbeat_interval_s: float
    last_loss: float | None
    last_checked: int | None
    restored: bool
    resume_step: int | None
    _agreement: Agreement
    _losses: list[Any]
    _grads: dict[int, torch.Tensor]
    _arrivals: dict[int, float]
    _inflight: Any
    _next_event: int
    _boundary_at: int
    _mode_set: bool
    _direct: bool
    _lazy: tuple[int, int]
    _check_args: tuple[int | None, int | None]
    _chaos_next: int | None
    _grad_flag: torch.Tensor | None
    _t_last: float
    _beat_due: float
    _rolled_back: bool
    _preempt: PreemptionHandler | None
    _preempt_agreed: bool

    def _apply_chaos(self, step: int, loss: Any) -> Any:
        raise NotImplementedError

    def _decide(
        self,
        step: int,
        value: float | None,
        dt: float,
        grads_bad: bool,
        current: int,
        applied: bool = False,
        sources: tuple[int, ...] = (),
    ) -> StepAction:
        raise NotImplementedError

    def _beat(
        self,
        step: int,
        loss: float | None,
        dt: float | None,
        phase: str,
        force: bool = False,
        wait: float | None = None,
    ) -> None:
        raise NotImplementedError

    def _hb_beat(self, step: int, loss: float | None, dt: float | None, wait: float | None) -> None:
        raise NotImplementedError

    def _step_slow(self, step: int, loss: Any, now: float) -> StepAction:
        """Chaos, check_grads, the first step, and the steps that launch or collect a window."""
        self.restored = False
        if self._chaos_next is not None and step >= self._chaos_next:
            loss = self._apply_chaos(step, loss)
            # A straggler arrives late by its delay: that is what its peers wait for.
            self._arrivals[step] = time.perf_counter()
        grads, self._grad_flag = self._grad_flag, None
        if not self._mode_set:
            self._set_mode(loss)
        try:
            if self._direct:
                value = host_value(loss)
                self.last_loss = value
                return self._read_now(step, value, grads)
            self._losses.append(loss.detach() if isinstance(loss, torch.Tensor) else loss)
            if grads is not None:
                self._grads[step] = grads
            checked = False
            if self._inflight is not None:
                job, self._inflight = self._inflight, None
                checked = True
                action = self._evaluate(self._agreement.collect(job), step)
                if action is not StepAction.PROCEED:
                    return action
            if len(self._losses) >= self.check_every:
                job = self._launch(step)
                if self.check_lag == 0:
                    return self._evaluate(self._agreement.collect(job), step)
                self._inflight = job
            if not checked and now >= self._beat_due:
                self._beat(step, self.last_loss, self.step_times[-1], "train", force=True)
            return StepAction.PROCEED
        finally:
            self._plan(step)

    def _read_now(self, step: int, value: float | None, grads: Any) -> StepAction:
        """Direct mode, a step that is not plainly clean (or has a gradient flag): decide now."""
        bad = grads is not None and bool(grads.item() > 0)
        self.last_checked = step
        dt = self.step_times[-1]
        if not bad and self.monitor.clean(value):
            if time.perf_counter() >= self._beat_due:
                self._beat(step, value, dt, "train", force=True)
            return StepAction.PROCEED
        self._hb_beat(step, value, dt, None)  # the supervisor sees a NaN at once
        sources = (self.rank,) if value is not None and not math.isfinite(value) else ()
        action = self._decide(step, value, dt, bad, step, sources=sources)
        self._set_mode(None)  # a judged replay returns to the configured mode
        self._plan(step)
        return action

    def _launch(self, step: int) -> Any:
        """Start reading the window that ends with ``step`` (consecutive steps)."""
        losses, self._losses = self._losses, []
        n = len(losses)
        times = self.step_times
        dts = [times[i] for i in range(-n, 0)] if n <= len(times) else [0.0] * n
        # Arrivals, backwards from the last: each step arrived one step time after the previous.
        arrivals = [self._t_last] * n
        for i in range(n - 1, 0, -1):
            arrivals[i - 1] = arrivals[i] - dts[i]
        first = step - n + 1
        if self._arrivals:
            arrivals = [self._arrivals.get(first + i, a) for i, a in enumerate(arrivals)]
            self._arrivals.clear()
        grads = self._grads
        entries = [(first + i, losses[i], dts[i], arrivals[i], grads.get(first + i)) for i in range(n)]
        grads.clear()
        preempt = self._preempt is not None and self._preempt.requested is not None
        return self._agreement.launch(entries, preempt)

    def _plan(self, step: int) -> None:
        """The next step that cannot take the common path of ``step``."""
        nxt = step + 1 if self._inflight is not None else step + max(1, self.check_every - len(self._losses))
        if self._direct:
            nxt = 1 << 62
        if self._chaos_next is not None:
            nxt = min(nxt, self._chaos_next)
        self._next_event = nxt if self._mode_set and not self._rolled_back else -1

    def _pending(self) -> bool:
        return bool(self._losses) or self._inflight is not None

    def _flush(self, step: int) -> int | None:
        """Check every recorded step now (before a checkpoint or the end): a checkpoint must
        never hold an update that was not checked. Returns the step to continue from after a
        rollback, else None. Collective: every rank flushes at the same boundaries."""
        if not self._pending():
            return None
        if self._inflight is not None:
            job, self._inflight = self._inflight, None
            if self._evaluate(self._agreement.collect(job), step, applied=True) is StepAction.ROLLBACK:
                return self._after_rollback(step)
        if self._losses:
            job = self._launch(step)
            if self._evaluate(self._agreement.collect(job), step, applied=True) is StepAction.ROLLBACK:
                return self._after_rollback(step)
        self._plan(step)
        return None

    def _after_rollback(self, step: int) -> int:
        self._rolled_back, self.restored = False, True
        return self.resume_step if self.resume_step is not None else step + 1

    def _evaluate(self, window: Window, current: int, applied: bool = False) -> StepAction:
        """Act on the agreed numbers of ``window``; ``current`` is the step in progress (its
        update not applied yet, unless ``applied``: a flush at a boundary). Applied updates can
        be rolled back (or stopped on), not skipped."""
        if window.preempt:
            self._preempt_agreed, self._boundary_at = True, 0
        for i, step in enumerate(window.steps):
            value, bad = window.losses[i], window.grads_bad[i]
            self.last_loss, self.last_checked = value, step
            if not bad and self.monitor.clean(value):
                continue
            wait = window.waits[i] if window.waits is not None else None
            sources = window.sources[i]
            # The supervisor sees the NaN at once, from the ranks that produced it: the others'
            # own loss was finite (the agreed mean is not theirs to report).
            beat = value if not sources or self.rank in sources else None
            self._hb_beat(step, beat, window.step_times[i], wait)
            action = self._decide(step, value, window.step_times[i], bad, current, applied, sources)
            if action is not StepAction.PROCEED:
                self._losses, self._inflight = [], None  # steps after a rollback replay anyway
                self._grads.clear()
                self._arrivals.clear()
                self._next_event = -1  # the next step resets ``restored`` and the mode
                self._set_mode(None)
                return action
        self._set_mode(None)
        # One heartbeat per window at most, for its last step, with its slowest step and longest
        # wait; a window with a step slower than the heartbeat interval is always reported (a
        # straggler is news, and slow steps leave few heartbeats anyway).
        slowest = max(window.step_times)
        if time.perf_counter() >= self._beat_due or slowest >= self.heartbeat_interval_s:
            last = len(window.steps) - 1
            wait = max(window.waits) if window.waits is not None else None
            self._hb_beat(window.steps[last], window.losses[last], slowest, wait)
        return StepAction.PROCEED

    def _set_mode(self, loss: Any) -> None:
        """Resolve the automatic check mode once (from the first loss's device); after a
        rollback check every step at once until the replayed step is judged (so that a repeat
        can still be skipped)."""
        if not self._mode_set and loss is not None:
            self._mode_set = True
            self._agreement.choose_device(loss)
            on_device = isinstance(loss, torch.Tensor) and loss.device.type != "cpu"
            every, lag = self._check_args
            lazy = on_device or self.world_size > 1
            self._lazy = (every or (8 if lazy else 1), lag if lag is not None else (1 if lazy else 0))
        if self._mode_set and not self._losses and self._inflight is None:
            self.check_every, self.check_lag = (1, 0) if self.monitor.replaying else self._lazy
            self._direct = (self.check_every, self.check_lag, self.world_size) == (1, 0, 1) and (
                self._agreement.device is None
            )


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
