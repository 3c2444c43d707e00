"""The replica loop's console: each group's output, as restart mode shows a job's.

A group's ``trainguard run`` writes its console (its ranks' lines, ``[rank R] ...``, and its own
messages) to ``groups/g<i>.log`` under the job's run directory; every monitor interval the loop
copies the new complete lines to its own console with the group in front, ``[g<i>] [rank R] ...``,
and flushes the rest when the job ends. Off with ``--no-tee``, as restart mode's rank lines are.

    >>> import io, tempfile
    >>> from pathlib import Path
    >>> log = Path(tempfile.mkdtemp()) / "g1.log"
    >>> _ = log.write_text("[rank0] step 1\\n[rank0] step")
    >>> out = io.StringIO()
    >>> tail = GroupConsole(out)
    >>> tail.poll({1: log}); out.getvalue()
    '[g1] [rank0] step 1\\n'
    >>> tail.poll({1: log}, final=True); out.getvalue().splitlines()[-1]
    '[g1] [rank0] step'
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

__all__ = ["GroupConsole"]

CHUNK = 1 << 20  # read at most this much of one log per poll: a flood waits for the next one


class GroupConsole:
    """Follows each group's log from where it last stopped; never raises on I/O."""

    def __init__(self, console: TextIO | None = None) -> None:
        self._console = console
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, bytes] = {}

    def poll(self, logs: dict[int, Path], final: bool = False) -> None:
        """Copy the new lines of each group's log (``{group: path}``); ``final``: the unfinished
        last line too."""
        for group, path in sorted(logs.items()):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(group, 0))
                    data = f.read(CHUNK)
            except OSError:
                continue
            self._offsets[group] = self._offsets.get(group, 0) + len(data)
            lines = (self._partial.get(group, b"") + data).split(b"\n")
            self._partial[group] = b"" if final else lines.pop()
            self._write(group, [raw for raw in lines if raw])

    def _write(self, group: int, lines: list[bytes]) -> None:
        if not lines:
            return
        console = self._console or sys.stdout
        text = "".join(f"[g{group}] {raw.decode('utf-8', 'replace').rstrip(chr(13))}\n" for raw in lines)
        try:
            console.write(text)
            console.flush()
        except (OSError, ValueError):
            pass
