"""The Guard: in-loop fault detection and the step boundary of a training loop.

Sits inside the trainer, at the start of the spine: it writes the run-directory protocol
(``trainguard.rundir``: heartbeats, error files, findings, hang dumps) that the supervisor and the
agent read, and acts on what only the trainer can see (numerics, preemption, a stuck step)::

    start = ckpt.resume(state)
    with Guard(checkpointer=ckpt, state=state, checkpoint_every=100) as guard:
        for step in guard.range(start, steps):      # rollbacks, checkpoints, preemption
            loss = loss_fn(model(x), y)
            loss.backward()
            if guard.step(step, loss) == "proceed":  # heartbeat, timing, numerics, chaos
                optimizer.step()
            optimizer.zero_grad()

``guard.step`` returns a ``StepAction``: "proceed" (apply the update), "skip" (drop it), or
"rollback" (the state was restored from the last good checkpoint; ``guard.range`` continues from
``guard.resume_step``, and ``guard.restored`` tells a data iterator to start over).
``guard.range`` advances between steps, after the update: that is where periodic checkpoints are
taken, where the supervisor's checkpoint requests are served (``control.json``, every
``control_every`` steps: `trainguard.control.SaveRequests`), and where a preemption signal turns into a
synchronous save and ``WorkerExit.PREEMPTED``.
See docs/guard.md.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from trainguard import rundir
from trainguard.actions import Advice, StepAction
from trainguard.chaos.inject import Chaos
from trainguard.control import SaveRequests
from trainguard.detect.numerics import NumericsMonitor, Policy, with_sources
from trainguard.records import Category, Finding, Health
from trainguard.rundir import WorkerExit
from trainguard.torch import errorfile, guard_config
from trainguard.torch.agreement import Window, host_value
from trainguard.torch.balance import balancer_for
from trainguard.torch.checks import LossWindow
from trainguard.torch.flight_recorder import DumpServer, serve_dump_requests
from trainguard.torch.numerics import distributed_world, nonfinite_grads, poison
from trainguard.torch.preemption import PreemptionHandler
from trainguard.torch.sim_gpu import SimGpu, simulated_gpu
from trainguard.torch.watchdog import HangWatchdog

log = logging.getLogger(__name__)

_FLOAT_MAX = sys.float_info.max

__all__ = ["Guard", "GuardConfig", "StepAction", "WorkerExit", "record"]

record = errorfile.record
GuardConfig = guard_config.GuardConfig


class Guard:
    """Heartbeats, error files, numerics policy, preemption and a hang watchdog for one rank.

    Its settings are one `GuardConfig` (``guard.config``), given as a value, as keywords, or
    both (a keyword overrides the value's field). Without ``TRAINGUARD_RUN_DIR`` (and no
    ``run_dir=``) nothing is written to disk: numerics, preemption and the watchdog still work,
    errors and dumps go to stderr.
    """

    def __init__(
        self,
        checkpointer: Any = None,  # trainguard.torch.Checkpointer (or anything with save/resume/wait)
        state: Any = None,  # trainguard.torch.TrainState: what rollbacks and saves restore/write
        config: GuardConfig | None = None,  # the settings (default: GuardConfig())
        **settings: Any,  # any GuardConfig field, in place of the config's (on_nan="skip", ...)
    ) -> None:
        self.config = c = guard_config.merged(config, **settings)
        self.checkpointer, self.state = checkpointer, state
        env_dir = rundir.run_dir_from_env()
        self.run_dir: Path | None = Path(c.run_dir) if c.run_dir is not None else env_dir
        world = distributed_world()
        self.rank = c.rank if c.rank is not None else world[0] if world else int(os.environ.get("RANK", "0"))
        self.world_size = world[1] if world else 1
        if world is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            log.warning("Guard created before init_process_group: ranks will not agree on decisions")
        self.attempt = c.attempt if c.attempt is not None else int(os.environ.get(rundir.ATTEMPT_ENV, "0"))
        gpu = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # findings name the physical GPU (NVML's index, set by the supervisor), not CUDA's
            # index among the visible ones: they differ once a GPU is excluded
            named = os.environ.get("TRAINGUARD_GPU", "")
            gpu = int(named) if named.isdigit() else torch.cuda.current_device()
        self.monitor = NumericsMonitor(c.on_nan, c.on_spike, c.spike, gpu=gpu)
        backend = dist.get_backend() if world else None
        self._window = LossWindow(
            self.monitor, self.world_size, backend, self.rank, c.check_every, c.check_lag
        )
        self._record = self._window.losses.append  # the common path's only window operation
        self._take = self._window.take  # what is kept of a loss: see LossWindow.set_mode
        self._next_event = -1  # steps from here take the slow path (first step, chaos, windows)
        self._boundary_at = 0  # end_step(step) has work when step + 1 reaches this
        self._direct = False  # one process, CPU loss, every step: guard.step reads it inline
        self._lane_bound, self._lane_n = -math.inf, 0  # see NumericsMonitor.lane
        self._lane_accept = self.monitor.history.append
        self.last_checked: int | None = None  # the last step whose loss was read and agreed
        self.findings: list[Finding] = []
        self.step_times: deque[float] = deque(maxlen=256)  # seconds per step, newest last
        self.last_loss: float | None = None  # the loss of the last step (mean over ranks)
        self.resume_step: int | None = None  # after a rollback: the step to continue from
        self.restored = False  # True for the first step after a rollback (rebuild data iterators)
        self._hb: rundir.HeartbeatWriter | None = None
        self._preempt: PreemptionHandler | None = None
        self._watchdog: HangWatchdog | None = None
        self._backend = backend
        self._dumps: DumpServer | None = None  # answers the supervisor's flight-recorder requests (gloo)
        self._chaos: Chaos | None = None
        self._chaos_next: int | None = None
        self._grad_flag: torch.Tensor | None = None
        self._preempt_agreed = False
        self._n_at_signal: int | None = None  # guard.step calls when a preemption signal was seen
        self._requests: SaveRequests | None = None  # the supervisor's checkpoint requests
        self._save_agreed = False  # every rank saves at the next boundary (a request)
        self._rolled_back = False
        self.last_step: int | None = None  # the last step given to guard.step
        self.current_step: int | None = None  # the step in progress (error files name it)
        self._last_saved: int | None = None
        self._t_last = 0.0
        self._n_steps = 0  # guard.step calls (the watchdog's first-step allowance ends at 1)
        self._last_beat = -1e9  # perf_counter of the last heartbeat written
        self._beat_due = math.inf  # perf_counter from which the next train heartbeat is due
        self._phase = ""
        # balance=True: moves the shares of uneven ranks (None with one rank: nothing to balance)
        self.balancer = balancer_for(
            c.balance, c.balance_every, state, self.run_dir, self.rank, self.world_size, self._measured
        )
        self._sim_gpu: SimGpu | None = None  # on a simulated node: this rank runs at its GPU's speed

    # -- context -------------------------------------------------------------------------------
    def __enter__(self) -> Guard:
        errorfile.install(self)
        if self.run_dir is not None:
            self._hb = rundir.HeartbeatWriter(self.run_dir, self.rank, self.attempt)
            self._beat_due = 0.0
        c = self.config
        self._preempt = PreemptionHandler(
            c.preempt_signals, on_request=self._on_signal, give_up=self._give_up
        )
        if c.control_every > 0 and self.run_dir is not None and self.checkpointer is not None:
            self._requests = SaveRequests(self.run_dir, c.control_every, self.attempt)
        if c.chaos and self.run_dir is not None:
            self._chaos = Chaos(self.run_dir, self.rank)
            self._chaos_next = self._chaos.next_step
        if c.watchdog:
            dumps = rundir.dumps_dir(self.run_dir) if self.run_dir is not None else None
            self._watchdog = HangWatchdog(
                dumps,
                self.rank,
                floor_s=c.hang_floor_s,
                factor=c.hang_factor,
                first_step_s=c.first_step_s,
                on_hang=self._on_hang,
                progress=self._progress,
            ).start()
        self._dumps = self._serve_dumps()
        if self.balancer is not None and self.state is not None:
            self.balancer.attach(self.state.model)
        self._sim_gpu = simulated_gpu(self.state)
        if self._sim_gpu is not None and self.balancer is not None:  # its slowdown is device time
            self.balancer.device_clock = self._sim_gpu.device_time
        self._beat(0, None, None, "init", force=True)
        self._t_last = time.perf_counter()
        return self

    def _serve_dumps(self) -> DumpServer | None:
        """Answer the supervisor's flight-recorder dump requests on a hang: NCCL's monitor thread
        answers its debug-info pipe by itself; gloo has none, so a daemon thread here does."""
        prefix = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
        if not prefix or self._backend is None or "nccl" in str(self._backend):
            return None
        try:
            return serve_dump_requests(prefix, self.rank)
        except OSError as exc:  # a read-only or vanished dumps folder: hangs lose only the dump
            log.warning("flight-recorder dump requests not served (%s): %s", prefix, exc)
            return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is not None and not isinstance(exc, SystemExit | GeneratorExit | KeyboardInterrupt):
                errorfile.write(exc, self.run_dir, self.rank, self.attempt, self.current_step)
            # A clean exit checks the steps not checked yet (a loop without guard.range), then
            # the last save must land (or its error surface). Not after an error: both are
            # collective, and the peers of a failed rank may never join them.
            if exc is None and self._pending():
                self._flush(self.last_step or 0)
            if exc is None and self.checkpointer is not None and hasattr(self.checkpointer, "wait"):
                self.checkpointer.wait()
        finally:
            self._beat(self.last_step or 0, self.last_loss, None, "exit", force=True)
            errorfile.detach(self)
            self.close()

    def close(self) -> None:
        if self.balancer is not None:  # before the agreement's release: its wait covers both
            self.balancer.close()
        self._window.agreement.release()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._preempt is not None:
            self._preempt.close()
        if self._hb is not None:
            self._hb.close()
        if self._dumps is not None:
            self._dumps.stop()
        if self._sim_gpu is not None:
            self._sim_gpu.close()
        self._watchdog = self._preempt = self._hb = self._dumps = None

    # -- the loop ------------------------------------------------------------------------------
    def range(self, start: int, stop: int) -> Iterator[int]:
        """Steps ``start..stop-1``, honouring rollbacks; checkpoints and preemption between steps."""
        step = start
        if start != (self.last_step or 0):
            self._beat(start, None, None, "init", force=True)
        while step < stop:
            self.current_step = step
            yield step
            step = self.end_step(step)
            if step >= stop and self._pending():  # the last steps are checked before the end
                step = self._flush(stop - 1) or step
        if self.config.save_at_end and self.checkpointer is not None and self._last_saved != stop:
            self.save(stop, wait=True)

    def step(self, step: int, loss: Any) -> StepAction:
        """Record one step's loss (a tensor or float) after backward, before the optimizer step.

        The loss is read, agreed across ranks and checked every ``check_every`` steps,
        ``check_lag`` steps later (see docs/guard.md); the steps in between cost a clock read,
        a few attribute writes and a list append: no device sync, no collective.
        """
        # The common path is kept short: it runs on every step, right after backward, with the
        # caches cold (each attribute touched there costs ~1 us on a busy machine).
        now = time.perf_counter()
        self.step_times.append(now - self._t_last)
        self._t_last = now
        self._n_steps += 1  # the watchdog thread polls these (see _progress): no call per step
        self.last_step = self.current_step = step
        if step < self._next_event:  # no chaos due, no window to launch or collect
            if self._direct:  # one process, host values, every step: read it right here
                try:
                    value = loss.item()
                except (AttributeError, RuntimeError, ValueError):
                    value = host_value(loss)
                self.last_loss = value
                # Finite and no spike, inline (NaN fails every comparison); the monitor's lane
                # says for how many steps that bound holds.
                if self._lane_n and -_FLOAT_MAX <= value <= self._lane_bound:
                    self._lane_n -= 1
                    self._lane_accept(value)
                elif not self._lane_refill(value):
                    return self._read_now(step, value, None)
                if now >= self._beat_due:
                    self._beat(step, value, self.step_times[-1], "train", force=True)
                return StepAction.PROCEED
            try:
                self._record(self._take(loss))  # the value, never the autograd graph
            except (AttributeError, TypeError, RuntimeError, ValueError):  # not a one-element tensor
                self._record(self._window.keep(loss))
            if now >= self._beat_due:
                self._beat(step, self.last_loss, self.step_times[-1], "train", force=True)
            return StepAction.PROCEED
        return self._step_slow(step, loss, now)

    def weight(self, n: int) -> float:
        """The factor on this rank's mean loss over its ``n`` samples, with a ShareSampler:
        ``world * n / global_batch`` (1.0 without one). See docs/balance.md."""
        sampler = getattr(self.state, "sampler", None)
        weight = getattr(sampler, "weight", None)
        return float(weight(n)) if callable(weight) else 1.0

    @property
    def check_every(self) -> int:
        """Steps per window: the losses are read and agreed on this often."""
        return self._window.every

    @property
    def check_lag(self) -> int:
        """Steps after its launch that a window is read (0: at once)."""
        return self._window.lag

    def _step_slow(self, step: int, loss: Any, now: float) -> StepAction:
        """Chaos, check_grads, the first step, and the steps that launch or collect a window."""
        self.restored = False
        window = self._window
        if self.balancer is not None and step >= self.balancer.next_step:
            self.balancer.boundary(step)  # a collective: every rank reaches it at the same step
        if self._chaos_next is not None and step >= self._chaos_next:
            loss = self._apply_chaos(step, loss)
            # A straggler arrives late by its delay: that is what its peers wait for.
            window.arrived(step, time.perf_counter())
        grads, self._grad_flag = self._grad_flag, None
        if not window.mode_set:
            self._direct = window.set_mode(loss)
            self._take = window.take
        try:
            if self._direct:
                value = host_value(loss)
                self.last_loss = value
                return self._read_now(step, value, grads)
            # One way: record -> collect the window in flight -> judge -> launch the next once
            # full (read at once: judge) -> the window settles on the verdict (in _judge).
            window.record(step, loss, grads)
            preempt = self._preempt_requested()
            agreed = window.collect()
            if agreed is not None and (action := self._judge(agreed, step)) is not StepAction.PROCEED:
                return action
            fresh = window.launch(step, self.step_times, self._t_last, preempt, save=self._save_wanted())
            if fresh is not None:
                return self._judge(fresh, step)
            if agreed is None and now >= self._beat_due:
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
        self._direct = self._window.settle(False)  # a judged replay returns to the configured mode
        self._plan(step)
        return action

    def _judge(self, window: Window, current: int, applied: bool = False) -> StepAction:
        """The verdict on an agreed window (`_evaluate`), then the loss window settles on it."""
        action = self._evaluate(window, current, applied)
        rejected = action is not StepAction.PROCEED
        if rejected:
            self._next_event = -1  # the next step resets ``restored`` and the mode
        self._direct = self._window.settle(rejected)  # a rejected window's steps replay anyway
        return action

    def _evaluate(self, window: Window, current: int, applied: bool = False) -> StepAction:
        """Act on the agreed numbers of ``window``; ``current`` is the step in progress (its
        update not applied yet, unless ``applied``: a flush at a boundary). Applied updates can
        be rolled back (or stopped on), not skipped. The first verdict that is not "proceed"
        ends it."""
        if window.preempt:
            self._preempt_agreed, self._boundary_at = True, 0
        # A request from before the last save (every rank saved since its window was launched)
        # has been served already.
        if window.save and (self._last_saved is None or window.steps[-1] + 1 > self._last_saved):
            self._save_agreed, self._boundary_at = True, 0
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
                return action
        # One heartbeat per window at most, for its last step, with its slowest step and longest
        # wait; a window with a step slower than the heartbeat interval is always reported (a
        # straggler is news, and slow steps leave few heartbeats anyway).
        slowest = max(window.step_times)
        if time.perf_counter() >= self._beat_due or slowest >= self.config.heartbeat_interval_s:
            last = len(window.steps) - 1
            wait = max(window.waits) if window.waits is not None else None
            self._hb_beat(window.steps[last], window.losses[last], slowest, wait)
        return StepAction.PROCEED

    def _flush(self, step: int) -> int | None:
        """Check every recorded step now (before a checkpoint or the end): a checkpoint must
        never hold an update that was not checked. Returns the step to continue from after a
        rollback, else None. Collective: every rank flushes at the same boundaries."""
        window = self._window
        if not window.pending:
            return None
        preempt = self._preempt_requested()
        agreed = window.collect(fit=False)
        if agreed is not None and self._judge(agreed, step, applied=True) is StepAction.ROLLBACK:
            return self._after_rollback(step)
        agreed = window.launch(
            step, self.step_times, self._t_last, preempt, now=True, save=self._save_wanted()
        )
        if agreed is not None and self._judge(agreed, step, applied=True) is StepAction.ROLLBACK:
            return self._after_rollback(step)
        self._plan(step)
        return None

    def _pending(self) -> bool:
        return self._window.pending

    def _plan(self, step: int) -> None:
        """The next step that cannot take the common path of ``step``."""
        nxt = self._window.next_step(step)
        if self._chaos_next is not None:
            nxt = min(nxt, self._chaos_next)
        if self.balancer is not None:
            nxt = min(nxt, self.balancer.next_step)
        self._next_event = nxt if self._window.mode_set and not self._rolled_back else -1

    def _after_rollback(self, step: int) -> int:
        self._rolled_back, self.restored = False, True
        return self.resume_step if self.resume_step is not None else step + 1

    def _preempt_requested(self) -> bool:
        return self._preempt is not None and self._preempt.requested is not None

    def _save_wanted(self) -> bool:
        return self._requests is not None and self._requests.pending

    def _lane_refill(self, value: float | None) -> bool:
        """The lane ran out or ``value`` left it: the monitor judges ``value``; a new lane follows
        a clean one (after an unclean one, ``_decide`` runs and the monitor's state may change)."""
        clean = self.monitor.clean(value)
        self._lane_bound, self._lane_n = self.monitor.lane() if clean else (-math.inf, 0)
        return clean

    def _measured(self) -> int:
        """For the balancer's hooks: the steps recorded so far."""
        return self._n_steps

    def _on_signal(self, signum: int) -> None:
        if self.world_size == 1:
            self._preempt_agreed, self._boundary_at = True, 0  # the next boundary saves and exits

    def _give_up(self, waited: float) -> str | None:
        """For the preemption watch thread, ``waited`` seconds after a preemption signal: why the
        step boundary will not come, or None while it can. No step for ``preempt_wait_s`` (or 3x
        the slowest step): the rank is blocked, in a collective whose peer is gone as a rule, and
        holding it only makes the launcher wait out its grace period. Steps but no boundary
        within two windows and their lag: the loop has none (no ``guard.range``/``end_step``)."""
        t_last, n, slowest = self._progress()
        if self._n_at_signal is None:
            self._n_at_signal = n
        quiet = time.perf_counter() - t_last
        wait = max(self.config.preempt_wait_s, 3 * slowest)
        if waited >= wait and quiet >= wait:
            return f"no step for {quiet:.1f}s: blocked (in a collective whose peer is gone?), no step boundary will come"
        if n - self._n_at_signal > 2 * self.check_every + self.check_lag + 2:
            return f"{n - self._n_at_signal} steps and no step boundary (the loop calls neither guard.range nor guard.end_step)"
        return None

    def _progress(self) -> tuple[float, int, float]:
        """For the watchdog thread: (perf_counter of the last step, steps, slowest step).
        The first step is not learned from: it pays warm-up that later steps never do."""
        times = tuple(self.step_times)  # one C call under the GIL: a consistent copy
        if self._n_steps == len(times):
            times = times[1:]
        return self._t_last, self._n_steps, max(times, default=0.0)

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
        self._lane_n = 0  # the monitor's state may change: the next clean step asks again
        decision = self.monitor.observe(step, value, grads_finite=not grads_bad, time=time.time())
        for finding in decision.findings:
            nonfinite = finding.rule.startswith("numerics.nonfinite")
            self._report(with_sources(finding, sources) if nonfinite else finding, step)
        action = decision.action
        if action is Policy.STOP:
            log.error("numerics stop at step %d: %s", step, decision.findings[0].reason)
            self._beat(current, value, dt, "exit", force=True)
            raise SystemExit(WorkerExit.NUMERICS_STOP)
        if action is Policy.ROLLBACK:
            if self._rollback(current):
                self.monitor.rolled_back(decision.check)
                return StepAction.ROLLBACK
            action = Policy.SKIP
        if action is Policy.SKIP:
            if step != current or applied:
                if any(f.rule.startswith("numerics.nonfinite") for f in decision.findings):
                    self._poisoned(step, current, applied, value, dt, sources)
                log.warning(
                    "step %d: cannot skip an update applied %d step(s) ago (check_lag/check_every); "
                    "use on_nan/on_spike='skip' for exact skips",
                    step,
                    current - step + int(applied),
                )
                return StepAction.PROCEED
            self._zero_grad()
            return StepAction.SKIP
        return StepAction.PROCEED

    def _poisoned(
        self, step: int, current: int, applied: bool, value: float | None, dt: float, sources: tuple[int, ...]
    ) -> None:
        """A non-finite update is in the weights and there is no checkpoint to roll back to:
        every later step would train a NaN model, so the run stops (as under ``on_nan="stop"``).
        Every rank reads the same window, so every rank stops at the same step."""
        ago = current - step + int(applied)
        finding = Finding(
            "numerics.unrecoverable",
            Health.FAILED,
            Advice.RESTART_APP,
            f"step {step}: a non-finite update was applied {ago} step(s) before it was checked and there "
            "is no checkpoint to roll back to; stopping rather than training a NaN model",
            time=time.time(),
            category=Category.NUMERICS,
        )
        finding = with_sources(finding, sources)
        self._report(finding, step)
        log.error(
            "rank %d: %s (save a checkpoint before training, or use check_every=1, check_lag=0 to "
            "drop such updates before they are applied)",
            self.rank,
            finding.reason,
        )
        self._beat(current, value, dt, "exit", force=True)
        raise SystemExit(WorkerExit.NUMERICS_STOP)

    def _apply_chaos(self, step: int, loss: Any) -> Any:
        if self._chaos is not None:
            if self._chaos.at_step(step):
                loss = self._poison_now(loss)
            self._chaos_next = self._chaos.next_step
        return loss

    def end_step(self, step: int) -> int:
        """The boundary after ``step`` (its update applied): save if due, honour preemption.
        Returns the next step (``resume_step`` after a rollback). ``range`` calls it for you."""
        done = step + 1
        if done < self._boundary_at:  # nothing due: no checkpoint, no preemption, no rollback
            return done
        return self._boundary(step)

    def _boundary(self, step: int) -> int:
        nxt = self._boundary_work(step)
        self._plan_boundary(nxt)
        return nxt

    def _boundary_work(self, step: int) -> int:
        if self._rolled_back:
            return self._after_rollback(step)
        done = step + 1
        if self._requests is not None and self._requests.look(done) and self.world_size == 1:
            self._save_agreed = True  # one rank: nothing to agree on
        every = self.config.checkpoint_every
        due = every and done % every == 0 and self.checkpointer is not None
        if not (due or self._preempt_agreed or self._save_agreed):
            return done
        resumed = self._flush(step)
        if resumed is not None:
            return resumed
        if self._preempt_agreed:
            self._preempted(done)
        if self._save_agreed and self._requests is not None:
            log.info("step %d: checkpoint the supervisor asked for (%s)", done, self._requests.reason)
        if due or self._save_agreed:
            self.save(done)
        return done

    def _plan_boundary(self, nxt: int) -> None:
        """The first ``step + 1`` from which ``end_step`` has work, given the next step ``nxt``
        (a preemption signal or a rollback resets it to 0)."""
        if self._preempt_agreed or self._rolled_back or self._save_agreed:
            self._boundary_at = 0
            return
        at = 1 << 62
        if (every := self.config.checkpoint_every) and self.checkpointer is not None:
            at = (nxt // every + 1) * every
        if self._requests is not None:  # the next look at the supervisor's control file
            at = min(at, (nxt // self._requests.every + 1) * self._requests.every)
        self._boundary_at = at

    def loss(self, loss: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """Optional hook before backward: a chaos "nan" fault poisons the loss here, so NaN flows
        through backward and the gradient all-reduce exactly as a real fault's would."""
        if self._chaos is not None and self._chaos_next is not None:
            at = step if step is not None else (self.last_step + 1 if self.last_step is not None else 0)
            if at >= self._chaos_next and self._chaos.take_nan(at):
                self._chaos_next = self._chaos.next_step
                return poison(loss)
        return loss

    def check_grads(self, model_or_params: torch.nn.Module | Iterable[torch.nn.Parameter]) -> None:
        """Opt-in: include NaN/Inf in the gradients in this step's check (one fused kernel, no sync)."""
        params = (
            model_or_params.parameters() if isinstance(model_or_params, torch.nn.Module) else model_or_params
        )
        self._grad_flag = nonfinite_grads(params)
        self._next_event = -1  # the flag is read on the slow path

    def save(self, step: int, wait: bool = False) -> None:
        """Checkpoint ``state`` as of ``step`` completed steps (a heartbeat phase and watchdog allowance).
        Steps not yet checked are checked first; if that rolls back, nothing is saved."""
        if self.checkpointer is None:
            return
        if self._pending() and self._flush(step - 1) is not None:
            return
        # Heartbeat steps are step indices, ``step`` here counts completed steps: hence - 1.
        self._beat(max(step - 1, 0), self.last_loss, None, "checkpoint", force=True)
        if self._watchdog is not None:
            with self._watchdog.allowance(self.config.checkpoint_s):
                self._save(step, wait)
        else:
            self._save(step, wait)
        self._last_saved = step
        if self._requests is not None:  # this save serves the requests written so far
            self._requests.served_now()
        self._save_agreed = False

    # -- internals -----------------------------------------------------------------------------
    def _save(self, step: int, wait: bool) -> None:
        assert self.checkpointer is not None
        self.checkpointer.save(step, self.state)
        if wait:
            self.checkpointer.wait()

    def _preempted(self, done: int) -> None:
        requested = self._preempt.requested if self._preempt else None
        if self._preempt is not None:
            self._preempt.reached()  # the boundary came: the save is the hang watchdog's to time
        log.warning("preempted (signal %s): saving step %d and exiting", requested, done)
        if self.checkpointer is not None and self._last_saved != done:
            self.save(done, wait=True)
        self._beat(done - 1, self.last_loss, None, "exit", force=True)
        raise SystemExit(WorkerExit.PREEMPTED)

    def _rollback(self, step: int) -> bool:
        if self.checkpointer is None or self.state is None:
            log.warning("step %d: rollback asked but there is no checkpointer/state", step)
            return False
        restore = getattr(self.checkpointer, "rollback", None)
        if restore is None:  # a checkpointer without rollback(): wait, then resume
            self.checkpointer.wait()
            restore = self.checkpointer.resume
        self._beat(step, self.last_loss, None, "checkpoint", force=True)
        if self._watchdog is not None:
            with self._watchdog.allowance(self.config.checkpoint_s):
                resumed = int(restore(self.state) or 0)
        else:
            resumed = int(restore(self.state) or 0)
        if resumed <= 0 or resumed > step:
            log.warning("step %d: no checkpoint to roll back to", step)
            return False
        self._zero_grad()
        self.resume_step, self._rolled_back = resumed, True
        self._boundary_at = 0
        reason = f"rolled back from step {step} to the checkpoint of step {resumed}"
        self._report(
            Finding(
                "numerics.rollback",
                Health.OK,
                Advice.NONE,
                reason,
                time=time.time(),
                category=Category.NUMERICS,
            ),
            step,
        )
        return True

    def _poison_now(self, loss: Any) -> Any:
        # Without Guard.loss the fault hits at the boundary: the loss and this rank's gradients
        # become NaN, which is what a NaN loss before backward would have left behind.
        if self.state is not None and getattr(self.state, "model", None) is not None:
            with torch.no_grad():
                for p in self.state.model.parameters():
                    if p.grad is not None:
                        p.grad.fill_(float("nan"))
        return poison(loss) if isinstance(loss, torch.Tensor) else float("nan")

    def _zero_grad(self) -> None:
        optimizer = getattr(self.state, "optimizer", None) if self.state is not None else None
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)

    def _report(self, finding: Finding, step: int) -> None:
        self.findings.append(finding)
        log.warning("rank %d: %s", self.rank, finding.reason)
        if self.run_dir is not None:
            rundir.append_finding(self.run_dir, self.rank, finding, step)

    def _beat(
        self,
        step: int,
        loss: float | None,
        dt: float | None,
        phase: str,
        force: bool = False,
        wait: float | None = None,
    ) -> None:
        if self._hb is None:
            return
        now = time.perf_counter()
        interval = self.config.heartbeat_interval_s
        if force or phase != self._phase or now - self._last_beat >= interval:
            self._hb.beat(step, loss, dt, phase, wait=wait)
            self._last_beat, self._phase = now, phase
            # After another phase the next step beats at once (the supervisor sees training resume).
            self._beat_due = now + interval if phase == "train" else 0.0

    def _hb_beat(self, step: int, loss: float | None, dt: float | None, wait: float | None) -> None:
        self._beat(step, loss, dt, "train", force=True, wait=wait)

    def _on_hang(self, reason: str) -> None:
        assert self._watchdog is not None
        paths = self._watchdog.dump(reason)
        evidence = tuple(str(p) for p in paths)
        finding = Finding(
            "hang.watchdog",
            Health.DEGRADED,
            Advice.RESTART_APP,
            reason,
            time=time.time(),
            category=Category.NCCL_TIMEOUT_HANG,
            evidence=evidence,
        )
        self._report(finding, self.last_step or 0)
        if self._hb is not None:
            self._hb.beat(self.last_step or 0, self.last_loss, None, "exit")
        os._exit(WorkerExit.HANG)
