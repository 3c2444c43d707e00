"""Line sources: where the node's kernel-log lines come from (telemetry, read before detection).

A ``LineSource`` hands over the complete lines written since its previous ``poll()``. Four ship
here and in ``follow``/``resume``: a growing file (``LogFollower``, across rotation and
truncation), ``/dev/kmsg`` (``KmsgReader``), and both resuming at a saved cursor
(``ResumingFollower``, ``ResumingKmsg``). ``open_lines`` picks the right one for a path::

    >>> import tempfile, pathlib
    >>> log = pathlib.Path(tempfile.mkdtemp()) / "kern.log"
    >>> _ = log.write_text("NVRM: Xid (PCI:0000:61:00): 79, GPU has fallen off the bus.\\n")
    >>> lines = open_lines(log)
    >>> lines.poll()
    ['NVRM: Xid (PCI:0000:61:00): 79, GPU has fallen off the bus.']
    >>> lines.poll(), lines.close()
    ([], None)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from trainguard.telemetry.resume import Cursor

__all__ = ["LineSource", "open_lines"]


@runtime_checkable
class LineSource(Protocol):
    """New complete lines since the previous ``poll()``; raises OSError or InputError when the
    source cannot be read (the agent turns that into an UNKNOWN finding)."""

    def poll(self) -> list[str]: ...

    def close(self) -> None: ...


def open_lines(path: str | Path, cursor: Cursor | None = None, *, resume: bool = False) -> LineSource:
    """The reader for ``path`` from its start: ``/dev/kmsg`` (a character device) record by
    record, anything else as a growing file. ``resume=True`` picks up at ``cursor`` instead (what
    the agent daemon saved), skipping what was read before a restart."""
    path = Path(path)
    kmsg = path.is_char_device()  # /dev/kmsg: one record per read
    if resume:
        from trainguard.telemetry.resume import ResumingFollower, ResumingKmsg

        return ResumingKmsg(path, cursor) if kmsg else ResumingFollower(path, cursor)
    from trainguard.telemetry.follow import KmsgReader, LogFollower

    # From the start: what the kernel logged before we started watching still counts.
    return KmsgReader(path, from_start=True) if kmsg else LogFollower(path, from_start=True)
