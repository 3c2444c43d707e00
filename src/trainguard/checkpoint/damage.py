"""Deliberate damage to a checkpoint, for chaos drills and tests (torch-free).

    >>> from trainguard.checkpoint import damage, newest_valid
    >>> damage(newest_valid("/ckpt").path, "flip")     # doctest: +SKIP
    'flipped bit 3 of byte 81234 in state.pt'

The next resume must log the checkpoint as invalid and use the one before it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from trainguard.checkpoint.layout import MANIFEST_NAME
from trainguard.checkpoint.manifest import decode_manifest

HOW = ("flip", "truncate", "delete-manifest", "delete-file")


def damage(path: str | os.PathLike[str], how: str = "flip", rng: random.Random | None = None) -> str:
    """Damage one file of the checkpoint at ``path`` in place; returns what was done."""
    if how not in HOW:
        raise ValueError(f"unknown damage {how!r}; choose one of {', '.join(HOW)}")
    rng = rng or random.Random()
    root = Path(path)
    try:
        payload = sorted(decode_manifest((root / MANIFEST_NAME).read_bytes()).files)
    except (OSError, ValueError):
        payload = []
    if how == "delete-manifest" or not payload:
        (root / MANIFEST_NAME).unlink(missing_ok=True)
        return f"deleted {MANIFEST_NAME}"
    name = rng.choice(payload)
    target = root / name
    if how == "delete-file":
        target.unlink()
        return f"deleted {name}"
    data = bytearray(target.read_bytes())
    if how == "truncate":
        size = rng.randrange(len(data)) if data else 0
        target.write_bytes(bytes(data[:size]))
        return f"truncated {name} from {len(data)} to {size} bytes"
    if not data:
        target.write_bytes(b"\0")
        return f"grew empty {name} by one byte"
    offset, bit = rng.randrange(len(data)), rng.randrange(8)
    data[offset] ^= 1 << bit
    target.write_bytes(bytes(data))
    return f"flipped bit {bit} of byte {offset} in {name}"
