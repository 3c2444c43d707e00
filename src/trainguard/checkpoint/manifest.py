"""The checkpoint manifest: what a checkpoint holds and how to check it (torch-free).

``manifest.json`` is canonical JSON (sorted keys, one-space indent) carrying its own CRC-32::

    {"checksum": "crc32", "files": {"state.pt": {"crc32": "89abcdef", "sha256": "...", "size": 1234}},
     "format_version": 1, "kind": "replicated", "manifest_crc32": "01234567", "sharded": false,
     "signature": {"alg": "hmac-sha256", "key_id": "...", "mac": "..."},
     "step": 100, "time": 1700000000.0, "torch_version": "2.13.0", "trainguard_version": "0.1.0",
     "world_size": 2}

``manifest_crc32`` covers the canonical encoding of every other field, and a reader also requires
the file bytes to equal the canonical encoding, so any changed byte is detected. CRC-32 finds
accidents only; ``signature`` (``trainguard.checkpoint.signing``) covers every field but itself
and ``manifest_crc32``, files' SHA-256 included, and finds a rewrite. A file encrypted at rest
carries ``sealed`` (``trainguard.checkpoint.sealing``); its checksums are of what is on disk. Payload files are
checked with CRC-32 (zlib's polynomial; it detects every error burst of up to 32 bits, so every
single flipped byte). ``crc32`` computes it with ISA-L (``isal``, in the ``torch`` extra; about
12 GB/s here, with carry-less multiply) when installed, else with zlib (about 3 GB/s): the same
values either way, so checkpoints written with one verify with the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
CHECKSUM_ALGORITHM = "crc32"
_READ_CHUNK = 16 << 20


@dataclass(frozen=True, slots=True)
class Sealed:
    """How a file is encrypted at rest: AES-256-GCM in ``chunk``-byte pieces under a key derived
    from the signing key and ``salt`` (see ``trainguard.checkpoint.sealing``)."""

    salt: str  # 32 hex digits, fresh for every file
    chunk: int  # plaintext bytes per piece; each piece on disk is 16 bytes longer (its tag)
    plain_size: int
    alg: str = "aes-256-gcm"

    def to_json_dict(self) -> dict[str, Any]:
        return {"alg": self.alg, "chunk": self.chunk, "plain_size": self.plain_size, "salt": self.salt}


@dataclass(frozen=True, slots=True)
class FileEntry:
    size: int
    crc32: str  # 8 lowercase hex digits
    sha256: str = ""  # 64 lowercase hex digits; required in a signed manifest
    sealed: Sealed | None = None  # encrypted at rest

    def to_json_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"crc32": self.crc32, "size": self.size}
        if self.sha256:
            out["sha256"] = self.sha256
        if self.sealed is not None:
            out["sealed"] = self.sealed.to_json_dict()
        return out


@dataclass(frozen=True, slots=True)
class Signature:
    key_id: str
    mac: str  # hex HMAC-SHA256 of ``signed_bytes(manifest)``
    alg: str = "hmac-sha256"


@dataclass(frozen=True, slots=True)
class Manifest:
    step: int
    files: dict[str, FileEntry]
    time: float
    world_size: int = 1
    sharded: bool = False
    kind: str = "replicated"  # "replicated": state.pt from one rank; "dcp": torch.distributed.checkpoint
    torch_version: str = ""
    trainguard_version: str = ""
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # small JSON-able notes (e.g. writer timings)
    signature: Signature | None = None

    def to_json_dict(self, signature: bool = True) -> dict[str, Any]:
        out = {
            "checksum": CHECKSUM_ALGORITHM,
            "extra": self.extra,
            "files": {n: e.to_json_dict() for n, e in sorted(self.files.items())},
            "format_version": self.format_version,
            "kind": self.kind,
            "sharded": self.sharded,
            "step": self.step,
            "time": self.time,
            "torch_version": self.torch_version,
            "trainguard_version": self.trainguard_version,
            "world_size": self.world_size,
        }
        if signature and self.signature is not None:
            sig = self.signature
            out["signature"] = {"alg": sig.alg, "key_id": sig.key_id, "mac": sig.mac}
        return out


def signed_bytes(manifest: Manifest) -> bytes:
    """What the signature covers: the canonical encoding of every field but the signature."""
    return _canonical(manifest.to_json_dict(signature=False))


def _canonical(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def encode_manifest(manifest: Manifest) -> bytes:
    body = manifest.to_json_dict()
    body["manifest_crc32"] = crc_hex(zlib.crc32(_canonical(body)))
    return _canonical(body)


def decode_manifest(data: bytes) -> Manifest:
    """Parse and check a manifest; raises ValueError naming what is wrong."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"manifest is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError("manifest is not a JSON object")
    if _canonical(raw) != data:
        raise ValueError("manifest bytes are not in canonical form (edited or corrupted)")
    body = dict(raw)
    stored = body.pop("manifest_crc32", None)
    if stored != crc_hex(zlib.crc32(_canonical(body))):
        raise ValueError("manifest checksum mismatch")
    if body.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"unsupported manifest format_version {body.get('format_version')!r}")
    if body.get("checksum") != CHECKSUM_ALGORITHM:
        raise ValueError(f"unsupported checksum algorithm {body.get('checksum')!r}")
    try:
        files = {str(n): _file_entry(e) for n, e in body["files"].items()}
        sig = body.get("signature")
        return Manifest(
            step=int(body["step"]),
            files=files,
            time=float(body["time"]),
            world_size=int(body["world_size"]),
            sharded=bool(body["sharded"]),
            kind=str(body["kind"]),
            torch_version=str(body["torch_version"]),
            trainguard_version=str(body["trainguard_version"]),
            extra=dict(body.get("extra") or {}),
            signature=None
            if sig is None
            else Signature(str(sig["key_id"]), str(sig["mac"]), str(sig["alg"])),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"manifest is missing or has a bad field ({exc!r})") from None


