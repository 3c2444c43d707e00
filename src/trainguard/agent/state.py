"""What the daemon keeps across restarts: where it was in the kernel log, which findings were open.

Saved atomically (temp file, fsync, rename, fsync of the directory) after the incidents of a
tick are committed, so a restart neither re-reports old kernel-log lines nor loses new ones, and a
condition that still holds (a DBE counter, a hot GPU) is not reported a second time.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.agent.judge import FindingKey
from trainguard.telemetry.resume import Cursor

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SavedState:
    cursor: Cursor | None = None
    active: Counter[FindingKey] = field(default_factory=Counter)

    def to_json(self) -> str:
        return json.dumps(
            {
                "cursor": [self.cursor.dev, self.cursor.ino, self.cursor.offset, self.cursor.tail]
                if self.cursor
                else None,
                "active": [[*k, n] for k, n in sorted(self.active.items(), key=repr)],
            }
        )


def load_state(path: Path) -> SavedState:
    """The saved state; empty when there is none or it cannot be read (said in the log)."""
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        raw = data.get("cursor")
        cursor = Cursor(int(raw[0]), int(raw[1]), int(raw[2]), str(raw[3])) if raw else None
        active: Counter[FindingKey] = Counter()
        for rule, gpu, health, action, category, n in data.get("active", []):
            active[(str(rule), None if gpu is None else int(gpu), health, action, category)] = int(n)
        return SavedState(cursor, active)
    except FileNotFoundError:
        return SavedState()
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("agent state %s unreadable (%s): starting afresh", path, exc)
        return SavedState()


def save_state(path: Path, state: SavedState) -> None:
    """Write atomically; raises OSError (e.g. ENOSPC) for the caller to report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(state.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
