"""Verifying checkpoints and finding the newest valid one (torch-free, for the supervisor too).

>>> from trainguard.checkpoint import newest_valid, verify
>>> info = newest_valid("/ckpt")             # doctest: +SKIP
>>> verify(info.path).ok                     # doctest: +SKIP
True
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint.layout import MANIFEST_NAME, CheckpointInfo, list_checkpoints, parse_step
from trainguard.checkpoint.manifest import Manifest, decode_manifest, file_crc32

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    reason: str  # "ok", or what is wrong, naming the file
    step: int | None = None
    manifest: Manifest | None = None

    def __bool__(self) -> bool:
        return self.ok


def verify(path: str | os.PathLike[str], deep: bool = True) -> VerifyResult:
    """Check a checkpoint directory: manifest integrity, every listed file present with its size,
    and (``deep``, the default) its CRC-32. Never raises for a bad checkpoint: that is the result."""
    root = Path(path)
    step = parse_step(root.name)
    try:
        data = (root / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        return VerifyResult(False, "no manifest.json (torn or incomplete save)", step)
    except OSError as exc:
        return VerifyResult(False, f"cannot read manifest.json: {exc}", step)
    try:
        manifest = decode_manifest(data)
    except ValueError as exc:
        return VerifyResult(False, f"manifest.json: {exc}", step)
    if step is not None and manifest.step != step:
        return VerifyResult(False, f"manifest step {manifest.step} != directory step {step}", step)
    if not manifest.files:
        return VerifyResult(False, "manifest lists no files", manifest.step, manifest)
    for name, entry in sorted(manifest.files.items()):
        file_path = root / name
        try:
            size = file_path.stat().st_size
        except FileNotFoundError:
            return VerifyResult(False, f"missing file {name}", manifest.step, manifest)
        if size != entry.size:
            reason = f"size mismatch in {name}: expected {entry.size} bytes, found {size}"
            return VerifyResult(False, reason, manifest.step, manifest)
        if deep:
            try:
                _, crc = file_crc32(file_path)
            except OSError as exc:
                return VerifyResult(False, f"cannot read {name}: {exc}", manifest.step, manifest)
            if crc != entry.crc32:
                reason = f"checksum mismatch in {name}: expected crc32 {entry.crc32}, found {crc}"
                return VerifyResult(False, reason, manifest.step, manifest)
    return VerifyResult(True, "ok", manifest.step, manifest)


@dataclass(frozen=True, slots=True)
class ResumeChoice:
    """What a resume finds: the newest checkpoint that verifies, and the newer ones it skips."""

    info: CheckpointInfo | None  # None: no valid checkpoint
    manifest: Manifest | None = None
    skipped: tuple[tuple[int, str], ...] = ()  # (step, why) of newer checkpoints, newest first


def choose_resume(
    directory: str | os.PathLike[str], deep: bool = True, max_step: int | None = None
) -> ResumeChoice:
    """Verify checkpoints newest first until one is valid: the one walk every resume makes (the
    Checkpointer's, the supervisor's and ``trainguard checkpoints``)."""
    skipped: list[tuple[int, str]] = []
    for info in reversed(list_checkpoints(directory)):
        if max_step is not None and info.step > max_step:
            continue
        result = verify(info.path, deep=deep)
        if result.ok and result.manifest is not None:
            return ResumeChoice(info, result.manifest, tuple(skipped))
        skipped.append((int(info.step), result.reason))
    return ResumeChoice(None, None, tuple(skipped))


def newest_valid(
    directory: str | os.PathLike[str], deep: bool = True, max_step: int | None = None
) -> CheckpointInfo | None:
    """The newest checkpoint that verifies, skipping (and logging) invalid ones; None if none."""
    choice = choose_resume(directory, deep, max_step)
    for step, reason in choice.skipped:
        log.warning("skipping invalid checkpoint step %d in %s: %s", step, directory, reason)
    return choice.info
