"""A kernel-log follower that resumes at a saved cursor (same file, not truncated below it)."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.agentd.state import Cursor
from trainguard.detect.follow import LogFollower


class ResumingFollower(LogFollower):
    """``LogFollower`` from the start of the file, or from ``cursor`` when it still applies.

    A cursor applies when the path names the same file (device and inode) and that file is at
    least as long as the offset; after a rotation or a truncation the whole file is new.
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
            if (st.st_dev, st.st_ino) == (cursor.dev, cursor.ino) and st.st_size >= cursor.offset:
                self._fh.seek(cursor.offset)
        return True

    @property
    def cursor(self) -> Cursor | None:
        """Where the next complete line starts (a partial line is read again after a restart)."""
        if self._fh is None or self._ino is None:
            return None
        return Cursor(self._ino[0], self._ino[1], self._fh.tell() - len(self._partial))
