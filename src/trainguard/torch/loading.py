"""Reading a checkpoint that rank 0 verified: the replicated payload (decrypted when sealed),
small files checked as they are read, and the check every other rank makes that it sees the
very checkpoint rank 0 verified (only rank 0 needs the signing key for that)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoint import MANIFEST_NAME, FileEntry, Manifest, decode_manifest
from trainguard.checkpoint.manifest import crc32, crc_hex
from trainguard.checkpoint.signing import KEY_FILE_ENV, Keyring
from trainguard.errors import CheckpointCorrupt, CheckpointError
from trainguard.torch.writer import STATE_FILE


def check_same(path: Path, manifest: Manifest, rank: int) -> None:
    """On a rank other than 0: ``path`` holds the manifest rank 0 verified, and every file it
    lists has its size (the content was checked by rank 0, on the shared filesystem)."""
    try:
        mine = decode_manifest((path / MANIFEST_NAME).read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointCorrupt(
            f"rank {rank} cannot use checkpoint {path} that rank 0 chose ({exc}): "
            "the checkpoint directory must be on a filesystem every rank can read"
        ) from None
    if mine != manifest:
        raise CheckpointCorrupt(f"rank {rank} reads another manifest in {path} than the one rank 0 verified")
    for name, entry in manifest.files.items():
        try:
            size = (path / name).stat().st_size
        except OSError as exc:
            raise CheckpointCorrupt(f"rank {rank} cannot read {path / name}: {exc}") from None
        if size != entry.size:
            raise CheckpointCorrupt(f"rank {rank} finds {path / name} at {size} bytes, not {entry.size}")


def read_checked(path: Path, entry: FileEntry, signed: bool) -> bytes:
    """A file's bytes, checked against its manifest entry as they are read, so nothing can swap
    the file between the check and the use (for small files: the whole file is in memory)."""
    data = path.read_bytes()
    if signed:
        found, expected = hashlib.sha256(data).hexdigest(), entry.sha256
    else:
        found, expected = crc_hex(crc32(data)), entry.crc32
    if len(data) != entry.size or found != expected:
        raise CheckpointCorrupt(f"{path} changed after the checkpoint was verified")
    return data


def load_payload(
    path: Path, manifest: Manifest, weights_only: bool, keyring: Callable[[], Keyring]
) -> dict[str, Any]:
    """``state.pt`` of a replicated checkpoint, decrypted in memory when it is sealed."""
    entry = manifest.files.get(STATE_FILE)
    if entry is None:
        raise CheckpointCorrupt(f"the manifest of {path} lists no {STATE_FILE}")
    source: Any = path / STATE_FILE
    if entry.sealed is not None:
        from trainguard.checkpoint.sealing import MemoryFile

        source = MemoryFile(_decrypt(path, manifest, entry, keyring))
    try:
        payload = torch.load(source, map_location="cpu", weights_only=weights_only)
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint {path} passed verification but torch.load failed ({exc}); "
            "if it holds custom objects, use Checkpointer(..., weights_only=False)"
        ) from exc
    if not isinstance(payload, dict) or "trainguard" not in payload:
        raise CheckpointError(f"{path / STATE_FILE} is not a trainguard checkpoint payload")
    return payload


def _decrypt(path: Path, manifest: Manifest, entry: FileEntry, keyring: Callable[[], Keyring]) -> bytearray:
    from trainguard.checkpoint.sealing import open_sealed

    if manifest.signature is None:
        raise CheckpointCorrupt(f"{path} holds an encrypted file under an unsigned manifest")
    ring = keyring()
    key = ring.find(manifest.signature.key_id)
    if key is None:
        raise CheckpointError(
            f"{path / STATE_FILE} is encrypted with key {manifest.signature.key_id}, which is not in "
            f"{ring.source}: every rank decrypts, so every node must read the key file "
            f"(set {KEY_FILE_ENV} to one on shared storage)"
        )
    return open_sealed(path / STATE_FILE, entry, key)
