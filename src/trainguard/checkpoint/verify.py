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
from trainguard.checkpoint.manifest import Manifest, decode_manifest, file_crc32, file_sha256, signed_bytes
from trainguard.checkpoint.signing import ALGORITHM, KEY_FILE_ENV, Trust, trust_from_env

log = logging.getLogger(__name__)

KINDS = ("replicated", "dcp")  # the loaders a manifest may name


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    reason: str  # "ok", or what is wrong, naming the file
    step: int | None = None
    manifest: Manifest | None = None
    signed: bool = False  # the manifest's signature verified with a key of the keyring

    def __bool__(self) -> bool:
        return self.ok


def verify(path: str | os.PathLike[str], deep: bool = True, trust: Trust | None = None) -> VerifyResult:
    """Check a checkpoint directory: manifest integrity and signature (``trust``, default: the
    environment's keyring, see ``signing``), every listed file present with its size, and
    (``deep``, the default) its SHA-256 (CRC-32 for an unsigned one that ``trust`` accepts). A
    sharded checkpoint may hold nothing its manifest does not list: torch's loader unpickles
    what it finds. Never raises for a bad checkpoint: that is the result (a bad key file is a
    ConfigError)."""
    trust = trust_from_env() if trust is None else trust
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
    untrusted = _untrusted(manifest, trust)
    if untrusted:
        return VerifyResult(False, untrusted, manifest.step, manifest)
    signed = manifest.signature is not None
    if manifest.kind not in KINDS:
        return VerifyResult(
            False, f"manifest names an unknown loader {manifest.kind!r}", manifest.step, manifest
        )
    if manifest.kind == "dcp":
        unlisted = _unlisted(root, manifest)
        if unlisted:
            reason = f"{unlisted} is not in the manifest (a sharded checkpoint holds only what it lists)"
            return VerifyResult(False, reason, manifest.step, manifest)
    for name, entry in sorted(manifest.files.items()):
        file_path = root / name
        try:
            size = file_path.stat().st_size
        except FileNotFoundError:
            return VerifyResult(False, f"missing file {name}", manifest.step, manifest)
        if size != entry.size:
            reason = f"size mismatch in {name}: expected {entry.size} bytes, found {size}"
            return VerifyResult(False, reason, manifest.step, manifest)
        if signed and not entry.sha256:
            return VerifyResult(False, f"signed manifest has no sha256 for {name}", manifest.step, manifest)
        if deep:
            algorithm, expected = ("sha256", entry.sha256) if signed else ("crc32", entry.crc32)
            try:
                _, found = (file_sha256 if signed else file_crc32)(file_path)
            except OSError as exc:
                return VerifyResult(False, f"cannot read {name}: {exc}", manifest.step, manifest)
            if found != expected:
                reason = f"checksum mismatch in {name}: expected {algorithm} {expected}, found {found}"
                return VerifyResult(False, reason, manifest.step, manifest)
    return VerifyResult(True, "ok", manifest.step, manifest, signed)


def _untrusted(manifest: Manifest, trust: Trust) -> str | None:
    """Why ``trust`` does not accept ``manifest``'s signature; None when it does."""
    sig = manifest.signature
    if sig is None:
        if trust.allow_unsigned:
            return None
        return (
            "manifest is not signed (written before trainguard signed checkpoints, or by someone "
            "else): refused, since a resume runs what a checkpoint holds; to accept unsigned "
            "checkpoints, set TRAINGUARD_CHECKPOINT_ALLOW_UNSIGNED=1"
        )
    if sig.alg != ALGORITHM:
        return f"manifest signature uses {sig.alg!r}, not {ALGORITHM}"
    if trust.keyring.find(sig.key_id) is None:
        return (
            f"manifest is signed with key {sig.key_id}, which is not in {trust.keyring.source}: "
            f"every node of a job must read one key file (set {KEY_FILE_ENV}), and a rotated "
            "key stays in the file while its checkpoints are kept"
        )
    if not trust.keyring.check(sig.key_id, signed_bytes(manifest), sig.mac):
        return "manifest signature does not verify: the manifest was changed after it was signed"
    return None


def _unlisted(root: Path, manifest: Manifest) -> str | None:
    """The first entry of ``root`` that is neither a listed file nor the manifest, if any."""
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        return f"the directory listing ({exc})"
    return next((n for n in names if n != MANIFEST_NAME and n not in manifest.files), None)


@dataclass(frozen=True, slots=True)
class ResumeChoice:
    """What a resume finds: the newest checkpoint that verifies, and the newer ones it skips."""

    info: CheckpointInfo | None  # None: no valid checkpoint
    manifest: Manifest | None = None
    skipped: tuple[tuple[int, str], ...] = ()  # (step, why) of newer checkpoints, newest first


def choose_resume(
    directory: str | os.PathLike[str],
    deep: bool = True,
    max_step: int | None = None,
    trust: Trust | None = None,
) -> ResumeChoice:
    """Verify checkpoints newest first until one is valid: the one walk every resume makes (the
    Checkpointer's, the supervisor's and ``trainguard checkpoints``)."""
    trust = trust_from_env() if trust is None else trust
    skipped: list[tuple[int, str]] = []
    for info in reversed(list_checkpoints(directory)):
        if max_step is not None and info.step > max_step:
            continue
        result = verify(info.path, deep=deep, trust=trust)
        if result.ok and result.manifest is not None:
            return ResumeChoice(info, result.manifest, tuple(skipped))
        skipped.append((int(info.step), result.reason))
    return ResumeChoice(None, None, tuple(skipped))


def newest_valid(
    directory: str | os.PathLike[str],
    deep: bool = True,
    max_step: int | None = None,
    trust: Trust | None = None,
) -> CheckpointInfo | None:
    """The newest checkpoint that verifies, skipping (and logging) invalid ones; None if none."""
    choice = choose_resume(directory, deep, max_step, trust)
    for step, reason in choice.skipped:
        log.warning("skipping invalid checkpoint step %d in %s: %s", step, directory, reason)
    return choice.info
