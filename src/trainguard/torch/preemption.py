"""Preemption signals: remember that one arrived, act at the next step boundary.

Part of the Guard (``trainguard.torch.guard``). A handler must not save a checkpoint itself (it
runs between two bytecodes of the training step, possibly inside a collective), so it only sets a
flag; the Guard saves and exits with ``WorkerExit.PREEMPTED`` at the next step boundary. With
several ranks the Guard first agrees on the flag, so every rank saves at the same step. A second
signal while the first is pending ends the process at once (the default action of that signal).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

from trainguard.procs import die_of, install

log = logging.getLogger(__name__)


class PreemptionHandler:
    """Installs handlers for ``signals`` (SIGTERM by default) until ``close()``."""

    def __init__(
        self,
        signals: Iterable[int | signal.Signals] = (signal.SIGTERM,),
        on_request: Callable[[int], None] | None = None,  # called in the handler: set flags only
    ) -> None:
        self.requested: int | None = None  # the signal number that asked us to stop
        self._on_request = on_request
        if threading.current_thread() is not threading.main_thread():
            log.warning("Guard created off the main thread: preemption signals are not handled")
        self._restore = install([int(s) for s in signals], self._handle, take_foreign=True)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            # A second notice: the step boundary is not coming (stuck in a collective?). Die of
            # the signal as if we had never caught it, like a second Ctrl-C.
            log.warning("received %s again: exiting now", _name(signum))
            die_of(signum)
            return
        log.warning("received %s: will checkpoint and exit at the next step boundary", _name(signum))
        self.requested = signum
        if self._on_request is not None:
            self._on_request(signum)

    def close(self) -> None:
        self._restore()


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
