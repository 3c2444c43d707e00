"""Hang watchdog: a daemon thread that notices when no training step completes in time.

Part of the Guard (``trainguard.torch.guard``). The timeout is learned from the step times seen so
far, ``max(floor_s, factor * slowest step)``, with a longer allowance before the first step
(startup, compilation, data loading) and while a checkpoint is being taken. When it expires the
watchdog writes every thread's Python stack and the PyTorch flight-recorder trace into
``$TRAINGUARD_RUN_DIR/dumps/`` and ends the process with ``WorkerExit.HANG``: with ``os._exit``,
because the main thread is stuck (typically inside a collective that will never complete).

    >>> wd = HangWatchdog(dump_dir=None, rank=0, floor_s=30.0)
    >>> wd.timeout()
    600.0
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trainguard.rundir import WorkerExit

log = logging.getLogger(__name__)


Progress = Callable[[], tuple[float, int, float]]  # (perf_counter of the last step, steps, slowest)


class HangWatchdog:
    """``start()`` once; report progress with ``beat()`` after every step, or give ``progress``,
    a callable the watchdog thread polls (the Guard's: nothing at all runs per step).
    ``stop()`` disarms it. Times are ``clock()``'s (``time.perf_counter``: monotonic)."""

    def __init__(
        self,
        dump_dir: Path | None,
        rank: int,
        *,
        floor_s: float = 300.0,  # never declare a hang sooner than this
        factor: float = 10.0,  # ... nor sooner than this many times the slowest step seen
        first_step_s: float = 600.0,  # allowance until the first step completes
        on_hang: Callable[[str], None] | None = None,  # default: dump, then os._exit(HANG)
        poll_s: float | None = None,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.dump_dir, self.rank = dump_dir, rank
        self.floor_s, self.factor, self.first_step_s = floor_s, factor, first_step_s
        self._on_hang = on_hang
        self._progress = progress
        self._poll_s = poll_s if poll_s is not None else max(0.05, min(1.0, floor_s / 10))
        self._clock = clock
        self._last = clock()
        self._slowest = 0.0
        self._steps = 0
        self._extra = 0.0  # allowance of the phase in progress (checkpoint)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    def _state(self) -> tuple[float, int, float]:
        if self._progress is None:
            return self._last, self._steps, self._slowest
        last, steps, slowest = self._progress()
        return max(last, self._last), steps, slowest

    def timeout(self) -> float:
        _, steps, slowest = self._state()
        if steps == 0:
            return max(self.floor_s, self.first_step_s) + self._extra
        return max(self.floor_s, self.factor * slowest) + self._extra

    def beat(self, step_time: float | None = None) -> None:
        """A step completed (cheap: a few attribute writes, no lock)."""
        # The first step is not learned from: it includes warm-up that later steps never pay.
        if step_time is not None and self._steps > 0 and step_time > self._slowest:
            self._slowest = step_time
        self._steps += 1
        self._last = self._clock()

    @contextlib.contextmanager
    def allowance(self, seconds: float) -> Iterator[None]:
        """Extend the timeout while a known-slow phase (a checkpoint) runs."""
        self._extra += seconds
        try:
            yield
        finally:
            self._extra -= seconds
            self._last = self._clock()

    def start(self) -> HangWatchdog:
        if self._thread is None:
            self._last = self._clock()
            self._thread = threading.Thread(target=self._run, name="trainguard-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            idle = self._clock() - self._state()[0]
            limit = self.timeout()
            if idle > limit:
                self.fired = True
                reason = f"rank {self.rank}: no step completed for {idle:.1f}s (timeout {limit:.1f}s)"
                if self._on_hang is not None:
                    self._on_hang(reason)
                    return
                self.dump(reason)
                os._exit(WorkerExit.HANG)

    def dump(self, reason: str) -> list[Path]:
        """Write the stacks (and the flight-recorder trace when there is one); return the paths."""
        print(f"trainguard: hang detected, {reason}; dumping stacks", file=sys.stderr, flush=True)
        if self.dump_dir is None:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            return []
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        stem = self.dump_dir / f"rank{self.rank}-{int(time.time())}"
        written: list[Path] = []
        stacks = stem.with_suffix(".txt")
        with open(stacks, "w") as f:
            f.write(f"# {reason}\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()
            os.fsync(f.fileno())
        written.append(stacks)
        trace = flight_recorder_trace()
        if trace is not None:
            fr = stem.with_suffix(".fr.json")
            fr.write_bytes(trace)
            written.append(fr)
        log.error("hang dump written: %s", ", ".join(map(str, written)))
        return written


def flight_recorder_trace() -> bytes | None:
    """The c10d flight recorder's JSON trace (gloo and NCCL), or None without torch.distributed.

    Recent torch records every collective by default (``TORCH_FR_BUFFER_SIZE`` sizes the ring;
    older releases need ``TORCH_NCCL_TRACE_BUFFER_SIZE`` set before the process group starts).
    """
    if "torch" not in sys.modules:
        return None  # never import torch from a watchdog thread just to find nothing
    try:
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_fr_trace_json", None)
        if dump is not None:
            return bytes(dump())
        dump = getattr(c10d, "_dump_fr_trace", None)  # older torch: pickled
        if dump is not None:
            import json
            import pickle

            return json.dumps(pickle.loads(dump()), default=str).encode()
    except Exception as exc:  # a diagnostic must never mask the hang it reports
        log.warning("flight recorder dump failed: %s", exc)
    return None
