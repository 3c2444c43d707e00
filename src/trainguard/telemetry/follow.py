"""Reading logs as they grow: files (across rotation and truncation), ``/dev/kmsg``, the journal.

The telemetry end of the kernel-log side: the agent polls one of these each tick and hands the
new lines to ``parse_kernel_line``. Nothing here blocks except ``LogFollower.lines`` (which sleeps
through the injected ``sleep`` between polls)::

    >>> follower = LogFollower("/var/log/kern.log", from_start=False)  # doctest: +SKIP
    >>> for line in follower.lines():  # doctest: +SKIP
    ...     event = parse_kernel_line(line)

Lines with NUL bytes or invalid UTF-8 are skipped and counted in ``skipped``, never a crash.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trainguard.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["KmsgReader", "LogFollower", "decode_line", "read_journal_kernel", "read_kmsg"]

MAX_PARTIAL = 1 << 20  # an unterminated "line" longer than this is garbage: dropped and counted


def decode_line(raw: bytes) -> str | None:
    """A log line's text, or None for binary garbage (NUL bytes or invalid UTF-8)."""
    if b"\x00" in raw:
        return None
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
        return None  # the replacement character came from invalid bytes
    return text.rstrip("\r")


class LogFollower:
    """Yields complete new lines of a growing file, like ``tail -F``.

    Rotation (the path now names another inode): the rest of the old file is read first, then the
    new file from its start. Truncation (the file shrank): reading restarts at offset 0. A path
    that does not exist yet is waited for.
    """

    def __init__(
        self,
        path: str | Path,
        from_start: bool = True,
        *,
        poll_interval: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = Path(path)
        self.poll_interval = poll_interval
        self.skipped = 0
        self._sleep = sleep
        self._fh: io.BufferedReader | None = None
        self._ino: tuple[int, int] | None = None
        self._partial = b""
        self._open(seek_end=not from_start)

    def _open(self, seek_end: bool = False) -> bool:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read ({exc.strerror or exc})") from None
        st = os.fstat(fh.fileno())
        if seek_end:
            fh.seek(0, os.SEEK_END)
        self._fh, self._ino, self._partial = fh, (st.st_dev, st.st_ino), b""
        return True

    def _read_all(self) -> bytes:
        assert self._fh is not None
        return self._fh.read() or b""

    def _take(self, data: bytes, final: bool = False) -> bytes:
        """The complete lines of what was read (the partial last line waits for its newline)."""
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        complete, self._partial = data[:cut], data[cut:]
        if final and self._partial:
            complete, self._partial = complete + self._partial + b"\n", b""
        if len(self._partial) > MAX_PARTIAL:
            self.skipped += 1
            self._partial = b""
        return complete

    def poll_bytes(self) -> bytes:
        """Every complete line appended since the last poll, as the raw bytes (each ends in a newline).

        What ``logs follow`` scans in bulk; ``poll`` decodes the same bytes line by line.
        """
        if self._fh is None:
            return self._take(self._read_all()) if self._open() else b""
        out = self._take(self._read_all())
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return out  # rotated away, new file not created yet: keep the old one
        if (st.st_dev, st.st_ino) != self._ino:
            out += self._take(self._read_all(), final=True)  # finish the old file
            self.close()
            if self._open():
                out += self._take(self._read_all())
        elif self._fh is not None and st.st_size < self._fh.tell():
            log.info("%s was truncated; reading from its start", self.path)
            self._fh.seek(0)
            self._partial = b""
            out += self._take(self._read_all())
        return out

    def poll(self) -> list[str]:
        """Every complete line appended since the last poll (empty when nothing is new)."""
        out = []
        for raw in self.poll_bytes().split(b"\n")[:-1]:
            text = decode_line(raw)
            if text is None:
                self.skipped += 1
            else:
                out.append(text)
        return out

    def lines(self, stop: Callable[[], bool] | None = None) -> Iterator[str]:
        """Poll forever (or until ``stop()``), sleeping ``poll_interval`` when nothing is new."""
        while stop is None or not stop():
            new = self.poll()
            yield from new
            if not new:
                self._sleep(self.poll_interval)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class KmsgReader:
    """Non-blocking reader of ``/dev/kmsg``: one read returns one kernel record.

    A record overwritten in the ring buffer before we read it makes the read fail with EPIPE; the
    next read continues with the oldest record still there, so we note it and carry on.

    Only the kernel's own records are returned: a process may write to ``/dev/kmsg`` too (root, or
    whoever the device's mode lets), and the kernel stamps such a record with a user facility
    whatever prefix it claims (``devkmsg_write``), so a record whose facility is not 0 (``kern``)
    was not written by the driver; it is dropped and counted in ``untrusted``.
    """

    def __init__(
        self,
        path: str | Path = "/dev/kmsg",
        from_start: bool = True,
        *,
        read: Callable[[int, int], bytes] = os.read,
    ) -> None:
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise InputError(f"{path}: cannot open ({exc.strerror or exc}); reading it needs root") from None
        if not from_start:
            # a plain-file stand-in or an old kernel cannot seek: read from the start then
            with contextlib.suppress(OSError):
                os.lseek(self._fd, 0, os.SEEK_END)
        self._read = read
        self.lost = 0  # records overwritten before we could read them
        self.skipped = 0
        self.untrusted = 0  # records a process wrote, not the kernel

    def poll(self, max_records: int = 100_000) -> list[str]:
        out: list[str] = []
        for _ in range(max_records):
            try:
                record = self._read(self._fd, 8192)
            except BlockingIOError:
                break  # EAGAIN: nothing more right now
            except BrokenPipeError:
                self.lost += 1
                continue
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # buffer too small for one record: skip it
                    self.skipped += 1
                    continue
                raise
            if not record:
                break
            # "prio,seq,usec,flags;message\n SUBSYSTEM=...": keep the first line, as dmesg -r would
            if not _from_kernel(record):
                self.untrusted += 1
                continue
            text = decode_line(record.split(b"\n", 1)[0])
            if text is None:
                self.skipped += 1
            else:
                out.append(text)
        return out

    def close(self) -> None:
        os.close(self._fd)


def _from_kernel(record: bytes) -> bool:
    """Whether a ``/dev/kmsg`` record's facility is the kernel's (``prio`` = facility * 8 + level).
    Text without the record prefix (a stand-in file) is taken as it is."""
    head = record.split(b",", 1)[0]
    return not head.isdigit() or int(head) >> 3 == 0


def read_kmsg(path: str | Path = "/dev/kmsg", *, read: Callable[[int, int], bytes] = os.read) -> list[str]:
    """Every record currently in the kernel ring buffer (raw ``prio,seq,usec,flags;msg`` lines)."""
    reader = KmsgReader(path, from_start=True, read=read)
    try:
        return reader.poll()
    finally:
        reader.close()


def read_journal_kernel(
    since: str | None = None,
    *,
    journalctl: str = "journalctl",
    run: Callable[..., subprocess.CompletedProcess[bytes]] = subprocess.run,
    timeout: float = 60.0,
) -> list[str]:
    """The kernel messages of the journal as ``journalctl -k -o short-iso --no-pager`` prints them."""
    if run is subprocess.run and shutil.which(journalctl) is None:
        raise InputError(f"{journalctl} not found: read a dmesg or syslog file instead")
    cmd = [journalctl, "-k", "-o", "short-iso", "--no-pager", *(["--since", since] if since else [])]
    try:
        done = run(cmd, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{' '.join(cmd)} failed: {exc}") from None
    if done.returncode != 0:
        err = (done.stderr or b"").decode("utf-8", "replace").strip()
        raise InputError(f"{' '.join(cmd)} exited {done.returncode}: {err or 'no message'}")
    lines = [decode_line(raw) for raw in (done.stdout or b"").splitlines()]
    return [line for line in lines if line is not None and not line.startswith("-- ")]
