"""Where the next attempt resumes: the newest checkpoint that verifies (torch-free).

The workers' Checkpointer does the loading; the supervisor checks the same thing independently so
that it can record the resume step, measure lost work (steps redone) per incident, and record an
incident for every newer checkpoint the resume has to skip (torn, truncated, bit-flipped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ResumePoint:
    step: int | None  # newest valid step; 0 when there is none; None without a directory
    skipped: tuple[tuple[int, str], ...] = ()  # (step, why) of newer checkpoints that failed to verify


def resume_point(directory: Path | None) -> ResumePoint:
    """Verify checkpoints newest first until one is valid (the same walk a resume makes)."""
    if directory is None:
        return ResumePoint(None)
    if not directory.is_dir():
        return ResumePoint(0)
    try:
        from trainguard.checkpoint import list_checkpoints, verify

        skipped: list[tuple[int, str]] = []
        for info in reversed(list_checkpoints(directory)):
            result = verify(info.path)
            if result.ok:
                return ResumePoint(int(info.step), tuple(skipped))
            skipped.append((int(info.step), result.reason))
    except Exception as exc:  # a broken checkpoint tree must not stop the supervisor
        log.warning("cannot scan checkpoints in %s: %s", directory, exc)
        return ResumePoint(0)
    return ResumePoint(0, tuple(skipped))


def newest_valid_step(directory: Path | None) -> int | None:
    """Step of the newest valid checkpoint; 0 when there is none yet; None without a directory."""
    return resume_point(directory).step
