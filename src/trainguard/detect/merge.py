"""Line findings -> event findings: the stateful step between the line parsers and their readers.

A line parser judges one line; some failures print several. ``BurstTracker`` marks an Xid 45 that
echoes another Xid on the same GPU as sympathetic; ``EventMerger`` folds the lines of one
training-log failure into its first line (torch prints one NCCL watchdog timeout as four to six
``[E...]`` lines, and one CUDA error as the exception, the watchdog's copy and ``what():``)::

    >>> from trainguard.detect.training_log import classify_training_line
    >>> lines = ["[rank3]:[E1124 10:14:02.1 1 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
    ...          "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600042 milliseconds",
    ...          "[rank3]:[E1124 10:14:02.2 1 ProcessGroupNCCL.cpp:630] [Rank 3] Some NCCL operations have "
    ...          "failed or timed out."]
    >>> events = [replace(classify_training_line(t), line_no=n) for n, t in enumerate(lines, 1)]
    >>> len(list(merge_events(events)))
    1
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from trainguard.actions import Advice
from trainguard.detect.training_log import line_rank
from trainguard.records import Category, Event, EventKind, Severity

__all__ = ["BurstTracker", "EventMerger", "merge_events"]


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
        return replace(event, sympathetic=True, severity=Severity.INFO, action=Advice.IGNORE)


class EventMerger:
    """Tells whether a training finding starts a new event or continues the one before it.

    A continuation has the category and rank of a finding at most ``window_lines`` lines earlier
    in the same file, and, when both lines carry a time, at most ``window_s`` later. A run of
    identical errors (one device-side assertion per CUDA thread) is one event for the same reason.
    Without line numbers (a live stream such as the supervisor's tail of each rank's output) the
    time alone decides, and an untimed finding starts a new event. Kernel-log events always do.
    """

    def __init__(self, window_lines: int = 50, window_s: float = 5.0) -> None:
        self.window_lines = window_lines
        self.window_s = window_s
        self._last: dict[tuple[str | None, int | None, Category], tuple[int | None, float | None]] = {}

    def is_new(self, event: Event) -> bool:
        if event.kind is not EventKind.TRAINING:
            return True
        key = (event.path, line_rank(event.text), event.category)
        seen = self._last.get(key)
        self._last[key] = (event.line_no, event.time)
        if seen is None:
            return True
        no, t = seen
        timed = t is not None and event.time is not None
        if no is None or event.line_no is None:  # a stream without line numbers: time alone decides
            return not (timed and abs((event.time or 0.0) - (t or 0.0)) <= self.window_s)
        near = 0 <= event.line_no - no <= self.window_lines
        if near and timed:
            near = abs((event.time or 0.0) - (t or 0.0)) <= self.window_s
        return not near


def merge_events(events: Iterable[Event], merger: EventMerger | None = None) -> Iterator[Event]:
    """The events that start a failure (each event's first line), in order."""
    merger = merger or EventMerger()
    return (e for e in events if merger.is_new(e))
