"""Checkpoint layout, manifest and verification, torch-free (``trainguard.torch`` writes them).

The supervisor and the chaos drill use this to find the resume point without importing torch::

    >>> from trainguard.checkpoint import list_checkpoints, newest_valid, verify
    >>> [c.step for c in list_checkpoints("/ckpt")]      # doctest: +SKIP
    [100, 200, 300]
    >>> newest_valid("/ckpt")                             # doctest: +SKIP
    CheckpointInfo(step=300, path=PosixPath('/ckpt/step-00000300'))

Layout and manifest: see ``trainguard.checkpoint.layout`` / ``.manifest`` and docs/checkpoints.md.
"""

from __future__ import annotations

from trainguard.checkpoint.atomic import ChecksumFile, clean_stale, commit, remove_checkpoint
from trainguard.checkpoint.damage import damage
from trainguard.checkpoint.layout import (
    LATEST_NAME,
    MANIFEST_NAME,
    CheckpointInfo,
    list_checkpoints,
    new_tmp_dir,
    parse_step,
    read_latest,
    step_dir_name,
)
from trainguard.checkpoint.manifest import (
    FORMAT_VERSION,
    FileEntry,
    Manifest,
    decode_manifest,
    describe_files,
    encode_manifest,
)
from trainguard.checkpoint.retention import apply_retention, plan_deletions
from trainguard.checkpoint.verify import ResumeChoice, VerifyResult, choose_resume, newest_valid, verify

__all__ = [
    "FORMAT_VERSION",
    "LATEST_NAME",
    "MANIFEST_NAME",
    "CheckpointInfo",
    "ChecksumFile",
    "FileEntry",
    "Manifest",
    "ResumeChoice",
    "VerifyResult",
    "apply_retention",
    "choose_resume",
    "clean_stale",
    "commit",
    "damage",
    "decode_manifest",
    "describe_files",
    "encode_manifest",
    "list_checkpoints",
    "new_tmp_dir",
    "newest_valid",
    "parse_step",
    "plan_deletions",
    "read_latest",
    "remove_checkpoint",
    "step_dir_name",
    "verify",
]
