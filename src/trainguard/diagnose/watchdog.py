"""Every test runs under a watchdog: a wedged GPU or a hung collective becomes a failed test.

The test runs in a daemon thread; past its deadline the caller gets ``timed_out`` and moves on.
The thread cannot be killed (a CUDA call stuck in the driver cannot be interrupted from Python);
it is abandoned, and the CLI leaves with ``os._exit`` so a stuck thread cannot hold the process.
``Watchdog`` keeps one worker thread for all the tests of a device (replaced only when one hangs):
torch's CPU thread pool belongs to the thread that calls it, and a fresh one per test costs more
than a small test itself on a busy host.

    >>> watch(lambda: 42, timeout_s=1.0).value
    42
    >>> import threading
    >>> watch(threading.Event().wait, timeout_s=0.05).timed_out
    True
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Outcome", "Watchdog", "watch"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    value: T | None = None
    error: BaseException | None = None
    timed_out: bool = False


def watch(fn: Callable[[], T], timeout_s: float, name: str = "diagnostic") -> Outcome[T]:
    """Run ``fn`` with a deadline; its value, its exception, or ``timed_out``."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller, who turns it into a failed test
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"trainguard-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return Outcome(timed_out=True)
    error = box.get("error")
    if isinstance(error, BaseException):
        return Outcome(error=error)
    return Outcome(value=box.get("value"))  # type: ignore[arg-type]


class Watchdog:
    """Runs jobs one after another on a long-lived daemon worker, each with a deadline.

    >>> dog = Watchdog("gpu0")
    >>> dog.run(lambda: 1 + 1, timeout_s=1.0).value
    2
    """

    def __init__(self, name: str = "diagnostic") -> None:
        self.name = name
        self._jobs: (
            queue.SimpleQueue[tuple[Callable[[], object], dict[str, object], threading.Event]] | None
        ) = None

    def _start(self) -> queue.SimpleQueue[tuple[Callable[[], object], dict[str, object], threading.Event]]:
        jobs: queue.SimpleQueue[tuple[Callable[[], object], dict[str, object], threading.Event]] = (
            queue.SimpleQueue()
        )

        def worker() -> None:
            while True:
                fn, box, done = jobs.get()
                try:
                    box["value"] = fn()
                except BaseException as exc:  # handed to the caller
                    box["error"] = exc
                done.set()

        threading.Thread(target=worker, name=f"trainguard-{self.name}", daemon=True).start()
        return jobs

    def run(self, fn: Callable[[], T], timeout_s: float) -> Outcome[T]:
        if self._jobs is None:
            self._jobs = self._start()
        box: dict[str, object] = {}
        done = threading.Event()
        self._jobs.put((fn, box, done))
        if not done.wait(timeout_s):
            self._jobs = None  # abandon the stuck worker; the next job gets a new one
            return Outcome(timed_out=True)
        error = box.get("error")
        if isinstance(error, BaseException):
            return Outcome(error=error)
        return Outcome(value=box.get("value"))  # type: ignore[arg-type]
