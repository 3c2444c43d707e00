"""The run directory's control file: what the supervisor asks of the running ranks.

The run directory (`trainguard.rundir`) carries the trainer's reports to the supervisor; this file
is the one document that goes the other way::

    $TRAINGUARD_RUN_DIR/control.json    written by the supervisor only, atomically (temp file,
                                        fsync, rename), each write a whole new document:
        {"version": 1,         the format (below)
         "seq": N,             bumped by every write
         "time": unix_s,       when it was written
         "save_now": S|null,   the seq of the newest checkpoint request: ranks checkpoint at a
                               step boundary once per value (all at the same step)
         "attempt": A|null,    the attempt whose ranks the request is for (null: any)
         "reason": "..."}      why, for the trainer's log

A trainer reads it at a step boundary every few steps: one ``stat`` per look (`ControlWatch`),
the file itself only when it changed. A trainer that does not know the file ignores it, and a
reader never raises into training: a missing, torn or foreign file reads as None.

Version rule: fields are only added, never changed in meaning, so a reader ignores the fields it
does not know and reads a document of its own version. ``version`` goes up only for a change an
older reader must not act on, and a reader ignores a document of a version it does not know.
Planned fields: ``shares`` ({rank: share of the global batch}, for load rebalancing).

    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> write_control(run, Control().asking_checkpoint("GPU 3 degraded", now=1.0))
    >>> read_control(run)
    Control(seq=1, time=1.0, save_now=1, attempt=None, reason='GPU 3 degraded', version=1)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.rundir import atomic_write_bytes

__all__ = ["CONTROL_VERSION", "Control", "ControlWatch", "control_path", "read_control", "write_control"]

CONTROL_VERSION = 1


@dataclass(frozen=True, slots=True)
class Control:
    """One control document (see the module docstring for the fields)."""

    seq: int = 0
    time: float = 0.0
    save_now: int | None = None
    attempt: int | None = None
    reason: str = ""
    version: int = CONTROL_VERSION

    def asking_checkpoint(self, reason: str, now: float, attempt: int | None = None) -> Control:
        """The next document: this one, plus a checkpoint request (for ``attempt``'s ranks)."""
        seq = self.seq + 1
        return replace(self, seq=seq, time=now, save_now=seq, attempt=attempt, reason=reason)


def control_path(run_dir: Path) -> Path:
    return run_dir / "control.json"


def write_control(run_dir: Path, control: Control) -> None:
    """Replace the control document atomically: a reader sees the old one or the new one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(control_path(run_dir), json.dumps(asdict(control), sort_keys=True).encode())


def read_control(run_dir: Path) -> Control | None:
    """The control document; None when there is none or it cannot be read as one (never raises)."""
    try:
        return _parse(json.loads(control_path(run_dir).read_bytes()))
    except (OSError, ValueError):
        return None


def _parse(raw: Any) -> Control | None:
    if not isinstance(raw, dict) or raw.get("version") != CONTROL_VERSION:
        return None
    seq, save_now, attempt = raw.get("seq"), raw.get("save_now"), raw.get("attempt")
    if type(seq) is not int:  # a document without its sequence number cannot be acted on once
        return None
    when = raw.get("time")
    return Control(
        seq=seq,
        time=float(when) if isinstance(when, int | float) and not isinstance(when, bool) else 0.0,
        save_now=save_now if type(save_now) is int else None,
        attempt=attempt if type(attempt) is int else None,
        reason=raw["reason"] if isinstance(raw.get("reason"), str) else "",
    )


class ControlWatch:
    """Looks at the control file for a trainer: `poll` costs one ``stat`` and reads the file only
    when it changed (a new write is a new file: its inode, size or time differ)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = control_path(run_dir)
        self.current: Control | None = None  # the newest document read
        self._key: tuple[int, int, int] | None = None

    def poll(self) -> Control | None:
        """The document when it changed since the last look, else None."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._key:
            return None
        self._key = key
        control = read_control(self.path.parent)
        if control is not None:
            self.current = control
        return control
