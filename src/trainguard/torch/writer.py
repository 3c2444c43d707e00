"""Writing one replicated checkpoint: ``torch.save`` into a checksumming sink, then the atomic
commit and retention. Runs in the background writer process (asynchronous saves) or in the
training process (``async_save=False``)."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import trainguard
from trainguard.checkpoint import ChecksumFile, Manifest, apply_retention, clean_stale, commit, new_tmp_dir
from trainguard.checkpoint.signing import Key, load_keyring

if TYPE_CHECKING:
    from trainguard.checkpoint.sealing import SealingFile

STATE_FILE = "state.pt"


@contextlib.contextmanager
def _no_zip_crc() -> Iterator[None]:
    """torch.save's own per-record CRC costs ~0.7 s/GB and duplicates the manifest's checksum."""
    from torch.utils.serialization import config

    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = previous


def write_replicated(
    directory: Path,
    step: int,
    payload: Any,
    world_size: int = 1,
    keep_last: int = 3,
    milestone_every: int = 0,
    key: Key | None = None,
    encrypt: bool = False,
) -> dict[str, Any]:
    """Write ``payload`` as ``step-N/state.pt`` durably, signed with ``key`` (default: the
    environment's, see ``trainguard.checkpoint.signing``) and, with ``encrypt``, encrypted at rest;
    returns timings and what retention deleted."""
    start = time.perf_counter()
    clean_stale(directory)
    tmp = new_tmp_dir(directory, step)
    try:
        sink: ChecksumFile | SealingFile
        if encrypt:
            from trainguard.checkpoint.sealing import SealingFile

            sink = SealingFile(tmp / STATE_FILE, key or load_keyring(create=True).signing, overlap=True)
        else:
            sink = ChecksumFile(tmp / STATE_FILE, overlap=True)
        try:
            with _no_zip_crc():
                torch.save(payload, sink)  # type: ignore[arg-type]  # any object with write() works
        except BaseException:
            sink.abort()
            raise
        saved = time.perf_counter()
        entry = sink.close()
        synced = time.perf_counter()
        manifest = Manifest(
            step=step,
            files={STATE_FILE: entry},
            time=time.time(),
            world_size=world_size,
            sharded=False,
            kind="replicated",
            torch_version=torch.__version__,
            trainguard_version=trainguard.__version__,
        )
        path = commit(tmp, manifest, key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_s = time.perf_counter() - start
    deleted = apply_retention(directory, step, keep_last, milestone_every)
    return {
        "step": step,
        "path": str(path),
        "bytes": entry.size,
        "write_s": write_s,  # temporary directory to durable commit
        "save_s": saved - start,  # torch.save into the page cache + checksum
        "fsync_s": synced - saved,
        "deleted": deleted,
    }
