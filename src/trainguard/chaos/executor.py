"""Carries out a chaos plan during a supervised run, so every fault leaves real evidence.

External faults are done here: signals to the rank's process (kill, stop), the simulated node's
real-format Xid kernel line on the GPU the rank uses, flipped bytes in the newest checkpoint.
In-process faults (nan, slow, hang, raise, exit, and the CUDA error of an xid) are written to
``$TRAINGUARD_RUN_DIR/chaos.json`` before the workers start; the workers' Guard applies them at
step boundaries, exactly once per run. They are step-triggered only (the Guard reads the file
once, when it starts), while external faults take a time or a step.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.chaos.plan import ChaosPlan, Fault, FaultKind
from trainguard.rundir import atomic_write_bytes

log = logging.getLogger(__name__)

CHAOS_FILE = "chaos.json"
FIRED_DIR = "chaos-fired"  # where the Guard records the faults it fired


@dataclass(frozen=True, slots=True)
class Injected:
    """One fault as it was actually injected (the ground truth a drill report matches against)."""

    index: int  # position in the plan
    fault: Fault
    time: float
    step: int | None
    rank: int | None
    gpu: int | None
    pid: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.fault.kind.value,
            "label": self.fault.label,
            "time": self.time,
            "step": self.step,
            "rank": self.rank,
            "gpu": self.gpu,
            "pid": self.pid,
            "detail": self.detail,
            "fault": self.fault.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Injected:
        """The value `to_dict` wrote (a replica group's result, read back by the replica loop)."""
        fault = Fault.from_dict(data.get("fault") or {"kind": data["kind"], "name": data.get("label", "")})
        return cls(
            int(data["index"]),
            fault,
            float(data["time"]),
            data.get("step"),
            data.get("rank"),
            data.get("gpu"),
            data.get("pid"),
            str(data.get("detail", "")),
        )


class ChaosExecutor:
    def __init__(
        self,
        plan: ChaosPlan,
        run_dir: Path,
        started: float,
        sim: Any = None,
        checkpoint_dir: Path | None = None,
    ) -> None:
        self.plan = plan
        self.run_dir = run_dir
        self.started = started
        self.sim = sim
        self.checkpoint_dir = checkpoint_dir
        self.fired: dict[int, Injected] = {}
        self._entries: list[dict[str, Any]] = []
        self._guard_ids: dict[int, str] = {}  # plan index -> the Guard's fault id
        self.refused: set[int] = set()  # faults that cannot fire in this job (see plan.refusal)

    def prepare(self) -> None:
        """Write every in-process fault to chaos.json before the workers start (the Guard reads
        it once, at start, and keeps its own rank's). Each node writes the same file."""
        self._entries, self._guard_ids = [], {}
        for i, fault in enumerate(self.plan.faults):
            entry = _in_process_entry(fault, fault.step) if fault.step is not None else None
            if entry is not None:
                # The Guard names a fault by its position in chaos.json (trainguard.chaos.inject).
                pos = len(self._entries)
                self._guard_ids[i] = f"{pos:03d}-{entry['kind']}-rank{fault.rank}-step{fault.step}"
                self._entries.append({**entry, "id": i})
        self._write()

    def tick(
        self,
        now: float,
        step: int | None,
        pids: dict[int, int],
        gpu_of: Callable[[int], int | None],
    ) -> list[Injected]:
        """Fire every due fault of the ranks running here; returns what fired this time.

        In-process faults are reported when the Guard records firing them (chaos-fired/), with
        the Guard's own time and step: that is the ground truth a drill report matches against."""
        out: list[Injected] = []
        for i, fault in enumerate(self.plan.faults):
            if i in self.fired or i in self.refused:
                continue
            guard_id = self._guard_ids.get(i)
            if guard_id is not None:
                record = _read_fired(self.run_dir / FIRED_DIR / guard_id)
                if record is None:
                    continue
                injected = self._fire(
                    i, fault, float(record.get("time", now)), record.get("step"), pids, gpu_of
                )
            else:
                if not self._due(fault, now, step):
                    continue
                if fault.rank is not None and fault.rank not in pids:
                    continue  # another node's rank (or not started yet)
                if fault.rank is None and 0 not in pids:
                    continue  # node-wide faults are done by the node that hosts rank 0
                injected = self._fire(i, fault, now, step, pids, gpu_of)
            self.fired[i] = injected
            out.append(injected)
            log.warning("chaos: injected %s (%s)", fault.label, injected.detail)
        return out

    def _due(self, fault: Fault, now: float, step: int | None) -> bool:
        if fault.at_s is not None:
            return now - self.started >= fault.at_s
        return step is not None and fault.step is not None and step >= fault.step

    def _fire(
        self,
        i: int,
        fault: Fault,
        now: float,
        step: int | None,
        pids: dict[int, int],
        gpu_of: Callable[[int], int | None],
    ) -> Injected:
        rank = fault.rank
        pid = pids.get(rank) if rank is not None else None
        gpu = gpu_of(rank) if rank is not None else None
        if fault.kind is FaultKind.KILL:
            sig = getattr(signal, fault.signal, signal.SIGKILL)
            detail = _signal(pid, sig)
        elif fault.kind is FaultKind.STOP:
            detail = _signal(pid, signal.SIGSTOP)
        elif fault.kind is FaultKind.CORRUPT_CHECKPOINT:
            detail = corrupt_newest_checkpoint(self.checkpoint_dir, fault.bytes)
        elif fault.kind is FaultKind.XID:  # the rank is dying of the CUDA error right now
            raised = fault.cuda_message().splitlines()[0]  # torch's first line; the rest is advice
            detail = sim_xid(self.sim, fault.xid, gpu) + f"; rank raised {raised!r}"
        elif fault.kind is FaultKind.SLOW:
            detail = sim_straggler(self.sim, gpu) + f"; rank sleeps {fault.delay_s}s per step"
        elif fault.kind is FaultKind.WRONG_PRODUCTS:
            detail = sim_wrong_products(self.sim, gpu, fault.rate)
        elif fault.kind is FaultKind.THROTTLE:
            detail = sim_throttle(self.sim, gpu, fault.fraction, fault.duration_s)
        else:
            detail = f"{fault.kind.value} fired inside rank {rank} at step {step}"
        return Injected(i, fault, now, step, rank, gpu, pid, detail)

    def _write(self) -> None:
        path = self.run_dir / CHAOS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps({"faults": self._entries}, indent=1).encode())


