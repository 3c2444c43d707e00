"""Fast classification of whole log files: what ``trainguard logs scan`` runs.

Sits beside the line parsers (``kernel_log``, ``training_log``): instead of feeding them every
line, it reads big binary chunks, finds the few lines that contain an anchor literal (``NVRM``,
``SXid``, ``NCCL``, ``CUDA``, ``Killed``...) in bulk, counts line numbers with ``bytes.count`` and
parses only those lines. The bulk search uses Hyperscan when ``trainguard[logscan]`` is installed
(several GB/s) and the stdlib (``re`` + ``bytes.find``) otherwise; both find the same lines::

    >>> stats = ScanStats()
    >>> for event in scan_file("/var/log/kern.log", stats=stats):  # doctest: +SKIP
    ...     print(event.line_no, event.kind.value, event.xid, event.pci)
    >>> stats.lines, stats.skipped  # doctest: +SKIP

Lines with NUL bytes or invalid UTF-8 are skipped and counted, never a crash.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import IO

from trainguard.detect.kernel_log import parse_kernel_line
from trainguard.detect.training_log import TRAINING_ANCHORS, classify_training_line
from trainguard.errors import InputError
from trainguard.records import Action, Event, EventKind, Severity

log = logging.getLogger(__name__)

__all__ = ["ANCHORS", "BurstTracker", "ScanStats", "classify_line", "scan_engine", "scan_file"]

ANCHORS: tuple[bytes, ...] = tuple(dict.fromkeys([b"NVRM", b"SXid", *(a.encode() for a in TRAINING_ANCHORS)]))
DEFAULT_CHUNK = 32 << 20
MAX_LINE = 1 << 20  # a "line" longer than this is binary garbage: skipped and counted


@dataclasses.dataclass
class ScanStats:
    """Counters of one scan (mutable: the scanner fills them in as it goes)."""

    lines: int = 0
    bytes: int = 0
    findings: int = 0
    skipped: int = 0  # lines with NUL bytes, invalid UTF-8 or without end in sight
    engine: str = ""


class BurstTracker:
    """Marks an Xid 45 sympathetic when another Xid hit the same PCI address just before it.

    "Just before" is ``window_s`` of line time when both lines carry a timestamp, else within the
    previous ``window_lines`` lines of the same file.
    """

    def __init__(self, window_s: float = 10.0, window_lines: int = 20) -> None:
        self.window_s = window_s
        self.window_lines = window_lines
        self._last: dict[str | None, tuple[float | None, int | None]] = {}

    def observe(self, event: Event) -> Event:
        if event.kind is not EventKind.XID:
            return event
        if event.xid != 45:
            self._last[event.pci] = (event.time, event.line_no)
            return event
        seen = self._last.get(event.pci)
        if seen is None:
            return event
        t, no = seen
        if t is not None and event.time is not None:
            near = 0.0 <= event.time - t <= self.window_s
        else:
            near = (
                no is not None and event.line_no is not None and 0 <= event.line_no - no <= self.window_lines
            )
        if not near:
            return event
        return dataclasses.replace(event, sympathetic=True, severity=Severity.INFO, action=Action.IGNORE)


def classify_line(text: str, now: float | None = None) -> Event | None:
    """Kernel parser first (Xid, SXid, GPU lost/map), then the training-log classifier."""
    return parse_kernel_line(text, now) or classify_training_line(text, now)


@functools.cache
def _hyperscan_db() -> object | None:
    try:
        import hyperscan  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    # the anchors, plus one pattern that flags (once per chunk) a NUL or non-ASCII byte, so the
    # bulk search also tells whether the chunk needs the slower garbage check
    expressions = [re.escape(a) for a in ANCHORS] + [rb"[\x00\x80-\xff]"]
    flags = [0] * len(ANCHORS) + [hyperscan.HS_FLAG_SINGLEMATCH]
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(
        expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags
    )
    return db


def scan_engine(engine: str = "auto") -> str:
    """The bulk-search engine that will run: "hyperscan" or "stdlib" (``re`` + ``bytes.find``)."""
    if engine not in ("auto", "hyperscan", "stdlib"):
        raise InputError(f"unknown scan engine {engine!r}: use auto, hyperscan or stdlib")
    if engine == "stdlib" or (engine == "auto" and _hyperscan_db() is None):
        return "stdlib"
    if _hyperscan_db() is None:
        raise InputError("engine 'hyperscan' needs the hyperscan package: pip install 'trainguard[logscan]'")
    return "hyperscan"


def _hits_hyperscan(buf: bytearray, end: int) -> tuple[list[int], bool]:
    """Offsets inside anchor hits (sorted), and whether ``buf[:end]`` may hold garbage bytes."""
    found: list[int] = []
    flagged = len(ANCHORS)
    binary = False

    def on_match(pattern: int, _start: int, stop: int, _flags: int, _ctx: object) -> None:
        nonlocal binary
        if pattern == flagged:
            binary = True
        else:
            found.append(stop - 1)

    _hyperscan_db().scan(memoryview(buf)[:end], match_event_handler=on_match)  # type: ignore[attr-defined]
    found.sort()
    return found, binary


@functools.cache
def _stdlib_search() -> tuple[re.Pattern[bytes], tuple[bytes, ...]]:
    # re's alternation is quick when every branch starts with an upper-case letter (few text
    # positions can start a match) and slow otherwise, so the lower-case anchors get one
    # bytes.find pass each instead.
    upper = tuple(a for a in ANCHORS if a[:1].isupper())
    return re.compile(b"|".join(map(re.escape, upper))), tuple(a for a in ANCHORS if a not in upper)


def _hits_find(buf: bytearray, end: int) -> tuple[list[int], bool]:
    """The stdlib engine: same contract as ``_hits_hyperscan``."""
    found: list[int] = []
    upper, lower = _stdlib_search()
    find, pos = buf.find, 0
    while (m := upper.search(buf, pos, end)) is not None:
        found.append(m.start())
        nl = find(b"\n", m.end(), end)
        pos = end if nl < 0 else nl + 1  # one hit per line is enough
    for anchor in lower:
        pos = 0
        while (pos := find(anchor, pos, end)) >= 0:
            found.append(pos)
            nl = find(b"\n", pos, end)
            pos = end if nl < 0 else nl + 1
    found.sort()
    # the whole buffer (stale tail included) being ASCII is a cheap sufficient test
    return found, buf.find(b"\x00", 0, end) >= 0 or not buf.isascii()


def _bad_lines(buf: bytearray, end: int) -> set[int]:
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
    hits: Callable[[bytearray, int], tuple[list[int], bool]] = (
        _hits_hyperscan if stats.engine == "hyperscan" else _hits_find
    )
    return _scan(fh, name, stats, hits, max(chunk_size, 1 << 12), tracker or BurstTracker())


def _scan(
    fh: IO[bytes],
    name: str,
    stats: ScanStats,
    hits: Callable[[bytearray, int], tuple[list[int], bool]],
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
    buf: bytearray,
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
            yield tracker.observe(dataclasses.replace(event, path=name, line_no=line_base + cursor_line + 1))
    return cursor, cursor_line
