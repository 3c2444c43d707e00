"""Every test runs under a watchdog: a wedged GPU or a hung collective becomes a failed test.

The test runs in a daemon thread; past its deadline the caller gets ``TimedOut`` and moves on.
The thread cannot be killed (a CUDA call stuck in the driver cannot be interrupted from Python);
it is abandoned, and the CLI leaves with ``os._exit`` so a stuck thread cannot hold the process.

    >>> watch(lambda: 42, timeout_s=1.0).value
    42
    >>> import threading
    >>> watch(threading.Event().wait, timeout_s=0.05).timed_out
    True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Outcome", "watch"]

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
