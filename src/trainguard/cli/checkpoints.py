"""`trainguard checkpoints list|verify DIR`: what is in a checkpoint directory and what would resume.

    trainguard checkpoints list ckpt/           # every checkpoint, its size, age, and whether it verifies
    trainguard checkpoints verify ckpt/         # exit 0 when the newest checkpoint is valid
    trainguard checkpoints verify ckpt/step-00000300 --json
    trainguard checkpoints key                  # where the signing key is, and the ids it accepts
    trainguard checkpoints key --rotate         # a new signing key; the old ones still verify

Verification checks the manifest's signature and reads every file, checking sizes and SHA-256
against the manifest, exactly as a resume does (torch-free, so it runs on a login node). See
docs/checkpoints.md for the layout and docs/security.md for the keys.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from trainguard.errors import InputError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "checkpoints",
        help="list and verify trainguard checkpoints (what a resume would load)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="checkpoints_command", metavar="ACTION", required=True)
    for name, func, text in (
        ("list", _list, "every checkpoint in DIR, newest last, with its verification"),
        ("verify", _verify, "verify DIR's newest checkpoint (or one step-* directory); exit 1 if invalid"),
    ):
        q = sub.add_parser(name, help=text, description=text)
        q.add_argument(
            "path", type=Path, metavar="DIR", help="a checkpoint directory (or a step-* directory)"
        )
        q.add_argument("--json", action="store_true", help="one JSON object instead of a table")
        q.add_argument("--quick", action="store_true", help="check sizes only, not checksums")
        q.set_defaults(func=func)
    q = sub.add_parser(
        "key",
        help="the checkpoint signing keys: where they are, their ids; --rotate adds one",
        description="Show the keyring checkpoints are signed and verified with (never a secret).",
    )
    q.add_argument(
        "--rotate", action="store_true", help="put a fresh signing key first; old keys still verify"
    )
    q.set_defaults(func=_key)


def _rows(directory: Path, quick: bool) -> list[dict[str, Any]]:
    from trainguard.checkpoint import list_checkpoints, read_latest, verify

    if not directory.is_dir():
        raise InputError(f"{directory}: no such directory (pass the --checkpoint-dir your training used)")
    latest = read_latest(directory)
    rows = []
    for info in list_checkpoints(directory):
        result = verify(info.path, deep=not quick)
        m = result.manifest
        rows.append(
            {
                "step": info.step,
                "path": str(info.path),
                "valid": result.ok,
                "reason": result.reason,
                "latest": info.step == latest,
                "bytes": sum(f.size for f in m.files.values()) if m else None,
                "time": m.time if m else None,
                "world_size": m.world_size if m else None,
                "kind": m.kind if m else None,
            }
        )
    return rows


def _list(args: argparse.Namespace) -> int:
    rows = _rows(args.path, args.quick)
    resume = next((r["step"] for r in reversed(rows) if r["valid"]), None)
    if args.json:
        print(json.dumps({"directory": str(args.path), "resume_step": resume, "checkpoints": rows}))
        return 0
    if not rows:
        print(f"{args.path}: no checkpoints")
        return 0
    print(f"{'STEP':>10}  {'SIZE':>9}  {'AGE':>8}  {'WORLD':>5}  {'KIND':<10}  STATUS")
    for r in rows:
        size = human_size(r["bytes"]) if r["bytes"] is not None else "-"
        age = _age(time.time() - r["time"]) if r["time"] else "-"
        status = "ok" if r["valid"] else f"INVALID: {r['reason']}"
        mark = "  <- latest pointer" if r["latest"] else ""
        world = r["world_size"] if r["world_size"] is not None else "-"
        print(f"{r['step']:>10}  {size:>9}  {age:>8}  {world:>5}  {r['kind'] or '-':<10}  {status}{mark}")
    print(
        f"a resume would load step {resume}"
        if resume is not None
        else "no valid checkpoint: a resume starts at 0"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from trainguard.checkpoint import choose_resume, parse_step, verify

    path: Path = args.path
    if parse_step(path.name) is None:  # a checkpoint directory: verify its newest checkpoint
        rows = _rows(path, args.quick)
        if not rows:
            raise InputError(f"{path}: no checkpoints to verify")
        target = Path(rows[-1]["path"])
    else:
        target = path
    result = verify(target, deep=not args.quick)
    fallback = None
    if not result.ok and target != path:
        info = choose_resume(path, deep=not args.quick).info  # this command reports what it skips
        fallback = info.step if info else None
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(target),
                    "valid": result.ok,
                    "reason": result.reason,
                    "step": result.step,
                    "signed": result.signed,
                    "resume_step": fallback if not result.ok else result.step,
                }
            )
        )
    else:
        print(f"{target}: {'ok' if result.ok else 'INVALID: ' + result.reason}")
        if not result.ok and target != path:
            print(
                f"a resume would skip it and load step {fallback}"
                if fallback is not None
                else "no valid checkpoint left: a resume starts at 0"
            )
    return 0 if result.ok else 1


def _key(args: argparse.Namespace) -> int:
    import os

    from trainguard.checkpoint.signing import KEY_ENV, key_path, load_keyring, rotate

    if args.rotate:
        if os.environ.get(KEY_ENV):
            raise InputError(f"the keyring comes from ${KEY_ENV}: rotate it where that variable is set")
        key = rotate(key_path())
        print(f"new signing key {key.id} first in {key_path()}; the old keys still verify")
        return 0
    ring = load_keyring()
    print(f"keyring: {ring.source}")
    if not ring.keys:
        print("no key yet: the first save makes one (0600)")
    for i, key in enumerate(ring.keys):
        print(f"  {key.id}  {'signs and verifies' if i == 0 else 'verifies'}")
    return 0


def human_size(n: int) -> str:
    """Bytes in the unit that reads best: ``812B``, ``4.0K``, ``12.5M``, ``1.2G``, ``3.4T``.

    >>> human_size(812), human_size(4096), human_size(13107200), human_size(5 * 2**40)
    ('812B', '4.0K', '12.5M', '5.0T')
    """
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        if value < 1024:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}T"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
