"""Checkpoint directory layout: names, listing and the ``latest`` pointer (torch-free).

    <directory>/
      latest                        text: the name of the newest committed checkpoint (moved last)
      step-00000100/                one committed checkpoint
        manifest.json               written last inside the temporary directory
        state.pt | *.distcp ...     payload files listed in the manifest
      .tmp-step-00000200-<pid>-<n>  a save in progress (or torn by a crash); readers ignore it
      .trash-step-00000050-<n>      a checkpoint being deleted by retention; readers ignore it

Readers never trust ``latest`` alone: they scan the ``step-*`` directories newest first and verify
them, so a crash between the rename and the pointer move loses nothing.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from trainguard.rundir import atomic_write_bytes

MANIFEST_NAME = "manifest.json"
LATEST_NAME = "latest"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    step: int
    path: Path


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    """The step of a committed checkpoint directory name, or None for anything else."""
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def list_checkpoints(directory: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """Committed checkpoint directories (valid or not), oldest step first; [] if none."""
    root = Path(directory)
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        step = parse_step(entry.name)
        if step is not None and entry.is_dir(follow_symlinks=False):
            found.append(CheckpointInfo(step, root / entry.name))
    return sorted(found, key=lambda info: info.step)


def new_tmp_dir(directory: Path, step: int) -> Path:
    """A fresh temporary directory next to the target, so the final rename stays on one filesystem."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{TMP_PREFIX}{step_dir_name(step)}-{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    return path


def read_latest(directory: str | os.PathLike[str]) -> int | None:
    """The step the ``latest`` pointer names (a hint only: see the module docstring)."""
    try:
        text = (Path(directory) / LATEST_NAME).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return parse_step(text)


def write_latest(directory: Path, step: int) -> None:
    atomic_write_bytes(directory / LATEST_NAME, (step_dir_name(step) + "\n").encode())