def _file_entry(raw: dict[str, Any]) -> FileEntry:
    sealed = raw.get("sealed")
    return FileEntry(
        int(raw["size"]),
        str(raw["crc32"]),
        str(raw.get("sha256", "")),
        None
        if sealed is None
        else Sealed(str(sealed["salt"]), int(sealed["chunk"]), int(sealed["plain_size"]), str(sealed["alg"])),
    )


_crc32_impl: Callable[[Any, int], int] | None = None


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a bytes-like object continuing from ``value``, as ``zlib.crc32``. Both
    implementations release the GIL on large buffers, so a helper thread can checksum while
    another writes."""
    global _crc32_impl
    if _crc32_impl is None:
        _crc32_impl = _pick_crc32()
    return _crc32_impl(data, value)


def _pick_crc32() -> Callable[[Any, int], int]:
    # imported on first use, so ``import trainguard`` stays free of third-party modules
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32
    probe = b"trainguard crc32 self-check"
    if isal_zlib.crc32(probe, 7) != zlib.crc32(probe, 7):  # never trust a faster checksum blindly
        return zlib.crc32
    return isal_zlib.crc32


def crc_hex(value: int) -> str:
    return f"{value & 0xFFFFFFFF:08x}"


def file_crc32(path: Path) -> tuple[int, str]:
    """(size, crc32 hex) of a file, read in large chunks."""
    entry = file_entry(path, sha256=False)
    return entry.size, entry.crc32


def file_sha256(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in large chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_READ_CHUNK):
            digest.update(chunk)  # hashlib releases the GIL on large buffers
            size += len(chunk)
    return size, digest.hexdigest()


def file_entry(path: Path, sha256: bool = True) -> FileEntry:
    """The manifest entry of a file on disk: size, CRC-32 and (``sha256``) SHA-256, one read."""
    crc, size = 0, 0
    digest = hashlib.sha256() if sha256 else None
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_READ_CHUNK):
            crc = crc32(chunk, crc)
            if digest is not None:
                digest.update(chunk)
            size += len(chunk)
    return FileEntry(size, crc_hex(crc), digest.hexdigest() if digest is not None else "")


def describe_files(directory: Path, names: list[str] | None = None) -> dict[str, FileEntry]:
    """FileEntry for each payload file (default: every regular file except the manifest)."""
    if names is None:
        names = sorted(e.name for e in os.scandir(directory) if e.is_file() and e.name != "manifest.json")
    return {name: file_entry(directory / name) for name in names}
