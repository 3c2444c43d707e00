"""Kernel-log readers that resume at a saved cursor: a file (same inode, same bytes before the
offset) or ``/dev/kmsg`` (records after a sequence number, same boot).

The agent saves the ``cursor`` after each tick whose incidents are stored (``agent/state.py``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainguard.telemetry.follow import LogFollower


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position in a log file: its identity (device, inode), a byte offset, and a digest of the
    bytes just before it (so a file truncated and rewritten past the offset is not mistaken for
    the one we read)."""

    dev: int
    ino: int
    offset: int
    tail: str = ""


class ResumingFollower(LogFollower):
    """``LogFollower`` from the start of the file, or from ``cursor`` when it still applies.

    A cursor applies when the path names the same file (device and inode) and the bytes before
    the offset are the ones read then; after a rotation or a truncation the whole file is new.
    """

    def __init__(self, path: str | Path, cursor: Cursor | None = None) -> None:
        self._resume = cursor
        super().__init__(path, from_start=True)

    def _open(self, seek_end: bool = False) -> bool:
        if not super()._open(seek_end):
            return False
        cursor, self._resume = self._resume, None
        if cursor is not None and self._fh is not None:
            st = os.fstat(self._fh.fileno())
            same = (st.st_dev, st.st_ino) == (cursor.dev, cursor.ino) and st.st_size >= cursor.offset
            if same and tail_digest(self._fh, cursor.offset) == cursor.tail:
                self._fh.seek(cursor.offset)
            else:
                self._fh.seek(0)
        return True

    @property
    def cursor(self) -> Cursor | None:
        """Where the next complete line starts (a partial line is read again after a restart)."""
        if self._fh is None or self._ino is None:
            return None
        offset = self._fh.tell() - len(self._partial)
        here = self._fh.tell()
        try:
            return Cursor(self._ino[0], self._ino[1], offset, tail_digest(self._fh, offset))
        finally:
            self._fh.seek(here)


TAIL_BYTES = 256


def tail_digest(fh: BinaryIO, offset: int) -> str:
    """SHA-256 of the (up to) 256 bytes before ``offset``; moves the file position."""
    start = max(0, offset - TAIL_BYTES)
    fh.seek(start)
    return hashlib.sha256(fh.read(offset - start)).hexdigest()[:32]


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class ResumingKmsg:
    """``/dev/kmsg`` from the oldest record still in the ring buffer, skipping the records up to
    the cursor's sequence number when the cursor is from this boot (``tail`` holds the boot id).
    """

    def __init__(
        self, path: str | Path, cursor: Cursor | None = None, *, boot_id: str | None = None, **kw: Any
    ) -> None:
        from trainguard.telemetry.follow import KmsgReader

        self._reader = KmsgReader(path, from_start=True, **kw)
        self._boot = boot_id if boot_id is not None else _boot_id()
        self._after = cursor.offset if cursor is not None and cursor.tail == self._boot else -1
        self._last = self._after

    def poll(self) -> list[str]:
        out = []
        for line in self._reader.poll():
            seq = _kmsg_seq(line)
            if seq is not None:
                if seq <= self._after:
                    continue  # read and judged before the restart
                self._last = seq
            out.append(line)
        return out

    @property
    def cursor(self) -> Cursor:
        return Cursor(0, 0, self._last, self._boot)

    def close(self) -> None:
        self._reader.close()


def _kmsg_seq(line: str) -> int | None:
    """The sequence number of a ``prio,seq,usec,flags;message`` record; None for other text."""
    head, sep, _ = line.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3 or not fields[1].isdigit():
        return None
    return int(fields[1])


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""
