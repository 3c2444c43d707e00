"""The spool: writes waiting for a store that cannot be reached, in a bounded local file.

    >>> import tempfile, os
    >>> spool = Spool(os.path.join(tempfile.mkdtemp(), "spool.jsonl"), max_entries=2)
    >>> for n in range(3):
    ...     spool.append({"op": "verdicts", "n": n})
    >>> spool.append({"op": "incident", "n": 9})
    >>> [e["n"] for e in spool.head(10)], spool.dropped
    ([2, 9], 2)

One JSON object per line, appended and fsynced (an incident in the spool survives a crash of
the writer). Past ``max_entries`` the oldest verdicts and telemetry-series points are dropped
first (a later verdict says more than an earlier one; a series may have gaps); incidents, job
records and remediation events are never dropped, so a spool full of them grows past the bound.
Entries are replayed in order; each replayed batch is cut from the file atomically (temp file,
fsync, rename). A crash between a replay and the cut replays that batch again: every write is
idempotent, so it lands once.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import Any

DROPPABLE = frozenset({"verdicts", "series"})  # ops the spool may drop when full, oldest first
DEFAULT_MAX_ENTRIES = 50_000


class Spool:
    def __init__(self, path: str | os.PathLike[str], max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.dropped = 0  # verdict and series entries dropped because the spool was full
        self._entries: deque[dict[str, Any]] = deque(self._load())

    def _load(self) -> list[dict[str, Any]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        entries = []
        for line in text.splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:  # a line torn by a crash mid-append: the write it held never returned
                continue
        return entries

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, entry: dict[str, Any]) -> None:
        self._entries.append(entry)
        if len(self._entries) > self.max_entries and self._drop_verdicts():
            self._rewrite()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(_private(self.path, os.O_APPEND), "a") as f:  # incidents: the agent's eyes only
            f.write(json.dumps(entry, default=str, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _drop_verdicts(self) -> bool:
        # Make room for a tenth of the bound at once, so a full spool is not rewritten per entry.
        excess = len(self._entries) - self.max_entries + max(1, self.max_entries // 10)
        kept: deque[dict[str, Any]] = deque()
        dropped = 0
        for e in self._entries:
            if dropped < excess and e.get("op") in DROPPABLE:
                dropped += 1
            else:
                kept.append(e)
        self._entries = kept
        self.dropped += dropped
        return dropped > 0

    def head(self, n: int) -> list[dict[str, Any]]:
        return [self._entries[i] for i in range(min(n, len(self._entries)))]

    def cut(self, n: int) -> None:
        """Forget the first ``n`` entries (they reached the store)."""
        for _ in range(min(n, len(self._entries))):
            self._entries.popleft()
        self._rewrite()

    def _rewrite(self) -> None:
        if not self._entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(_private(tmp, os.O_TRUNC), "w") as f:
            for e in self._entries:
                f.write(json.dumps(e, default=str, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _private(path: Path, flag: int) -> int:
    """A descriptor of ``path`` for writing, created 0600 (and made so, if an older one was not)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag, 0o600)
    os.fchmod(fd, 0o600)
    return fd
