"""Error files: an uncaught exception is written down, with its traceback, before the process dies.

Two formats, both written when their location is known:

- trainguard's ``$TRAINGUARD_RUN_DIR/errors/rank<R>.json`` (``trainguard.rundir.write_error``); the
  supervisor takes the earliest one across ranks as the root cause;
- torchelastic's ``$TORCHELASTIC_ERROR_FILE``, so that ``torchrun`` reports our root cause too:
  ``{"message": {"message": "<Type>: <msg>", "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``.

The Guard writes them when an exception leaves its ``with`` block; ``record`` (a decorator for
``main``) and the ``sys.excepthook`` the Guard installs cover code outside the block. Each
exception is written once, however many of those paths it passes.

    @record
    def main() -> None: ...
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from trainguard import rundir

TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__trainguard_recorded__"
_hook_installed = False
_context: dict[str, Any] = {}  # the active Guard (rank, attempt, run dir, last step)


class _GuardLike(Protocol):
    rank: int
    attempt: int
    run_dir: Path | None
    current_step: int | None


def write(
    exc: BaseException, run_dir: Path | None, rank: int, attempt: int = 0, step: int | None = None
) -> None:
    """Record ``exc`` in the run dir and in torchelastic's error file (once per exception)."""
    if getattr(exc, _MARK, False):
        return
    with contextlib.suppress(AttributeError):  # a __slots__ exception may be recorded twice
        setattr(exc, _MARK, True)
    now = time.time()
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = str(exc)
    if run_dir is not None:
        try:
            rundir.write_error(
                run_dir,
                rundir.ErrorRecord(
                    rank=rank,
                    time=now,
                    exc_type=type(exc).__name__,
                    message=message,
                    traceback=text,
                    pid=os.getpid(),
                    attempt=attempt,
                    step=step,
                ),
            )
        except OSError as err:  # never replace the real error with ours
            print(f"trainguard: could not write the error file: {err}", file=sys.stderr)
    elastic = os.environ.get(TORCHELASTIC_ERROR_FILE)
    if elastic:
        body = {
            "message": {
                "message": f"{type(exc).__name__}: {message}",
                "extraInfo": {"py_callstack": text, "timestamp": str(int(now))},
            }
        }
        try:
            Path(elastic).parent.mkdir(parents=True, exist_ok=True)
            rundir.atomic_write_bytes(Path(elastic), json.dumps(body).encode())
        except OSError as err:
            print(f"trainguard: could not write {elastic}: {err}", file=sys.stderr)


def _write_from_context(exc: BaseException) -> None:
    guard = _context.get("guard")
    if guard is not None:
        write(exc, guard.run_dir, guard.rank, guard.attempt, guard.current_step)
        return
    rank = int(os.environ.get("RANK", "0"))
    write(exc, rundir.run_dir_from_env(), rank, int(os.environ.get(rundir.ATTEMPT_ENV, "0")))


def _excepthook(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None, *, previous: Any
) -> None:
    if not isinstance(exc, KeyboardInterrupt):
        _write_from_context(exc)
    previous(exc_type, exc, tb)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    rank: int
    attempt: int
    run_dir: Path | None
    current_step: int | None


def install(guard: _GuardLike | None = None) -> None:
    """Install the error-recording ``sys.excepthook`` (once; chained to the previous hook)."""
    global _hook_installed
    if guard is not None:
        _context["guard"] = guard
    if not _hook_installed:
        sys.excepthook = functools.partial(_excepthook, previous=sys.excepthook)
        _hook_installed = True


def record(fn: F) -> F:
    """Decorator for a worker's ``main``: any exception escaping it is recorded, then re-raised."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            _write_from_context(exc)
            raise

    return wrapper  # type: ignore[return-value]


def detach(guard: _GuardLike) -> None:
    """The Guard's block ended: keep what the hook needs, not the Guard (and its model)."""
    if _context.get("guard") is guard:
        _context["guard"] = _Snapshot(guard.rank, guard.attempt, guard.run_dir, guard.current_step)


def guard_active() -> bool:
    """True while a Guard's block runs in this process (it writes the rank's heartbeats)."""
    guard = _context.get("guard")
    return guard is not None and not isinstance(guard, _Snapshot)
