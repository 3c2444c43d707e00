"""Processes and signals: what every process trainguard starts needs, and what its starters need.

Stdlib only, at the ground floor: the supervisor, the replica loop, the warm standbys, the
checkpoint writer and the trainer's preemption handler all start processes or catch signals,
and none of them may import another's room for it.

- Every process we start dies with its parent. `die_with_parent` arms Linux's parent-death
  signal (``prctl(PR_SET_PDEATHSIG)``) in the process itself and dies at once when the parent
  is already gone (it died before the signal was armed); `parent_death` is the same as a
  ``Popen`` ``preexec_fn``; `DIE_WITH_PARENT_EXEC` is the same as ``python -c`` code that then
  becomes the real program (exec keeps the pid and the armed signal). The kernel sends the
  signal when the parent *thread* that started the child exits: start children from a thread
  that lives as long as they should.
- `install` / `stop_signals`: handlers for the stop signals (SIGTERM, SIGINT, SIGHUP) for the
  length of a block, restored after it; only the main thread can install them.
- `signals_deferred`: a stop signal that arrives inside a block is delivered after it.

    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "-c", "pass"], preexec_fn=parent_death()).returncode
    0
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "DIE_WITH_PARENT_EXEC",
    "STOP_SIGNALS",
    "die_of",
    "die_with_parent",
    "install",
    "parent_death",
    "signals_deferred",
    "stop_signals",
]

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# ``python -S -c DIE_WITH_PARENT_EXEC PARENT_PID PROGRAM ARGS...``: arm SIGKILL on the parent's
# death, give up if the parent is already gone, then become PROGRAM (for a launcher that takes a
# command line, not a preexec_fn: torch's process start). A PROGRAM that cannot run exits as a
# shell's would (127 not found, 126 not executable) with one line that names it.
DIE_WITH_PARENT_EXEC = (
    "import ctypes,os,sys\n"
    f"ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, 9, 0, 0, 0)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'trainguard run: cannot run {sys.argv[2]!r}: '\n"
    "                     f'{\"command not found\" if e.errno == 2 else e.strerror}\\n')\n"
    "    os._exit(127 if e.errno == 2 else 126)\n"
)


def _arm(sig: int) -> None:
    if sys.platform == "linux":
        with contextlib.suppress(Exception):  # no libc prctl: the parent poll still covers it
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def die_with_parent(parent: int, sig: int = signal.SIGKILL, poll_s: float | None = None) -> None:
    """Call in a started process: ``sig`` reaches it when ``parent`` (its parent's pid, as the
    parent gave it) exits; it is SIGKILLed now if the parent already has. ``poll_s``: also watch
    the parent from a daemon thread (hosts without prctl; a process whose parent thread may exit
    before the parent process)."""
    _arm(sig)
    if os.getppid() != parent:  # died while this process started, before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    if poll_s is not None:
        threading.Thread(target=_poll_parent, args=(parent, poll_s), daemon=True, name="parent-watch").start()


def _poll_parent(parent: int, every_s: float) -> None:
    event = threading.Event()
    while os.getppid() == parent:
        event.wait(every_s)
    os.kill(os.getpid(), signal.SIGKILL)


def parent_death(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``Popen`` ``preexec_fn``: the child gets ``sig`` when this process exits (SIGTERM lets
    a child that supervises others stop them first)."""
    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(parent, sig)

    return preexec


def install(signals: Iterable[int], handler: Any, *, take_foreign: bool = False) -> Callable[[], None]:
    """Install ``handler`` for ``signals`` (main thread only: elsewhere nothing is installed) and
    return what puts the previous handlers back. A handler installed from C (Python sees None)
    cannot be put back from Python: such a signal is left alone, unless ``take_foreign`` (then
    its default action is what is put back)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {}
    for sig in signals:
        old = signal.getsignal(sig)
        if old is None and not take_foreign:
            continue
        previous[sig] = signal.SIG_DFL if old is None else old
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)
        previous.clear()

    return restore


@contextlib.contextmanager
def stop_signals(handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """``handler`` for SIGTERM, SIGINT and SIGHUP inside the block (main thread only)."""
    restore = install(STOP_SIGNALS, handler)
    try:
        yield
    finally:
        restore()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Deliver a stop signal after the block, not inside it. A supervisor turns SIGTERM, SIGINT
    and SIGHUP into an exception in the main thread; raised inside a store write, it ends the
    transaction (SQLite rolls it back: the record is lost) and the write's error handling
    swallows it (the signal is lost too). Held here, it is raised again once the write is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    restore = install(STOP_SIGNALS, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        restore()
        if caught:
            signal.raise_signal(caught[0])  # to the handler in force before the block


def die_of(signum: int) -> None:
    """End this process by ``signum`` with its default action, as if it had never been caught.
    From any thread: off the main thread (where Python cannot change a handler) the C library
    resets it; a process that survives its own signal (a signal whose default is to ignore it)
    leaves with the shell's status for it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    elif sys.platform == "linux":
        with contextlib.suppress(Exception):
            reset = ctypes.CDLL(None, use_errno=True).signal
            reset.argtypes, reset.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
            reset(int(signum), None)  # NULL is SIG_DFL
    os.kill(os.getpid(), signum)
    if threading.current_thread() is not threading.main_thread():
        time.sleep(1.0)  # the default action lands on some thread of the process
        os._exit(128 + int(signum))
