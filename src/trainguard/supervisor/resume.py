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
    """Where a resume from ``directory`` lands (`trainguard.checkpoint.choose_resume`)."""
    if directory is None:
        return ResumePoint(None)
    if not directory.is_dir():
        return ResumePoint(0)
    try:
        from trainguard.checkpoint import choose_resume

        choice = choose_resume(directory)
    except Exception as exc:  # a broken checkpoint tree must not stop the supervisor
        log.warning("cannot scan checkpoints in %s: %s", directory, exc)
        return ResumePoint(0)
    return ResumePoint(int(choice.info.step) if choice.info is not None else 0, choice.skipped)
