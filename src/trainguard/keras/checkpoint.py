"""Verified, atomic checkpoints of a Keras model's whole training state, and the resume from them.

The layout and manifest are trainguard's own (``trainguard.checkpoint``: ``step-N/`` committed by
rename, CRC-32 of every file, the newest *valid* one found on resume), so ``trainguard
checkpoints list|verify``, the supervisor's torn-checkpoint handling and the chaos drill see a
Keras job's checkpoints as they see a torch job's::

    step-00000200/
      state.npz       every variable (`trainguard.keras.state`), NumPy's format, loaded without pickle
      meta.json       {"step", "position", "epoch", "host_rng", "keras", "tensorflow", "format"}
      manifest.json   kind "keras"

    >>> ckpt = Checkpointer("ckpt/")                       # doctest: +SKIP
    >>> ckpt.save(model, Progress(step=200, position=200))  # doctest: +SKIP
    >>> ckpt.resume(model)                                 # doctest: +SKIP
    Progress(step=200, position=200, epoch=0)

Only the chief (rank 0) writes: data-parallel replicas hold the same state. Saves are
synchronous (a Keras model's variables are read on the host between steps).
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import trainguard
from trainguard.checkpoint import (
    Manifest,
    apply_retention,
    choose_resume,
    clean_stale,
    commit,
    new_tmp_dir,
)
from trainguard.checkpoint.atomic import write_bytes_file
from trainguard.errors import CheckpointError
from trainguard.keras.state import restore, snapshot

__all__ = ["KIND", "Checkpointer", "Progress"]

log = logging.getLogger(__name__)

KIND = "keras"
STATE_FILE, META_FILE = "state.npz", "meta.json"
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands: optimizer steps applied, batches taken from the data, epochs done.
    ``position`` differs from ``step`` only after a rollback (the data moved on, the state went back)."""

    step: int = 0
    position: int = 0
    epoch: int = 0


class Checkpointer:
    """Saves and resumes one model's training state in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path, keep_last: int = 3, milestone_every: int = 0) -> None:
        self.directory = Path(directory).absolute()
        self.keep_last, self.milestone_every = keep_last, milestone_every
        self.last_save_s: float | None = None  # how long the last save held training

    def save(self, model: Any, progress: Progress) -> Path:
        """Write ``model``'s state as of ``progress.step`` durably; returns the committed folder."""
        started = time.perf_counter()
        arrays, host = snapshot(model)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        meta = {
            **asdict(progress),
            "format": FORMAT,
            "host_rng": host,
            "keras": _version(type(model).__module__.split(".")[0]),  # keras or tf_keras
            "tensorflow": _version("tensorflow"),
        }
        clean_stale(self.directory)
        tmp = new_tmp_dir(self.directory, progress.step)
        try:
            files = {
                STATE_FILE: write_bytes_file(tmp / STATE_FILE, buffer.getbuffer().tobytes()),
                META_FILE: write_bytes_file(tmp / META_FILE, json.dumps(meta).encode()),
            }
            manifest = Manifest(
                step=progress.step,
                files=files,
                time=time.time(),
                kind=KIND,
                trainguard_version=trainguard.__version__,
                extra={"position": progress.position, "epoch": progress.epoch},
            )
            path = commit(tmp, manifest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        apply_retention(self.directory, progress.step, self.keep_last, self.milestone_every)
        self.last_save_s = time.perf_counter() - started
        return path

    def resume(self, model: Any, max_step: int | None = None) -> Progress | None:
        """Load the newest checkpoint that verifies (at most ``max_step``) into ``model``; None
        when there is none. Newer checkpoints that fail verification are skipped and logged."""
        choice = choose_resume(self.directory, max_step=max_step)
        for step, reason in choice.skipped:
            log.warning("skipping invalid checkpoint step %d in %s: %s", step, self.directory, reason)
        if choice.info is None or choice.manifest is None:
            return None
        if choice.manifest.kind != KIND:
            raise CheckpointError(
                f"{choice.info.path} holds a {choice.manifest.kind!r} checkpoint, not a Keras one: "
                "give the Keras job a checkpoint folder of its own"
            )
        path = choice.info.path
        try:
            meta = json.loads((path / META_FILE).read_bytes())
            with np.load(path / STATE_FILE, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: verified, yet unreadable ({exc})") from exc
        if meta.get("format") != FORMAT:
            raise CheckpointError(
                f"{path}: Keras checkpoint format {meta.get('format')!r}, expected {FORMAT}"
            )
        restore(model, arrays, meta.get("host_rng"))
        progress = Progress(int(meta["step"]), int(meta["position"]), int(meta["epoch"]))
        log.info("resumed from %s (step %d)", path, progress.step)
        return progress


def _version(module: str) -> str:
    """``module``'s installed version ("" when it is not a distribution: Keras on another backend)."""
    name = {"tf_keras": "tf-keras"}.get(module, module)
    for dist in (name, f"{name}-cpu"):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""
