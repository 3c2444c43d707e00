"""Ctrl-C for the commands that run until it (`monitor`, `logs follow`): SIGINT always quits.

Python turns SIGINT into ``KeyboardInterrupt`` only when the process starts with SIGINT at its
default action. A command started in the background by a non-interactive shell (``cmd &`` in a
script, a CI runner, ``nohup``) inherits SIGINT as *ignored*, and Python leaves it ignored: Ctrl-C
and ``kill -INT`` then do nothing and the command runs on. Both helpers here install a handler of
their own for as long as the command runs, and put the previous one back afterwards::

    with CtrlC() as ctrl_c:            # `monitor`: the first Ctrl-C asks, the loop quits cleanly
        while not ctrl_c.pressed:
            draw()
            ctrl_c.sleep(1.0)          # returns early on Ctrl-C

    @quits_on_ctrl_c                   # `logs follow`: Ctrl-C raises KeyboardInterrupt, as usual
    def run_follow(args): ...

``CtrlC`` only sets a flag, so the interrupt never lands inside the terminal-drawing code (where an
exception between two writes can leave the cursor hidden); a second Ctrl-C raises
``KeyboardInterrupt`` at once, for a loop stuck somewhere that never looks at the flag.

A CPython defect (seen on 3.11; CPython's main branch no longer sets the mark there since
gh-128130): a ``KeyboardInterrupt`` that leaves an ``exec`` or ``eval`` of a *string* marks the
interpreter as interrupted (``_Py_UnhandledKeyboardInterrupt``) even when a caller catches it, and
under ``python -m`` the interpreter ends the process by SIGINT at exit whatever status it was
given: the shell sees 130 either way, a parent's ``wait`` sees -2, and a command that returned 0
after a handled Ctrl-C dies of it. Such strings run in many imports (``namedtuple``,
``dataclass``, the ``NamedTuple`` that ``hyperscan`` builds). Any later ``exec`` of a string
clears the mark, so ``python -m trainguard.cli`` clears it with ``forget_caught_interrupts`` once
``cli.main`` has chosen its status (the installed ``trainguard`` script runs as a file, which
exits with the status). ``logs follow`` also imports its scan engine before its header says it
follows.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from trainguard.procs import install

__all__ = ["CtrlC", "forget_caught_interrupts", "quits_on_ctrl_c"]

F = TypeVar("F", bound=Callable[..., Any])
_SLICE_S = 0.05  # how often `sleep` looks at the flag (a handler that returns does not end a sleep)


class CtrlC:
    """While entered (in the main thread): SIGINT sets ``pressed``; the second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.pressed = False
        self._restore: Callable[[], None] = lambda: None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True  # a plain attribute: safe in a handler (an Event's lock is not)

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until Ctrl-C; True if it was pressed."""
        end = time.monotonic() + seconds
        while not self.pressed:
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, _SLICE_S))
        return self.pressed

    def __enter__(self) -> CtrlC:
        self._restore = install([signal.SIGINT], self._handle, take_foreign=True)  # main thread only
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()
        self._restore = lambda: None


def quits_on_ctrl_c(func: F) -> F:
    """Run ``func`` with SIGINT raising KeyboardInterrupt, even when the process inherited it ignored."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        restore = install([signal.SIGINT], signal.default_int_handler, take_foreign=True)
        try:
            return func(*args, **kwargs)
        finally:
            restore()

    return wrapper  # type: ignore[return-value]


def forget_caught_interrupts() -> None:
    """Clear CPython's mark of a KeyboardInterrupt that left an ``exec`` of a string (see above),
    so that ``python -m`` exits with the status the command chose, not by SIGINT."""
    exec("pass", {})  # on 3.11 an exec of a string starts by clearing the mark; later, a no-op
