"""Fast classification of whole log files: what ``trainguard logs scan`` runs.

Sits beside the line parsers (``kernel_log``, ``training_log``): instead of feeding them every
line, it reads 1 MiB chunks into one buffer, finds in bulk the few lines that can be findings
(``prefilter``: the literals every finding's pattern needs, ``NCCL WARN``, ``CUDA error: ``,
``NVRM``...), counts line numbers with ``bytes.count`` and parses only those lines. Every line is
a finding of its own; ``merge_events`` folds the lines of one failure into one::

    >>> stats = ScanStats()
    >>> for event in scan_file("/var/log/kern.log", stats=stats):  # doctest: +SKIP
    ...     print(event.line_no, event.kind.value, event.xid, event.pci)
    >>> stats.lines, stats.skipped  # doctest: +SKIP

Lines with NUL bytes or invalid UTF-8 are skipped and counted, never a crash.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import IO

from trainguard.detect.kernel_log import parse_kernel_line
from trainguard.detect.merge import BurstTracker, EventMerger, merge_events
from trainguard.detect.prefilter import ANCHORS, Hits, hits_hyperscan, hits_stdlib, scan_engine
from trainguard.detect.training_log import classify_training_line
from trainguard.errors import InputError
from trainguard.records import Event

log = logging.getLogger(__name__)

__all__ = [
    "ANCHORS",
    "BurstTracker",
    "EventMerger",
    "ScanStats",
    "classify_line",
    "merge_events",
    "scan_bytes",
    "scan_engine",
    "scan_file",
]

DEFAULT_CHUNK = 1 << 20  # small enough that the count and the bulk search find it in cache
MAX_LINE = 1 << 20  # a "line" longer than this is binary garbage: skipped and counted


@dataclasses.dataclass
class ScanStats:
    """Counters of one scan (mutable: the scanner fills them in as it goes)."""

    lines: int = 0
    bytes: int = 0
    findings: int = 0
    skipped: int = 0  # lines with NUL bytes, invalid UTF-8 or without end in sight
    engine: str = ""


def classify_line(text: str, now: float | None = None) -> Event | None:
    """Kernel parser first (Xid, SXid, GPU lost/map), then the training-log classifier."""
    return parse_kernel_line(text, now) or classify_training_line(text, now)


def _at(e: Event, path: str, line_no: int) -> Event:
    """``dataclasses.replace(e, path=..., line_no=...)`` without its introspection (it runs per finding;
    a test checks the two agree, so a new ``Event`` field is not dropped)."""
    return Event(kind=e.kind, text=e.text, time=e.time, xid=e.xid, pci=e.pci, uuid=e.uuid, pid=e.pid,
                 process=e.process, category=e.category, severity=e.severity, action=e.action,
                 sympathetic=e.sympathetic, path=path, line_no=line_no)  # fmt: skip


def _bad_lines(buf: bytes | bytearray, end: int) -> set[int]:
    """Indexes (0-based) of the lines in ``buf[:end]`` with NUL bytes or invalid UTF-8."""
    if buf.find(b"\x00", 0, end) < 0:
        try:
            bytes(memoryview(buf)[:end]).decode("utf-8")
            return set()
        except UnicodeDecodeError:
            pass
    bad = set()
    for i, line in enumerate(bytes(memoryview(buf)[:end]).split(b"\n")):
        if b"\x00" in line:
            bad.add(i)
        elif not line.isascii():
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad.add(i)
    return bad


def _open(path: str | Path) -> tuple[IO[bytes], str]:
    if str(path) == "-":
        return sys.stdin.buffer, "-"
    try:
        return open(path, "rb"), str(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a log file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def scan_file(
    path: str | Path,
    *,
    stats: ScanStats | None = None,
    engine: str = "auto",
    chunk_size: int = DEFAULT_CHUNK,
    tracker: BurstTracker | None = None,
) -> Iterator[Event]:
    """Every finding in the file at ``path`` ("-" = stdin), in order, with ``path`` and ``line_no``.

    Raises ``InputError`` at once when the file cannot be opened (and later if reading fails).
    """
    fh, name = _open(path)
    stats = stats if stats is not None else ScanStats()
    stats.engine = scan_engine(engine)
    hits: Callable[[bytes | bytearray, int], Hits] = (
        hits_hyperscan if stats.engine == "hyperscan" else hits_stdlib
    )
    return _scan(fh, name, stats, hits, max(chunk_size, 1 << 12), tracker or BurstTracker())


def scan_bytes(
    data: bytes | bytearray,
    *,
    name: str,
    line_base: int = 0,
    stats: ScanStats | None = None,
    engine: str = "auto",
    tracker: BurstTracker | None = None,
) -> list[Event]:
    """The findings in ``data`` (whole lines), numbered from ``line_base + 1``.

    What ``logs follow`` runs on each batch of appended lines: the same bulk first pass as
    ``scan_file``, so a fast-growing file costs Python a call per candidate, not per line.
    """
    stats = stats if stats is not None else ScanStats()
    stats.engine = scan_engine(engine)
    hits = hits_hyperscan if stats.engine == "hyperscan" else hits_stdlib
    end = len(data)
    positions, maybe_binary = hits(data, end)
    bad = _bad_lines(data, end) if maybe_binary else set()
    stats.skipped += len(bad)
    found = _findings(data, end, name, line_base, positions, bad, stats, tracker or BurstTracker())
    events = list(found)
    stats.bytes += end
    stats.lines += data.count(b"\n") + (1 if end and data[end - 1] != 0x0A else 0)
    return events


def _scan(
    fh: IO[bytes],
    name: str,
    stats: ScanStats,
    hits: Callable[[bytes | bytearray, int], Hits],
    chunk: int,
    tracker: BurstTracker,
) -> Iterator[Event]:
    # One reused buffer (no per-chunk allocation): [0, filled) holds the carried partial line
    # followed by the newest read; complete lines end at ``end``.
    buf = bytearray(chunk + MAX_LINE)
    view = memoryview(buf)
    filled = 0
    line_base = 0  # lines before the start of buf
    discarding = False  # inside an over-long line: drop bytes until its end
    with fh:
        while True:
            try:
                n = fh.readinto(view[filled : filled + chunk]) or 0  # type: ignore[attr-defined]
            except OSError as exc:
                raise InputError(f"{name}: read failed ({exc.strerror or exc})") from None
            stats.bytes += n
            filled += n
            at_eof = n == 0
            if discarding:
                nl = buf.find(b"\n", 0, filled)
                if nl < 0:
                    filled = 0
                    if at_eof:
                        stats.lines += 1
                        break
                    continue
                view[: filled - nl - 1] = view[nl + 1 : filled]
                filled -= nl + 1
                line_base += 1
                stats.lines += 1
                discarding = False
            end = filled if at_eof else buf.rfind(b"\n", 0, filled) + 1
            if end == 0 and not at_eof:
                if filled > MAX_LINE:
                    stats.skipped += 1
                    discarding, filled = True, 0
                continue
            positions, maybe_binary = hits(buf, end)
            bad = _bad_lines(buf, end) if maybe_binary else set()
            stats.skipped += len(bad)
            cursor, counted = yield from _findings(buf, end, name, line_base, positions, bad, stats, tracker)
            newlines = counted + buf.count(b"\n", cursor, end)
            line_base += newlines
            stats.lines += newlines + (1 if at_eof and end and buf[end - 1] != 0x0A else 0)
            if at_eof:
                break
            view[: filled - end] = view[end:filled]
            filled -= end


def _findings(
    buf: bytes | bytearray,
    end: int,
    name: str,
    line_base: int,
    positions: list[int],
    bad: set[int],
    stats: ScanStats,
    tracker: BurstTracker,
) -> Generator[Event, None, tuple[int, int]]:
    """Classify the candidate lines; returns (offset, lines before it) of the last one seen."""
    cursor, cursor_line, done_until = 0, 0, -1
    for pos in positions:
        if pos <= done_until or pos >= end:
            continue  # another anchor on a line already handled
        start = buf.rfind(b"\n", 0, pos) + 1
        stop = buf.find(b"\n", pos, end)
        stop = end if stop < 0 else stop
        done_until = stop
        cursor_line += buf.count(b"\n", cursor, start)
        cursor = start
        if cursor_line in bad:
            continue
        event = classify_line(buf[start:stop].decode("utf-8", "replace").rstrip("\r"))
        if event is not None:
            stats.findings += 1
            yield tracker.observe(_at(event, name, line_base + cursor_line + 1))
    return cursor, cursor_line
