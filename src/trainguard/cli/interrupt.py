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

A CPython quirk (seen on 3.11.7, not narrowed further): a Ctrl-C that lands while ``hyperscan``
is first imported (in the NamedTuple its package builds) ends the process by SIGINT at exit although
``cli.main`` caught the ``KeyboardInterrupt`` and returned 130: the shell sees 130 either way, a
parent's ``wait`` sees -2 instead of 130. (Caught elsewhere, inside ``eval`` or ``exec`` of a string
or other imports, the interrupt exits 130.) So the commands import what their loop needs before
they announce that they run: ``logs follow`` scans an empty batch before its header.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

__all__ = ["CtrlC", "quits_on_ctrl_c"]

F = TypeVar("F", bound=Callable[..., Any])
_SLICE_S = 0.05  # how often `sleep` looks at the flag (a handler that returns does not end a sleep)


class CtrlC:
    """While entered (in the main thread): SIGINT sets ``pressed``; the second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None
        self._installed = False

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
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False


def quits_on_ctrl_c(func: F) -> F:
    """Run ``func`` with SIGINT raising KeyboardInterrupt, even when the process inherited it ignored."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return func(*args, **kwargs)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return func(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)

    return wrapper  # type: ignore[return-value]
