"""Where the next attempt resumes: the newest checkpoint that verifies (torch-free).

The workers' Checkpointer does the loading; the supervisor checks the same thing independently so
that it can record the resume step and measure lost work (steps redone) per incident.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def newest_valid_step(directory: Path | None) -> int | None:
    """Step of the newest valid checkpoint; 0 when there is none yet; None without a directory."""
    if directory is None:
        return None
    if not directory.is_dir():
        return 0
    try:
        from trainguard.checkpoint import newest_valid

        info = newest_valid(directory)
    except Exception as exc:  # a broken checkpoint tree must not stop the supervisor
        log.warning("cannot scan checkpoints in %s: %s", directory, exc)
        return 0
    return int(info.step) if info is not None else 0
