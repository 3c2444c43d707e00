"""Fast classification of whole log files: what ``trainguard logs scan`` runs.

Sits beside the line parsers (``kernel_log``, ``training_log``): instead of feeding them every
line, it splits the file into 1 MiB runs of whole lines, finds in bulk the few lines that can be
findings (``prefilter``: the literals every finding's pattern needs, ``NCCL WARN``, ``CUDA
error: ``, ``NVRM``...) and their line numbers, and parses only those lines. With the hyperscan
engine the bulk work releases the GIL, so the runs of a regular file are searched on all cores
(as ripgrep does) while this thread parses the candidates in file order. A large file read by a
process with no other thread (the CLI) is split between forked processes instead, which also
share out what holds the GIL (the ``re`` passes of the stdlib engine, ``bytes.count``). Every line is a
finding of its own; ``merge_events`` folds the lines of one failure into one::

    >>> stats = ScanStats()
    >>> for event in scan_file("/var/log/kern.log", stats=stats):  # doctest: +SKIP
    ...     print(event.line_no, event.kind.value, event.xid, event.pci)
    >>> stats.lines, stats.skipped  # doctest: +SKIP

Lines with NUL bytes or invalid UTF-8 are skipped and counted, never a crash.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import stat
import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING

from trainguard.detect.kernel_log import parse_kernel_line
from trainguard.detect.merge import BurstTracker, EventMerger, merge_events
from trainguard.detect.prefilter import Lines, first_pass, scan_engine
from trainguard.detect.searchers import Run, Span, alone, forked, threaded
from trainguard.detect.training_log import classify_training_line
from trainguard.errors import InputError
from trainguard.records import Event

if TYPE_CHECKING:
    from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "BurstTracker",
    "EventMerger",
    "ScanStats",
    "classify_line",
    "merge_events",
    "scan_bytes",
    "scan_engine",
    "scan_file",
]

DEFAULT_CHUNK = 1 << 20  # small enough that the newline and bulk searches find it in cache
MAX_LINE = 1 << 20  # a "line" longer than this is binary garbage: skipped and counted
FORK_FROM = 16 << 20  # a file this large pays for forking its searchers (~1 ms each)


@dataclasses.dataclass
class ScanStats:
    """Counters of one scan (mutable: the scanner fills them in as it goes)."""

    lines: int = 0
    bytes: int = 0
    findings: int = 0
    skipped: int = 0  # lines with NUL bytes, invalid UTF-8 or without end in sight
    engine: str = ""
    threads: int = 1  # searchers that ran at once (threads, or processes: see ``processes``)
    processes: int = 1  # processes that searched the file (> 1: forked searchers)

    def looks_binary(self) -> bool:
        """Most lines are not text: a binary file, not a log (a log written up to a power loss
        holds a few NUL lines, and is still read)."""
        return self.skipped * 2 > self.lines


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
    threads: int | None = None,
) -> Iterator[Event]:
    """Every finding in the file at ``path`` ("-" = stdin), in order, with ``path`` and ``line_no``.

    ``threads`` searches a regular file's chunks in parallel (default: one per CPU when the
    searchers can run at once: forked processes, or threads with the hyperscan engine, whose
    search releases the GIL; else 1). Processes are forked for a file of ``FORK_FROM`` bytes or
    more when this process has no other thread (a fork copies only the calling thread).
    Raises ``InputError`` at once when the file cannot be opened (and later if reading fails).
    """
    fh, name = _open(path)
    stats = stats if stats is not None else ScanStats()
    stats.engine = scan_engine(engine)
    info = os.fstat(fh.fileno()) if name != "-" else None
    lines = first_pass(stats.engine)
    chunk, tracker = max(chunk_size, 1 << 12), tracker or BurstTracker()
    if info and stat.S_ISREG(info.st_mode) and info.st_size > 0:  # /proc files say size 0: streamed
        fork = info.st_size >= FORK_FROM and alone()
        if threads is None:
            parallel = fork or stats.engine == "hyperscan"
            threads = min(len(os.sched_getaffinity(0)), 8) if parallel else 1
        stats.threads = max(threads, 1)
        stats.processes = stats.threads if fork else 1
        return _scan_regular(fh, name, stats, lines, chunk, tracker)
    return _scan_stream(fh, name, stats, lines, chunk, tracker)


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
    end = len(data)
    run = _candidates(data, end, first_pass(stats.engine))
    events = list(_emit(run, name, line_base, stats, tracker or BurstTracker()))
    stats.bytes += end
    stats.lines += run.newlines + (1 if end and data[end - 1] != 0x0A else 0)
    return events


def _candidates(buf: bytes | bytearray, end: int, lines: Callable[[bytes | bytearray, int], Lines]) -> Run:
    spans, newlines, maybe_binary = lines(buf, end)
    bad = _bad_lines(buf, end) if maybe_binary else set()
    return Run([(i, buf[a:b]) for i, a, b in spans if i not in bad], newlines, len(bad))


def _emit(run: Run, name: str, line_base: int, stats: ScanStats, tracker: BurstTracker) -> Iterator[Event]:
    stats.skipped += run.skipped
    for index, raw in run.lines:
        event = classify_line(raw.decode("utf-8", "replace").rstrip("\r"))
        if event is not None:
            stats.findings += 1
            yield tracker.observe(_at(event, name, line_base + index + 1))


def _runs(mm: mmap.mmap, size: int, chunk: int) -> Iterator[Span]:
    """(start, stop, too_long) of runs of about ``chunk`` bytes of whole lines; a line longer than
    MAX_LINE is a run of its own, skipped (as the streaming reader skips it)."""
    start = 0
    while start < size:
        cut = min(start + chunk, size) - 1
        nl = mm.find(b"\n", cut)
        stop = size if nl < 0 else nl + 1
        line_start = max(mm.rfind(b"\n", start, cut) + 1, start)
        if stop - line_start <= MAX_LINE:
            yield start, stop, False
        else:
            if line_start > start:
                yield start, line_start, False
            yield line_start, stop, True
        start = stop


def _shares(spans: list[Span], processes: int) -> list[list[Span]]:
    """``spans`` in ``processes`` contiguous shares of about equal bytes."""
    size = spans[-1][1]
    shares: list[list[Span]] = [[] for _ in range(processes)]
    for span in spans:
        shares[span[0] * processes // size].append(span)
    return shares


def _scan_regular(
    fh: IO[bytes],
    name: str,
    stats: ScanStats,
    lines: Callable[[bytes | bytearray, int], Lines],
    chunk: int,
    tracker: BurstTracker,
) -> Iterator[Event]:
    # The runs' bounds come from a map of the file (a page touched per run); each run is read
    # with pread into its own bytes, so runs are independent and any searcher can take one.
    with fh:
        fd, size = fh.fileno(), os.fstat(fh.fileno()).st_size
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            spans, unterminated = list(_runs(mm, size, chunk)), mm[size - 1] != 0x0A

        def work(span: Span) -> Run:
            start, stop, too_long = span
            if too_long:
                return Run([], int(stop < size or not unterminated), 1)
            try:
                data = os.pread(fd, stop - start, start)
            except OSError as exc:
                raise InputError(f"{name}: read failed ({exc.strerror or exc})") from None
            return _candidates(data, len(data), lines)

        if stats.processes == 1:
            stats.threads = max(min(stats.threads, len(spans)), 1)  # a one-run file starts no pool
        runs = (
            forked(work, _shares(spans, stats.processes))
            if stats.processes > 1
            else threaded(work, spans, stats.threads)
        )
        line_base = 0
        try:
            for run in runs:
                yield from _emit(run, name, line_base, stats, tracker)
                line_base += run.newlines
        finally:
            runs.close()
        stats.bytes += size
        stats.lines += line_base + unterminated


def _scan_stream(
    fh: IO[bytes],
    name: str,
    stats: ScanStats,
    lines: Callable[[bytes | bytearray, int], Lines],
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
            run = _candidates(buf, end, lines)
            yield from _emit(run, name, line_base, stats, tracker)
            line_base += run.newlines
            stats.lines += run.newlines + (1 if at_eof and end and buf[end - 1] != 0x0A else 0)
            if at_eof:
                break
            view[: filled - end] = view[end:filled]
            filled -= end
