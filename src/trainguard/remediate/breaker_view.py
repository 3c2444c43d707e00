"""The breaker's state for readers that must not wait on its file: /metrics, the agent's API and
its health.

The breaker file may live on a shared filesystem, and a hung NFS mount (or a FIFO in the file's
place) blocks ``open()`` and ``read()`` for as long as it hangs. So the readers here never touch
the file themselves: one reader thread at a time reads it (a hung read is never joined by a
second one), whoever may wait waits at most ``timeout_s`` for it, and the last state read whole
is served with its age and a staleness flag::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from trainguard.remediate.breaker import BreakerFile
    >>> view = BreakerView(BreakerFile(Path(tempfile.mkdtemp()) / "breaker.json"))
    >>> reading = view.read()  # a thread that may block (the agent's tick): waits <= timeout_s
    >>> reading.state.tripped, reading.stale
    (None, False)

While a read hangs past ``timeout_s`` (or the file cannot be parsed) the reading is stale and
``problem`` says why: the agent reports itself degraded with it (agent/assemble.py). The acting
path (``Remediator``) still reads the file under its lock on its own worker thread: an action
waits for the breaker, never decides without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from trainguard.errors import StoreError
from trainguard.remediate.breaker import BreakerFile, BreakerState

__all__ = ["BreakerReading", "BreakerView", "SingleFlight"]

READ_TIMEOUT_S = 1.0  # how long a reader that may wait waits for the breaker file

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Calls that may hang, each on a thread of its own, never two at once: while one is in
    flight, ``start`` hands back its future instead of starting another, so a hung filesystem
    costs one thread, not one per request."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self._clock = name, clock
        self._lock = threading.Lock()
        self._future: Future[T] | None = None
        self._started = 0.0

    def start(self, fn: Callable[[], T]) -> tuple[Future[T], bool]:
        """(the call's future, True) for a call started now; (the one in flight, False)."""
        with self._lock:
            if self._future is not None and not self._future.done():
                return self._future, False
            future: Future[T] = Future()
            self._future, self._started = future, self._clock()
        threading.Thread(target=_run, args=(fn, future), name=self.name, daemon=True).start()
        return future, True

    def in_flight(self) -> Future[T] | None:
        """The call in flight, if one is."""
        with self._lock:
            return self._future if self._future is not None and not self._future.done() else None

    def in_flight_s(self) -> float | None:
        """How long the call in flight has run; None when none is."""
        with self._lock:
            if self._future is None or self._future.done():
                return None
            return self._clock() - self._started


def _run(fn: Callable[[], T], future: Future[T]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn())
    except BaseException as exc:  # handed to whoever waits on the future
        future.set_exception(exc)


@dataclass(frozen=True, slots=True)
class BreakerReading:
    state: BreakerState | None  # the last state read whole; None: none read yet
    age_s: float | None  # since that read finished
    error: str | None = None  # the latest read failed (the file unparsable): why
    hung_s: float = 0.0  # a read has been in flight this long, past the timeout (0: none hangs)

    @property
    def stale(self) -> bool:
        """The state served is not what the file says now (or may not be)."""
        return self.error is not None or self.hung_s > 0


class BreakerView:
    """The breaker's last state read whole, refreshed by one reader thread at a time."""

    def __init__(
        self,
        breaker: BreakerFile,
        timeout_s: float = READ_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.breaker, self.timeout_s, self._clock = breaker, timeout_s, clock
        self._reads: SingleFlight[BreakerState] = SingleFlight("trainguard-breaker-read", clock)
        self._lock = threading.Lock()
        self._state: BreakerState | None = None
        self._read_at: float | None = None
        self._error: str | None = None
        self._gave_up = False  # a reader stopped waiting for the read in flight

    def refresh(self) -> Future[BreakerState]:
        """A read of the file: the one in flight, or one started now. Never blocks."""
        future, started = self._reads.start(self._load)
        if started:
            with self._lock:
                self._gave_up = False
        return future

    def wait_s(self) -> float:
        """How long a reader should still wait for the read in flight (0: none, or it hangs)."""
        running = self._reads.in_flight_s()
        return 0.0 if running is None else max(0.0, self.timeout_s - running)

    def gave_up(self) -> None:
        """A reader waited ``timeout_s`` for the read in flight: it hangs."""
        with self._lock:
            self._gave_up = True

    def read(self) -> BreakerReading:
        """A fresh reading, waiting up to ``timeout_s``: for threads that may block, never the
        event loop (which awaits ``refresh()`` for ``wait_s()`` and then takes ``latest()``)."""
        future = self.refresh()
        try:
            future.result(self.wait_s())
        except TimeoutError:
            self.gave_up()
        except StoreError:
            pass  # kept as the reading's error
        return self.latest()

    def latest(self) -> BreakerReading:
        """What the last reads found; no I/O."""
        now = self._clock()
        running = self._reads.in_flight_s()
        with self._lock:
            hung = running is not None and (self._gave_up or running >= self.timeout_s)
            return BreakerReading(
                self._state,
                None if self._read_at is None else now - self._read_at,
                self._error,
                running if hung and running is not None else 0.0,
            )

    def problem(self) -> str | None:
        """Why the agent is degraded by its breaker file; None while it reads fine."""
        r = self.latest()
        served = "nothing read yet" if r.age_s is None else f"serving its state read {r.age_s:.0f} s ago"
        if r.hung_s > 0:
            return (
                f"breaker file {self.breaker.path}: a read has not returned for {r.hung_s:.0f} s "
                f"(a hung filesystem?); {served}"
            )
        if r.error is not None:
            return f"{r.error}; {served}"
        return None

    def _load(self) -> BreakerState:
        """On the reader thread: read the file, keep what came of it."""
        try:
            state = self.breaker.load()
        except StoreError as exc:
            with self._lock:
                self._error = str(exc)
            raise
        with self._lock:
            self._state, self._read_at, self._error = state, self._clock(), None
        return state
