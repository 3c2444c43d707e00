"""Who searches a file's runs for ``scan``: this thread, a pool of threads, or forked processes.

Sits under ``scan_file``: a run (``Span``: start, stop, too long) is searched by ``work`` into a
``Run`` (its candidate lines and newline count), and the runs come back in file order whoever
searched them. Threads suit the Hyperscan engine, whose search releases the GIL; forked
processes also share out what holds it (the newline count, the ``re`` passes) and are used when
this process runs no other thread (``alone``), as a fork copies only the calling thread.
"""

from __future__ import annotations

import collections
import dataclasses
import marshal
import os
import signal
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # a thread pool only when threads search: `logs scan` starts without it
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["Run", "Span", "alone", "forked", "threaded"]

Span = tuple[int, int, bool]  # (start, stop, too_long) of a run of whole lines


@dataclasses.dataclass(frozen=True)
class Run:
    """The first pass's answer for a run of whole lines, holding no reference to the buffer."""

    lines: list[tuple[int, bytes | bytearray]]  # (0-based index in the run, raw line) of each candidate
    newlines: int
    skipped: int  # lines with garbage bytes (left out of ``lines``) or too long to be text


def alone() -> bool:
    """Whether this process runs one thread, C threads counted (so a fork copies all of it)."""
    if not hasattr(os, "fork"):
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _in_order(
    pool: ThreadPoolExecutor, work: Callable[[Span], Run], items: Iterable[Span], ahead: int
) -> Iterator[Run]:
    """``pool.map`` with at most ``ahead`` results waiting (a log of nothing but candidates must not
    be held in memory whole while this thread parses it)."""
    pending: collections.deque[Future[Run]] = collections.deque()
    for item in items:
        pending.append(pool.submit(work, item))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def threaded(work: Callable[[Span], Run], spans: list[Span], threads: int) -> Generator[Run]:
    if threads == 1:
        yield from map(work, spans)
        return
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(threads, "trainguard-scan")
    try:
        yield from _in_order(pool, work, spans, 2 * threads)
    finally:
        pool.shutdown(cancel_futures=True)  # waits for the running searches


def forked(work: Callable[[Span], Run], shares: list[list[Span]]) -> Generator[Run]:
    """The runs of the spans of ``shares``, in order: the first share searched here, each other
    share by a child forked now that sends its runs down a pipe. A child that dies (the OOM
    killer...) or could not be forked costs only speed: what it did not send is searched here."""
    children: list[tuple[int, IO[bytes]]] = []
    try:
        for share in shares[1:]:
            try:
                children.append(_fork(work, share))
            except OSError:  # EAGAIN, ENOMEM: no process to spare, the shares left are searched here
                break
        yield from map(work, shares[0])
        for (_, pipe), share in zip(children, shares[1:], strict=False):
            sent = 0
            for run in _received(pipe):
                sent += 1
                yield run
            yield from map(work, share[sent:])
        for share in shares[1 + len(children) :]:
            yield from map(work, share)
    finally:
        for pid, pipe in children:
            os.kill(pid, signal.SIGKILL)  # one still searching (the reader stopped early); else a no-op
            os.waitpid(pid, 0)
            pipe.close()


def _fork(work: Callable[[Span], Run], share: list[Span]) -> tuple[int, IO[bytes]]:
    """(pid, pipe) of a child that sends ``work(span)`` for each span of ``share``, then exits.

    It dies with this process: it stops at the next span once orphaned, or on the closed pipe.
    Ctrl-C and SIGTERM kill it outright (blocked across the fork, so no Python handler of the
    parent's ever runs in it, nor any of the parent's code after ``fork``)."""
    parent, (read, write) = os.getpid(), os.pipe()
    quit_signals = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, quit_signals)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for number in quit_signals:
                    signal.signal(number, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(read)
                for span in share:
                    if os.getppid() != parent:
                        break
                    run = work(span)
                    data = marshal.dumps((run.lines, run.newlines, run.skipped))
                    _write_all(write, len(data).to_bytes(8, "little") + data)
                code = 0
            finally:
                os._exit(code)
    except OSError:
        os.close(read)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write)
    return pid, open(read, "rb")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _received(pipe: IO[bytes]) -> Iterator[Run]:
    """The runs a child sent, up to its exit (or its death: a torn message is dropped)."""
    while len(head := pipe.read(8)) == 8:
        body = pipe.read(length := int.from_bytes(head, "little"))
        if len(body) < length:
            return
        lines, newlines, skipped = marshal.loads(body)
        yield Run(lines, newlines, skipped)
