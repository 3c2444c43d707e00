"""The fault-free reference run's result, recorded once per training and reused (stdlib only).

The chaos run's accuracy is judged against the same training without faults. That result depends
only on what is trained (the script, steps, checkpoint interval, ranks) and with what (Python,
torch, trainguard), so it is recorded under a key of exactly those, and a later run of the same
training reads it instead of training again::

    $TRAINGUARD_CACHE_DIR/demo-reference/<key>.json     (default: ~/.cache/trainguard, or
                                                         $XDG_CACHE_HOME/trainguard)

A record is a real run's: the accuracy its rank 0 printed and how long its steps took (first step
to last, and the median step), with the run's job id, directory and date. Change any part of the
key and the reference runs again; so does a record without its timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from trainguard.rundir import atomic_write_bytes

CACHE_ENV = "TRAINGUARD_CACHE_DIR"


@dataclass(frozen=True, slots=True)
class Recorded:
    key: str
    accuracy: float
    job: str  # the reference run's job id
    run_dir: str
    recorded: float  # unix seconds
    training: dict[str, Any]  # what the key was made of
    train_s: float | None = None  # its first step to its last (heartbeats), no fault in between
    step_s: float | None = None  # its median step time


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "trainguard"


def training(script: Path, cmd_args: list[str], nproc: int) -> dict[str, Any]:
    """What the reference's result depends on (the key is its hash)."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    from trainguard import __version__

    return {
        "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest(),
        "args": cmd_args,
        "nproc": nproc,
        "python": platform.python_version(),
        "torch": torch_version,
        "trainguard": __version__,
    }


def key_of(what: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def load(key: str, directory: Path | None = None) -> Recorded | None:
    """The recorded reference of this training, or None (none yet, or unreadable)."""
    path = (directory or cache_dir()) / "demo-reference" / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        rec = Recorded(**data)
    except (OSError, ValueError, TypeError):
        return None
    if rec.key != key or not isinstance(rec.accuracy, (int, float)):
        return None
    if not isinstance(rec.train_s, (int, float)) or not isinstance(rec.step_s, (int, float)):
        return None  # recorded without its timing: the ETTR check needs it, run it again
    return rec


def save(rec: Recorded, directory: Path | None = None) -> Path:
    path = (directory or cache_dir()) / "demo-reference" / f"{rec.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(asdict(rec), indent=1).encode())
    return path


def record(key: str, accuracy: float, job: str, run_dir: Path, what: dict[str, Any]) -> Recorded:
    from trainguard.demo.measure import median_step_time, train_span

    return Recorded(
        key, accuracy, job, str(run_dir), time.time(), what, train_span(run_dir), median_step_time(run_dir)
    )
