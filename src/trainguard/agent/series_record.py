"""The record of the agent's telemetry series: each closed point into the store, old ones out.

The agent (agent/tick.py) folds every tick into its `Series` (telemetry/series.py); at record the
daemon hands the points closed since the last tick to `SeriesRecorder.record`, which writes them
in one transaction (incidents/series.py) and, after a write at most once per ``prune_every_s``,
deletes the points older than ``keep_s``. A store that fails keeps the points waiting to be written next
tick, bounded: past ``max_pending`` the oldest are dropped and counted. ``keep_s`` 0: the series
stays in memory only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from trainguard.telemetry.series import SeriesPoint

__all__ = ["SeriesRecorder"]


class SeriesRecorder:
    def __init__(self, keep_s: float, max_pending: int, prune_every_s: float = 3600.0) -> None:
        self.keep_s, self.max_pending, self.prune_every_s = keep_s, max_pending, prune_every_s
        self._pending: deque[SeriesPoint] = deque()
        self._pruned_at: float | None = None
        self.written = 0  # points the store took
        self.dropped = 0  # points dropped while the store failed

    @property
    def pending(self) -> int:
        return len(self._pending)

    def record(self, open_store: Callable[[], Any], points: list[SeriesPoint], now: float) -> None:
        """Write ``points`` (and those still waiting) to the store ``open_store`` opens; prune
        when due. Raises the store's StoreError, the points kept to retry."""
        if self.keep_s <= 0:
            return
        self._pending.extend(points)
        while len(self._pending) > self.max_pending:
            self._pending.popleft()
            self.dropped += 1
        if not self._pending:
            return
        store = open_store()
        waiting = list(self._pending)
        store.add_series(waiting)
        self._pending.clear()
        self.written += len(waiting)
        if self._pruned_at is None or now - self._pruned_at >= self.prune_every_s:
            store.prune_series(now - self.keep_s)
            self._pruned_at = now
