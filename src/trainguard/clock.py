"""Clocks: every component that waits or timestamps takes one as a parameter.

The agent, the supervisor and the simulated fleet run on the real clock in production and on a
``VirtualClock`` in tests, scenarios and demos, where an hour of faults plays out in milliseconds::

    >>> clock = VirtualClock(start=100.0)
    >>> clock.sleep(2.5)          # returns at once, time moves on
    >>> clock.time()
    102.5
"""

from __future__ import annotations

import threading
import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "RealClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    """Something that tells the time (seconds) and can wait."""

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall-clock time (seconds since the epoch) and a real sleep."""

    def time(self) -> float:
        return _time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    def __repr__(self) -> str:
        return "RealClock()"


class VirtualClock:
    """A clock that only moves when told to: ``advance(s)``, or ``sleep(s)`` (which advances).

    Thread-safe, so a simulated fleet and an agent loop in another thread may share one.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (>= 0) and return the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance({seconds}))")
        with self._lock:
            self._now += seconds
            return self._now

    def advance_to(self, when: float) -> float:
        """Move time forward to ``when``; a time already passed leaves the clock where it is."""
        with self._lock:
            self._now = max(self._now, float(when))
            return self._now

    def sleep(self, seconds: float) -> None:
        # A virtual sleep is an advance: a loop that sleeps between ticks runs at full speed.
        if seconds > 0:
            self.advance(seconds)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.time()!r})"