def _read_fired(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _in_process_entry(fault: Fault, step: int) -> dict[str, Any] | None:
    base: dict[str, Any] = {"rank": fault.rank, "step": step}
    if fault.kind is FaultKind.NAN:
        return {**base, "kind": "nan", **({"recurs": True} if fault.recurs else {})}
    if fault.kind is FaultKind.HANG:
        return {**base, "kind": "hang"}
    if fault.kind is FaultKind.SLOW:
        return {**base, "kind": "slow", "delay_s": fault.delay_s, "steps": fault.steps}
    if fault.kind is FaultKind.RAISE:
        return {
            **base,
            "kind": "raise",
            "exc": fault.exc,
            "message": fault.message or "chaos: injected failure",
        }
    if fault.kind is FaultKind.EXIT:
        return {**base, "kind": "exit", "code": fault.code}
    if fault.kind is FaultKind.XID:
        return {**base, "kind": "raise", "exc": "RuntimeError", "message": fault.cuda_message()}
    return None


def _signal(pid: int | None, sig: signal.Signals) -> str:
    if pid is None:
        return f"no process to send {sig.name} to"
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return f"pid {pid} already gone ({sig.name} not sent)"
    return f"{sig.name} sent to pid {pid}"


def sim_xid(sim: Any, code: int, gpu: int | None) -> str:
    """Make the simulated node log the real-format Xid line for ``gpu`` now."""
    if sim is None or gpu is None:
        return "no simulated node: no kernel line written (use --backend sim)"
    try:
        sim.now().xid(code, gpu=gpu)
    except Exception as exc:
        log.warning("simulated node could not inject Xid %s on GPU %s: %s", code, gpu, exc)
        return f"simulated node refused Xid {code}: {exc}"
    return f"Xid {code} logged for GPU {gpu}"


def sim_straggler(sim: Any, gpu: int | None) -> str:
    if sim is None or gpu is None:
        return "no simulated node: no clock telemetry changed"
    try:
        sim.now().straggler(gpu=gpu)
    except Exception as exc:
        return f"simulated node refused straggler: {exc}"
    return f"GPU {gpu} clocks stuck low"


def sim_wrong_products(sim: Any, gpu: int | None, rate: float) -> str:
    """Make the simulated GPU return wrong matrix products from now on (no telemetry symptom)."""
    if sim is None or gpu is None:
        return "no simulated node: no GPU made to compute wrong products (use --backend sim)"
    try:
        sim.now().wrong_products(gpu=gpu, rate=rate)
    except Exception as exc:
        return f"simulated node refused wrong_products: {exc}"
    return f"GPU {gpu} returns wrong matrix products ({rate:g} of their results); no telemetry symptom"


def sim_throttle(sim: Any, gpu: int | None, fraction: float, duration_s: float | None) -> str:
    """Hold the simulated GPU's clock at ``fraction`` of max (a software power cap) from now on."""
    if sim is None or gpu is None:
        return "no simulated node: no GPU throttled (use --backend sim)"
    try:
        sim.now().throttled(gpu=gpu, fraction=fraction, duration_s=duration_s)
    except Exception as exc:
        return f"simulated node refused throttle: {exc}"
    until = f" for {duration_s:g}s" if duration_s is not None else ""
    return f"GPU {gpu} power-capped to {fraction:.0%} of its clock{until}; no health rule fires"


def corrupt_newest_checkpoint(checkpoint_dir: Path | None, n_bytes: int = 64) -> str:
    """Flip ``n_bytes`` bytes in the middle of the largest file of the newest checkpoint."""
    if checkpoint_dir is None or not checkpoint_dir.is_dir():
        return "no checkpoint directory: nothing corrupted"
    newest = _newest_checkpoint(checkpoint_dir)
    if newest is None:
        return f"no checkpoint in {checkpoint_dir} yet: nothing corrupted"
    files = [p for p in newest.rglob("*") if p.is_file() and "manifest" not in p.name]
    if not files:
        return f"{newest} has no data file: nothing corrupted"
    target = max(files, key=lambda p: p.stat().st_size)
    size = target.stat().st_size
    with open(target, "r+b") as f:
        f.seek(max(0, size // 2 - n_bytes // 2))
        data = f.read(n_bytes)
        f.seek(max(0, size // 2 - n_bytes // 2))
        f.write(bytes(b ^ 0xFF for b in data))
        f.flush()
        os.fsync(f.fileno())
    return f"flipped {len(data)} bytes in {target}"


def _newest_checkpoint(directory: Path) -> Path | None:
    """The newest committed checkpoint, valid or not (the drill corrupts what a resume would use)."""
    try:
        from trainguard.checkpoint import list_checkpoints

        found = list_checkpoints(directory)
        if found:
            return Path(found[-1].path)
    except Exception:
        log.debug("checkpoint listing failed; falling back to the newest directory", exc_info=True)
    dirs = [p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return max(dirs, key=lambda p: p.stat().st_mtime, default=None)
