"""Preemption signals: remember that one arrived, act at the next step boundary, and never hold
a rank that cannot reach one.

Part of the Guard (``trainguard.torch.guard``). A handler must not save a checkpoint itself (it
runs between two bytecodes of the training step, possibly inside a collective), so it only sets a
flag; the Guard saves and exits with ``WorkerExit.PREEMPTED`` at the next step boundary. With
several ranks the Guard first agrees on the flag, so every rank saves at the same step. A second
signal while the first is pending ends the process at once (the default action of that signal).

A rank blocked in a collective whose peer died never reaches the boundary, and while it waits
in C++ Python does not even run its handler: a launcher that stops the job with SIGTERM (torchrun
after one rank failed) would wait out its whole grace period for it. So the signal is also
watched from a thread, through Python's wakeup file descriptor (written by the C-level handler
whatever the main thread is doing): from the moment it arrives, ``give_up`` is asked every
``poll_s`` whether the boundary can still come, and when it says no, the process dies of the
signal as if it had never been caught. `reached` ends the watch (the Guard is saving).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType

from trainguard.procs import die_of, install

log = logging.getLogger(__name__)

GiveUp = Callable[[float], str | None]  # seconds since the signal -> why no boundary comes, or None


class PreemptionHandler:
    """Installs handlers for ``signals`` (SIGTERM by default) until ``close()``."""

    def __init__(
        self,
        signals: Iterable[int | signal.Signals] = (signal.SIGTERM,),
        on_request: Callable[[int], None] | None = None,  # called in the handler: set flags only
        give_up: GiveUp | None = None,  # asked from the watch thread; None: wait for the boundary
        poll_s: float = 0.1,
    ) -> None:
        self.requested: int | None = None  # the signal number that asked us to stop
        self._on_request = on_request
        self._give_up, self._poll_s = give_up, poll_s
        self._signals = frozenset(int(s) for s in signals)
        self._reached = threading.Event()  # the boundary came (or the handler closed)
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None  # the watch
        self._chained = -1  # the wakeup fd that was set before ours (bytes are passed on to it)
        if threading.current_thread() is not threading.main_thread():
            log.warning("Guard created off the main thread: preemption signals are not handled")
        self._restore = install(self._signals, self._handle, take_foreign=True)
        if give_up is not None and threading.current_thread() is threading.main_thread():
            self._watch()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:
            # A second notice: the step boundary is not coming (stuck in a collective?). Die of
            # the signal as if we had never caught it, like a second Ctrl-C.
            log.warning("received %s again: exiting now", _name(signum))
            die_of(signum)
            return
        # Set before the log line: a second signal that lands once the line is out (a launcher
        # that reads it) runs this handler again, nested, and must find the first one recorded.
        self.requested = signum
        log.warning("received %s: will checkpoint and exit at the next step boundary", _name(signum))
        if self._on_request is not None:
            self._on_request(signum)

    def reached(self) -> None:
        """The step boundary came: the Guard saves and exits; stop watching."""
        self._reached.set()

    def close(self) -> None:
        self._reached.set()
        self._restore()
        if self._pipe is not None:
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(self._chained)
            with contextlib.suppress(OSError):  # the watch thread reads EOF and closes its end
                os.close(self._pipe[1])
            self._pipe = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)  # it ends at once now: the Guard leaves nothing running
            self._thread = None

    # -- the watch -----------------------------------------------------------------------------
    def _watch(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._chained = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError) as exc:
            log.debug("no wakeup fd for the preemption watch: %s", exc)
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._thread = threading.Thread(target=self._wait, args=(r,), name="preemption-watch", daemon=True)
        self._thread.start()

    def _wait(self, r: int) -> None:
        try:  # the read end stays open while the wakeup fd may still be written (no EPIPE)
            self._wait_for_boundary(self._next_signal(r))
        finally:
            os.close(r)

    def _wait_for_boundary(self, signum: int | None) -> None:
        if signum is None or self._give_up is None:
            return
        since = time.monotonic()
        while not self._reached.wait(self._poll_s):
            why = self._give_up(time.monotonic() - since)
            if why is not None and not self._reached.is_set():
                log.warning("%s: %s; exiting now", _name(signum), why)
                die_of(signum)
                return

    def _next_signal(self, r: int) -> int | None:
        """Block until one of our signals is written to the wakeup fd (None: closed)."""
        while not self._reached.is_set():
            try:
                data = os.read(r, 64)
            except OSError:
                return None
            if not data:
                return None
            if self._chained >= 0:  # whoever set a wakeup fd before us still gets its bytes
                with contextlib.suppress(OSError):
                    os.write(self._chained, data)
            for b in data:
                if b in self._signals:
                    return b
        return None


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
