"""Runs the demo: a fault-free reference, then the same training under the built-in chaos plan,
with the live view, then the report (`trainguard.demo.report`).

The supervisor runs in the main thread (torch elastic installs signal handlers); its events
(``on_event``, called from its monitor loop) drive the display and record what the report needs
besides the supervisor's result: which GPUs each attempt used, and where each resume started.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.demo.live import Display
from trainguard.demo.match import candidates
from trainguard.demo.plan import DemoPlan, chaos_toml
from trainguard.demo.truth import CKPT_STEP, InjectedFault
from trainguard.incidents import Incident

log = logging.getLogger(__name__)


@dataclass
class ChaosRun:
    """What the demo observed of the chaos run, besides the supervisor's own result."""

    job: str
    result: Any = None  # supervisor.RunResult
    gpus_by_attempt: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0


def worker_cmd(script: Path, plan: DemoPlan, ckpt: Path, step_delay: float) -> tuple[str, ...]:
    return (
        sys.executable,
        str(script),
        "--steps",
        str(plan.steps),
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        str(plan.checkpoint_every),
        "--step-delay",
        str(step_delay),
    )


def supervisor_config(plan: DemoPlan, script: Path, workdir: Path, job: str, *, chaos: bool) -> Any:
    from trainguard.supervisor import (
        HealthConfig,
        LaunchConfig,
        RecordConfig,
        RecoveryConfig,
        StandbyConfig,
        SupervisorConfig,
        WatchConfig,
    )

    ckpt = workdir / ("ckpt" if chaos else "ckpt-reference")
    plan_path = workdir / "chaos.toml"
    return SupervisorConfig(
        LaunchConfig(
            cmd=worker_cmd(script, plan, ckpt, plan.step_delay if chaos else 0.0),
            nproc_per_node=plan.nproc,
            standalone=True,
            env={"OMP_NUM_THREADS": "1"},
        ),
        RecordConfig(
            job_id=job, runs_root=workdir / "runs", db=workdir / "trainguard.db", checkpoint_dir=ckpt
        ),
        # Far below gloo's 30 min / NCCL's 10 min, and above the stall of the first checkpoint
        # wait of an attempt (the writer process is still importing torch: 2-4 s on busy cores).
        WatchConfig(hang_timeout_floor=6.0, hang_step_factor=3.0, startup_timeout=180.0, tee=False),
        HealthConfig(backend="sim" if chaos else "none", health_interval=0.25),
        RecoveryConfig(
            max_restarts=5,
            crash_loop_after=3,
            backoff_base_s=0.25,
            backoff_max_s=2.0,
            min_nproc=1,  # three of the four GPUs are excluded on the way (F2, F7, F6)
        ),
        # The reference run never restarts: no pool. 4 ranks on a 2-core laptop: one spare set.
        StandbyConfig(enabled=chaos and plan.warm_standby, sets=1),
        chaos=plan_path if chaos else None,
    )


def run_reference(plan: DemoPlan, script: Path, workdir: Path, job: str, display: Display) -> Any:
    from trainguard.supervisor import Supervisor

    display.phase("reference", f"reference run: {plan.nproc} ranks, {plan.steps} steps, no faults")
    sup = Supervisor(supervisor_config(plan, script, workdir, job, chaos=False), on_event=display.event)
    return sup.run()


def run_chaos(
    plan: DemoPlan, script: Path, workdir: Path, job: str, display: Display, verbose: int = 0
) -> ChaosRun:
    from trainguard.supervisor import Supervisor

    (workdir / "chaos.toml").write_text(chaos_toml(plan))
    out = ChaosRun(job=job, started=time.time())
    ids = [f.id for f in plan.faults]
    live = LiveMatch(plan)
    sup: Any = None

    def on_event(ev: Any) -> None:
        d = ev.data
        if ev.kind == "job_started":
            display.set_verdict_source(lambda: sup.health.last if sup is not None else None)
            quiet_logs(verbose)  # again: the supervisor has imported torch's loggers by now
        elif ev.kind == "attempt_started":
            out.gpus_by_attempt.append((ev.time, tuple(d.get("gpus", ()))))
        elif ev.kind == "chaos":
            index = d.get("index")
            if isinstance(index, int) and 0 <= index < len(ids):
                display.fault_injected(ids[index], str(d.get("detail") or d.get("label")))
                live.injected(ids[index], d)
        elif ev.kind == "incident":
            for fid in live.incident(d):
                display.fault_detected(fid)
        display.event(ev)

    display.phase(
        "chaos", f"chaos run: {len(plan.faults)} faults planned, {plan.nproc} ranks, {plan.steps} steps"
    )
    sup = Supervisor(supervisor_config(plan, script, workdir, job, chaos=True), on_event=on_event)
    out.result = sup.run()
    out.ended = time.time()
    return out


class LiveMatch:
    """Provisional fault -> incident matches for the live view (same rule as the report's)."""

    def __init__(self, plan: DemoPlan) -> None:
        self.kinds = {f.id: f.kind for f in plan.faults}
        self.pending: dict[str, InjectedFault] = {}

    def injected(self, fid: str, d: dict[str, Any]) -> None:
        step = CKPT_STEP.search(str(d.get("detail", "")))
        self.pending[fid] = InjectedFault(
            fid, self.kinds[fid], str(d.get("label", "")), True, d.get("time"), d.get("step"),
            d.get("rank"), d.get("gpu"), str(d.get("detail", "")), int(step.group(1)) if step else None,
        )  # fmt: skip

    def incident(self, d: dict[str, Any]) -> list[str]:
        try:
            inc = Incident.from_dict(d)
        except (TypeError, ValueError):
            return []
        for fid, inj in sorted(self.pending.items(), key=lambda kv: kv[1].time or 0.0):
            if candidates(inj, [inc]):
                del self.pending[fid]
                return [fid]
        return []


def quiet_logs(verbose: int) -> None:
    """The live view says what happened; the supervisor's and torch's warnings would tear it."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun warns when it has to set it
    if verbose:
        return
    os.environ.setdefault("LOGLEVEL", "ERROR")  # torch elastic sets each logger's level from it
    for name in ("torch.distributed", "torch.distributed.run", "torch.distributed.elastic", "trainguard"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed", "trainguard")):
            logging.getLogger(name).setLevel(logging.ERROR)
