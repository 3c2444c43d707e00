"""Writing a checkpoint durably (torch-free): a checksumming file sink and the atomic commit.

The commit protocol, in order (each step durable before the next):

1. payload files are written into ``.tmp-step-N-...`` next to the target and fsync'd;
2. ``manifest.json`` (sizes, CRC-32 and SHA-256 of every file, signed: see ``signing``) is
   written and fsync'd, then the directory;
3. the temporary directory is renamed to ``step-N`` and the parent directory fsync'd;
4. the ``latest`` pointer is replaced atomically (temp file + rename), last.

Only ``rename`` and ``fsync`` are relied on (no flock), so this works on local disks and on
shared filesystems that honour them (NFS, Lustre, GPFS).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import logging
import os
import queue
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.checkpoint.layout import (
    MANIFEST_NAME,
    TMP_PREFIX,
    TRASH_PREFIX,
    step_dir_name,
    write_latest,
)
from trainguard.checkpoint.manifest import (
    FileEntry,
    Manifest,
    Signature,
    crc32,
    crc_hex,
    encode_manifest,
    file_entry,
    signed_bytes,
)
from trainguard.checkpoint.signing import ALGORITHM, Key, load_keyring
from trainguard.rundir import fsync_dir

log = logging.getLogger(__name__)

_SLICE = 64 << 20  # write + checksum in 64 MiB slices, starting writeback behind each one
_SMALL = 1 << 20
_SYNC_FILE_RANGE_WRITE = 2


def _find_sync_file_range() -> Callable[[int, int, int, int], object] | None:
    """libc's sync_file_range (Linux; Python's os module does not expose it). Elsewhere None:
    the final fsync then does all the work."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_sync_file_range = _find_sync_file_range()


class ChecksumFile:
    """A write-only file that computes CRC-32, SHA-256 and size of what passes through it.

    ``write`` accepts any buffer (torch.save hands over memoryviews of tensor storage, so nothing is
    copied in Python). Large buffers are written in 64 MiB slices; with ``overlap=True`` their
    checksum runs on a helper thread while the next slice is written (the CRC and os.write both
    release the GIL), so the checksum costs no wall time. Then a buffer handed to ``write`` must
    stay unchanged until ``close()`` (true for torch.save of tensors nobody modifies meanwhile).
    """

    def __init__(self, path: Path, overlap: bool = False) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.crc = 0
        self.size = 0
        self._sha = hashlib.sha256()
        self._queue: queue.SimpleQueue[memoryview | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if overlap:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._checksum_loop, daemon=True, name="crc32")
            self._thread.start()

    def _checksum_loop(self) -> None:
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            try:
                self.crc = crc32(item, self.crc)
                self._sha.update(item)  # releases the GIL on large buffers, as crc32 does
            except BaseException as exc:  # reported by close()
                self._error = exc

    def write(self, data: object) -> int:
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        total = len(view)
        if self._queue is not None and total < _SMALL:
            view = memoryview(bytes(view))  # small header records may be temporaries: keep a copy
        for start in range(0, total, _SLICE):
            chunk = view[start : start + _SLICE]
            part, offset = chunk, self.size
            while len(part):
                n = os.write(self._fd, part)
                part = part[n:]
            self.size += len(chunk)
            if _sync_file_range is not None and len(chunk) >= (1 << 20):
                with contextlib.suppress(OSError):
                    _sync_file_range(self._fd, offset, len(chunk), _SYNC_FILE_RANGE_WRITE)
            if self._queue is not None:
                self._queue.put(chunk)
            else:
                self.crc = crc32(chunk, self.crc)
                self._sha.update(chunk)
        return total

    def flush(self) -> None:
        """Nothing buffered in user space; durability comes from close()."""

    def _join(self) -> None:
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def close(self) -> FileEntry:
        """fsync and close; returns the file's entry for the manifest."""
        self._join()
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1
        if self._error is not None:
            raise self._error
        return FileEntry(self.size, crc_hex(self.crc), self._sha.hexdigest())

    def abort(self) -> None:
        self._join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_bytes_file(path: Path, data: bytes) -> FileEntry:
    sink = ChecksumFile(path)
    try:
        sink.write(data)
    except BaseException:
        sink.abort()
        raise
    return sink.close()


def sign(manifest: Manifest, key: Key, directory: Path) -> Manifest:
    """``manifest`` signed with ``key``; a file entry without its SHA-256 is hashed from
    ``directory`` first (the writers compute it while writing)."""
    files = {
        name: entry
        if entry.sha256
        else dataclasses.replace(entry, sha256=file_entry(directory / name).sha256)
        for name, entry in manifest.files.items()
    }
    unsigned = dataclasses.replace(manifest, files=files, signature=None)
    return dataclasses.replace(
        unsigned, signature=Signature(key.id, key.mac(signed_bytes(unsigned)), ALGORITHM)
    )


def commit(tmp_dir: Path, manifest: Manifest, key: Key | None = None) -> Path:
    """Sign the manifest (with ``key``, else the environment's signing key: see ``signing``),
    write it into ``tmp_dir`` and atomically publish it as ``step-N``; returns the path.

    Payload files must already be fsync'd. If ``step-N`` exists (a corrupt or abandoned
    checkpoint of the same step), it is moved aside first and deleted after the commit.
    """
    manifest = sign(manifest, key if key is not None else load_keyring(create=True).signing, tmp_dir)
    directory = tmp_dir.parent
    target = directory / step_dir_name(manifest.step)
    manifest_path = tmp_dir / MANIFEST_NAME
    with open(manifest_path, "wb") as f:
        f.write(encode_manifest(manifest))
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp_dir)
    old: Path | None = None
    if target.exists():
        old = directory / f"{TRASH_PREFIX}{target.name}-{secrets.token_hex(4)}"
        os.replace(target, old)
    os.replace(tmp_dir, target)
    fsync_dir(directory)
    write_latest(directory, manifest.step)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint: first rename it out of the ``step-*`` namespace (atomic), then remove."""
    trash = path.parent / f"{TRASH_PREFIX}{path.name}-{secrets.token_hex(4)}"
    try:
        os.replace(path, trash)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


def clean_stale(directory: Path, keep: Path | None = None, min_age_s: float = 0.0) -> int:
    """Remove temporary and trash directories left by crashed saves; returns how many."""
    removed = 0
    now = time.time()
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not entry.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            continue
        path = Path(entry.path)
        if keep is not None and path == keep:
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
        except FileNotFoundError:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        removed += 1
    if removed:
        log.info("removed %d stale temporary checkpoint entries in %s", removed, directory)
    return removed
