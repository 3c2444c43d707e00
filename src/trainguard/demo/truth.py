"""Ground truth of a drill: when each planned fault really happened, read back from the run.

Two witnesses, the earliest wins:
- ``<run_dir>/chaos-fired/<id>``: the Guard records an in-process fault (nan, slow, hang, raise,
  the CUDA error of an xid) the moment it applies it, with the step and time (``chaos.json`` maps
  its ids to plan indexes);
- the chaos executor's `Injected` records (the sim fleet's kernel line or straggler clocks, the
  torn checkpoint).

Also reads the trainer's final test accuracy from the last attempt's rank-0 output. Stdlib only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.demo.plan import DemoPlan
from trainguard.rundir import read_findings

_ACCURACY = re.compile(r"test accuracy:\s*([0-9.]+)")
CKPT_STEP = re.compile(r"step-0*(\d+)")
_ROLLBACK = re.compile(r"rolled back from step (\d+) to the checkpoint of step (\d+)")


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """One planned fault as it really happened (``fired`` False: the run never reached it)."""

    id: str
    kind: str
    label: str
    fired: bool
    time: float | None = None  # unix seconds
    step: int | None = None
    rank: int | None = None
    gpu: int | None = None
    detail: str = ""
    checkpoint_step: int | None = None  # corrupt_checkpoint: the step of the torn checkpoint


def fired_in_process(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Plan index -> the Guard's record of firing it ({"time", "step", "pid", "kind"})."""
    try:
        entries = json.loads((run_dir / "chaos.json").read_text()).get("faults", [])
    except (OSError, ValueError, AttributeError):
        return {}
    out: dict[int, dict[str, Any]] = {}
    for position, entry in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(entry, dict) or "id" not in entry:
            continue
        guard_id = f"{position:03d}-{entry.get('kind')}-rank{entry.get('rank', 0)}-step{entry.get('step', 0)}"
        try:
            record = json.loads((run_dir / "chaos-fired" / guard_id).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("time"), (int, float)):
            out[int(entry["id"])] = record
    return out


def gpu_at(gpus_by_attempt: list[tuple[float, tuple[int, ...]]], rank: int | None, when: float) -> int | None:
    """The GPU rank ``rank`` used at ``when`` (single node: local rank == rank)."""
    if rank is None:
        return None
    gpus: tuple[int, ...] = ()
    for started, attempt_gpus in gpus_by_attempt:
        if started <= when + 1.0:
            gpus = attempt_gpus
    return gpus[rank] if 0 <= rank < len(gpus) else None


def ground_truth(
    plan: DemoPlan,
    run_dir: Path,
    executor: list[dict[str, Any]],
    gpus_by_attempt: list[tuple[float, tuple[int, ...]]],
) -> list[InjectedFault]:
    """Every planned fault with its real time, step, rank and GPU. ``executor`` holds the chaos
    executor's `Injected.to_dict()` records (``index`` is the plan index)."""
    in_process = fired_in_process(run_dir)
    by_index = {int(e["index"]): e for e in executor if "index" in e}
    out: list[InjectedFault] = []
    for index, f in enumerate(plan.faults):
        seen: list[tuple[float, int | None, str]] = []
        if index in in_process:
            rec = in_process[index]
            what = (
                "CUDA error raised in the rank"
                if f.kind == "xid"
                else f"{rec.get('kind')} applied in the rank"
            )
            seen.append((float(rec["time"]), rec.get("step"), what))
        if index in by_index:
            rec = by_index[index]
            seen.append((float(rec["time"]), rec.get("step"), str(rec.get("detail", ""))))
        if not seen:
            out.append(InjectedFault(f.id, f.kind, f.label, False, rank=f.rank))
            continue
        seen.sort(key=lambda s: s[0])
        when, step, _ = seen[0]
        gpu = gpu_at(gpus_by_attempt, f.rank, when)
        if index in by_index and by_index[index].get("gpu") is not None:
            gpu = int(by_index[index]["gpu"])
        detail = "; ".join(dict.fromkeys(s[2] for s in seen if s[2]))
        ckpt = None
        if f.kind == "corrupt_checkpoint":
            m = CKPT_STEP.search(detail)
            ckpt = int(m.group(1)) if m else None
        out.append(InjectedFault(f.id, f.kind, f.label, True, when, step, f.rank, gpu, detail, ckpt))
    return out


def read_accuracy(run_dir: Path) -> float | None:
    """The last "test accuracy: X" rank 0 printed (the finishing attempt's), or None."""
    found: list[tuple[int, float]] = []
    for path in run_dir.glob("logs/*/attempt*/rank0.stdout"):
        try:
            attempt = int(path.parent.name.removeprefix("attempt"))
            matches = _ACCURACY.findall(path.read_text(errors="replace"))
        except (OSError, ValueError):
            continue
        if matches:
            found.append((attempt, float(matches[-1])))
    return max(found)[1] if found else None


def rollback_steps(run_dir: Path, after: float) -> int | None:
    """Steps thrown away by the Guard's first numerics rollback at or after ``after`` (unix s)."""
    for _rank, _step, f in read_findings(run_dir):
        m = _ROLLBACK.search(f.reason) if f.rule == "numerics.rollback" else None
        if m and (f.time or 0.0) >= after - 1.0:
            return max(0, int(m.group(1)) - int(m.group(2)))
    return None
