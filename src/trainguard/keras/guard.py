"""The Keras Guard: a callback that gives ``model.fit`` what the torch Guard gives a torch loop.

Inside the trainer, at every batch boundary of ``fit``: heartbeats and findings into the run
directory (`trainguard.keras.report`), NaN/Inf and loss spikes judged by the shared
``detect.numerics`` policy (a bad step rolls the model back to its last good checkpoint),
verified atomic checkpoints every ``checkpoint_every`` steps (`trainguard.keras.checkpoint`), an
exact resume, and an immediate save when the supervisor asks for one (``control.json``, looked at
every ``control_every`` steps: a GPU the node agent marked degraded) or a stop signal arrives
(then exit ``WorkerExit.PREEMPTED``: the supervisor's stop with ``--kill-grace`` sends one)::

    guard = Guard("ckpt/", checkpoint_every=50)
    model.compile(...)
    data = guard.resume(model, data)             # state and RNG back; the data skips what was trained
    model.fit(data, epochs=E, steps_per_epoch=S, callbacks=[guard])

Steps are the unit: ``data`` is one repeated stream (``.repeat()``, ``steps_per_epoch``), the
Guard counts the batches taken from it (``position``) and the optimizer steps applied (``step``;
smaller after a rollback: in ``fit`` the data moves on), and ends ``fit`` when the stream's
``epochs * steps_per_epoch`` batches are trained, whichever epoch Keras counts. Keras's epochs
restart at ``position // steps_per_epoch`` after a resume.

In ``fit`` an update is applied before any callback sees its loss, so a bad step cannot be
skipped, only rolled back (or stopped on). Keras reports a running mean of the loss over the
epoch; the Guard recovers each batch's loss from it (`batch_loss`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np

from trainguard import rundir
from trainguard.actions import Advice
from trainguard.chaos.inject import Chaos
from trainguard.control import SaveRequests
from trainguard.detect.numerics import NumericsMonitor, Policy, SpikeConfig, with_sources
from trainguard.keras.checkpoint import Checkpointer, Progress
from trainguard.keras.report import Reporter, rank_from_env
from trainguard.records import Category, Finding, Health
from trainguard.rundir import WorkerExit

__all__ = ["Guard", "GuardLogic", "batch_loss"]

log = logging.getLogger(__name__)


def batch_loss(mean: float, mean_before: float | None, done: int, done_before: int) -> float:
    """One batch's loss (or the mean of the last ``done - done_before`` batches) from Keras's
    running means over ``done`` and ``done_before`` batches of the epoch.

    >>> batch_loss(2.0, 1.0, 2, 1)      # batches 1.0 then 3.0
    3.0
    """
    if mean_before is None or done_before <= 0:
        return mean
    return (mean * done - mean_before * done_before) / (done - done_before)


class GuardLogic:
    """What a Guard does at ``fit``'s hooks, for either Keras: `Guard` (Keras 3) and
    ``trainguard.keras.legacy.Guard`` (Keras 2, ``tf_keras``) add the Callback base of theirs and
    say how ``fit`` starts mid-stream (`_start_at`)."""

    model: Any  # set by Keras (Callback.set_model)
    params: dict[str, Any]  # set by Keras (Callback.set_params)

    def __init__(
        self,
        directory: str | Path,
        checkpoint_every: int = 100,  # optimizer steps between checkpoints (0: at the end only)
        keep_last: int = 3,  # checkpoints kept (and every milestone_every-th)
        milestone_every: int = 0,
        on_nan: Policy | str = Policy.ROLLBACK,  # rollback | stop | warn
        on_spike: Policy | str = Policy.ROLLBACK,
        spike: SpikeConfig | None = None,
        save_at_end: bool = True,
        heartbeat_interval_s: float = 0.25,
        run_dir: str | Path | None = None,  # default: $TRAINGUARD_RUN_DIR, else no files
        rank: int | None = None,  # default: TF_CONFIG's task, else $RANK, else 0
        attempt: int | None = None,  # default: $TRAINGUARD_ATTEMPT
        chaos: bool = True,  # apply the supervisor's chaos.json
        control_every: int = 10,  # look for the supervisor's checkpoint requests every N steps (0: never)
        preempt_signals: tuple[int, ...] = (signal.SIGTERM,),
    ) -> None:
        self.checkpointer = Checkpointer(directory, keep_last, milestone_every)
        self.checkpoint_every, self.save_at_end = checkpoint_every, save_at_end
        env_rank, self.world_size = rank_from_env()
        self.rank = env_rank if rank is None else rank
        attempt = int(os.environ.get(rundir.ATTEMPT_ENV, "0")) if attempt is None else attempt
        where = Path(run_dir) if run_dir is not None else rundir.run_dir_from_env()
        self.reporter = Reporter(where, self.rank, attempt, heartbeat_interval_s)
        named = os.environ.get("TRAINGUARD_GPU", "")
        self.gpu = int(named) if named.isdigit() else None
        self.monitor = NumericsMonitor(on_nan, on_spike, spike, gpu=self.gpu)
        self.chaos = Chaos(where, self.rank) if chaos and where is not None else None
        self.requests = (
            SaveRequests(where, control_every, attempt) if control_every and where is not None else None
        )
        self.preempt_signals = tuple(preempt_signals)
        self.progress = Progress()
        self.resumed: Progress | None = None  # what resume() restored (None: a fresh start)
        self.findings: list[Finding] = []
        self.last_loss: float | None = None
        self._resume_called = False
        self._last_saved: int | None = None
        self._mean: tuple[float, int] | None = None  # (running mean, batches) at the last batch end
        self._base: int | None = None  # Keras's index of the first batch in its running mean
        self._t_last = 0.0
        self._signalled: int | None = None
        self._previous: dict[int, Any] = {}

    # -- before fit ----------------------------------------------------------------------------
    def resume(self, model: Any, data: Any = None) -> Any:
        """Restore ``model`` (compiled) from the newest valid checkpoint, if any; returns ``data``
        with the batches already trained skipped (``data.skip(position)``), or the step when no
        data is given. Call it on every rank, before ``fit``."""
        self._resume_called = True
        self.resumed = self.checkpointer.resume(model)
        self.progress = self.resumed or Progress()
        self._last_saved = self.progress.step if self.resumed is not None else None
        if data is None:
            return self.progress.step
        return data.skip(self.progress.position) if self.progress.position else data

    @property
    def step(self) -> int:
        """Optimizer steps applied."""
        return self.progress.step

    @property
    def position(self) -> int:
        """Batches taken from the data stream."""
        return self.progress.position

    # -- fit's hooks ---------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self._resume_called:
            log.warning("Guard.resume(model, data) was not called before fit: starting from step 0")
            self._resume_called = True
        steps = self.params.get("steps")
        if steps and self.progress.position:
            self._start_at(self.progress.position, int(steps))
        self.reporter.open()
        self._install_signals()
        self.reporter.beat(self.progress.step, None, None, "init")
        self._t_last = time.perf_counter()

    def _start_at(self, position: int, steps_per_epoch: int) -> None:
        """Have ``fit`` start at batch ``position`` of the stream (its epochs count from 0)."""
        raise NotImplementedError

    def _fit_ended(self) -> None:
        """Undo `_start_at`: a later ``fit`` starts where it is told."""

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._mean, self._base = None, None  # Keras resets its loss tracker here

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._base is None:  # the epoch's first batch (not 0 where Keras starts mid-epoch)
            self._base = batch
        self.reporter.step = self.progress.step
        chaos, step = self.chaos, self.progress.step
        due = chaos is not None and chaos.next_step is not None and step >= chaos.next_step
        if due and chaos is not None and chaos.at_step(step):
            self._poison()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        done = batch + 1 - (self._base or 0)  # batches in Keras's running mean
        before = self._mean[1] if self._mean is not None else 0
        n = max(done - before, 1)
        dt = (now - self._t_last) / n
        self._t_last = now
        loss = self._loss(logs, done)
        p = self.progress
        self.progress = Progress(p.step + n, p.position + n, p.epoch)
        index = self.progress.step - 1
        self.reporter.beat(index, loss, dt)
        if loss is not None and not self.monitor.clean(loss):
            self._numerics(index, loss, dt)
        self._boundary(n)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        p = self.progress
        self.progress = Progress(p.step, p.position, epoch + 1)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        try:
            if self.save_at_end and self._last_saved != self.progress.step and self.progress.step:
                self._save()
        finally:
            self._fit_ended()
            self._restore_signals()
            self.reporter.close(max(self.progress.step - 1, 0), self.last_loss)

    # -- the boundary --------------------------------------------------------------------------
    def _boundary(self, n: int) -> None:
        """After ``n`` more steps: a stop signal, the supervisor's request, a periodic save."""
        p = self.progress
        if self._signalled is not None:
            self._preempted()
        every = self.checkpoint_every
        due = every and p.step % every == 0
        r = self.requests
        asked = (
            r is not None
            and p.step // r.every != (p.step - n) // r.every
            and r.look(p.step - p.step % r.every)
        )
        if asked and not due and r is not None:
            log.info("step %d: checkpoint the supervisor asked for (%s)", p.step, r.reason)
            due = True
        if due and self._last_saved != p.step:
            self._save()
        total = self._total()
        if total is not None and p.position >= total:
            self.model.stop_training = True  # the stream's last batch is trained

    def _total(self) -> int | None:
        steps, epochs = self.params.get("steps"), self.params.get("epochs")
        return int(steps) * int(epochs) if steps and epochs else None

    def _save(self) -> None:
        p = self.progress
        self.reporter.beat(max(p.step - 1, 0), self.last_loss, None, "checkpoint")
        if self.rank == 0:  # replicas hold the same state: the chief writes it
            self.checkpointer.save(self.model, p)
        if self.requests is not None:  # this save serves the requests written so far
            self.requests.served_now()
        self._last_saved = p.step
        self._t_last = time.perf_counter()  # a save is not a slow step

    def _preempted(self) -> None:
        log.warning("signal %s: saving step %d and exiting", self._signalled, self.progress.step)
        if self._last_saved != self.progress.step:
            self._save()
        self.reporter.close(max(self.progress.step - 1, 0), self.last_loss)
        raise SystemExit(WorkerExit.PREEMPTED)

    # -- numerics ------------------------------------------------------------------------------
    def _loss(self, logs: dict[str, Any] | None, done: int) -> float | None:
        value = (logs or {}).get("loss")
        try:
            mean = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        before = self._mean
        self._mean = (mean, done)
        if before is not None and not math.isfinite(before[0]):
            loss = mean  # the mean holds an earlier non-finite batch: it says nothing new
        else:
            loss = batch_loss(mean, before[0] if before else None, done, before[1] if before else 0)
        self.last_loss = loss
        return loss

    def _numerics(self, index: int, loss: float, dt: float) -> None:
        ruling = self.monitor.observe(index, loss, time=time.time())
        sources = (self.rank,) if not math.isfinite(loss) else ()
        for finding in ruling.findings:
            nonfinite = finding.rule.startswith("numerics.nonfinite")
            self._report(with_sources(finding, sources) if nonfinite else finding, index)
        action = ruling.action
        if action is Policy.STOP:
            self._stop(index, f"numerics stop at step {index}: {ruling.findings[0].reason}")
        if action in (Policy.ROLLBACK, Policy.SKIP) and not self._rollback(index):
            if not math.isfinite(loss):
                self._stop(
                    index,
                    f"step {index}: a non-finite update is in the weights and there is no checkpoint "
                    "to roll back to; stopping rather than training a NaN model",
                    unrecoverable=True,
                )
            log.warning("step %d: no checkpoint to roll back to; training on", index)

    def _rollback(self, index: int) -> bool:
        self.reporter.beat(index, self.last_loss, None, "checkpoint")
        restored = self.checkpointer.resume(self.model, max_step=index)
        if restored is None:
            return False
        self.model.reset_metrics()  # Keras's running mean holds the bad batch
        self._mean, self._base = None, (self._base or 0) + (self._mean[1] if self._mean else 0)
        self.progress = Progress(restored.step, self.progress.position, self.progress.epoch)
        self._last_saved = restored.step
        reason = (
            f"rolled back from step {index} to the checkpoint of step {restored.step}; "
            f"the data goes on from batch {self.progress.position}"
        )
        self._report(Finding("numerics.rollback", Health.OK, Advice.NONE, reason, self.gpu, time.time(),
                             Category.NUMERICS), index)  # fmt: skip
        self._t_last = time.perf_counter()
        return True

    def _stop(self, index: int, reason: str, unrecoverable: bool = False) -> None:
        if unrecoverable:
            finding = Finding("numerics.unrecoverable", Health.FAILED, Advice.RESTART_APP, reason, self.gpu,
                              time.time(), Category.NUMERICS)  # fmt: skip
            self._report(with_sources(finding, (self.rank,)), index)
        log.error("rank %d: %s", self.rank, reason)
        self.reporter.close(index, self.last_loss)
        raise SystemExit(WorkerExit.NUMERICS_STOP)

    def _report(self, finding: Finding, step: int) -> None:
        self.findings.append(finding)
        self.reporter.finding(finding, step)

    def _poison(self) -> None:
        """A chaos "nan": one weight becomes NaN before the step, as a corrupted value would make
        it; the step's loss, gradients and update are then NaN as a real fault's are."""
        weights = self.model.trainable_variables
        if weights:
            v = weights[0]
            value = np.array(v.numpy())
            value.reshape(-1)[0] = float("nan")
            v.assign(value)

    # -- signals -------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.preempt_signals:
            previous = signal.getsignal(sig)
            if previous is None:  # installed from C: leave it alone
                continue
            self._previous[sig] = previous
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signalled = signum  # acted on at the next batch boundary

    def _restore_signals(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


class Guard(GuardLogic, keras.callbacks.Callback):
    """Heartbeats, numerics, checkpoints, exact resume and preemption for one Keras 3 rank (see
    the module docstring; the settings are `GuardLogic`'s)."""

    def __init__(self, directory: str | Path, **settings: Any) -> None:
        keras.callbacks.Callback.__init__(self)
        GuardLogic.__init__(self, directory, **settings)

    def _start_at(self, position: int, steps_per_epoch: int) -> None:
        # Keras 3 starts only at an epoch: it counts that epoch from here, the Guard ends fit
        # once the stream's last batch is trained. BackupAndRestore sets the same attribute.
        self.model._initial_epoch = position // steps_per_epoch

    def _fit_ended(self) -> None:
        self.model._initial_epoch = None
