"""Which checkpoints to delete after a new one is durable (pure planning + a small executor)."""

from __future__ import annotations

from pathlib import Path

from trainguard.checkpoint.atomic import remove_checkpoint
from trainguard.checkpoint.layout import list_checkpoints


def plan_deletions(steps: list[int], current: int, keep_last: int, milestone_every: int = 0) -> list[int]:
    """Steps to delete, given the committed ``steps`` and the just-written ``current`` one.

    Kept: the ``keep_last`` newest at or before ``current`` (``current`` always among them),
    every step that is a multiple of ``milestone_every`` (when > 0), and everything newer than
    ``current`` (left by an abandoned timeline; it is replaced when the run gets there).
    ``keep_last`` <= 0 keeps everything.
    """
    if keep_last <= 0:
        return []
    timeline = sorted(s for s in set(steps) if s <= current)
    keep = set(timeline[-keep_last:]) | {current}
    if milestone_every > 0:
        keep |= {s for s in timeline if s > 0 and s % milestone_every == 0}
    return [s for s in timeline if s not in keep]


def apply_retention(directory: Path, current: int, keep_last: int, milestone_every: int = 0) -> list[int]:
    """Delete what ``plan_deletions`` says; call only once ``current`` is durable. Returns the steps."""
    infos = {info.step: info.path for info in list_checkpoints(directory)}
    doomed = plan_deletions(list(infos), current, keep_last, milestone_every)
    for step in doomed:
        remove_checkpoint(infos[step])
    return doomed
