"""What a supervised run tells its caller: `RunEvent` while it runs, `RunResult` when it ends.

Both travel between loops as typed values: the replica loop starts each group as a ``trainguard
run`` whose result file (``--json``) is `RunResult.to_dict`, and reads it back with
`RunResult.from_dict`; the CLI's last line is `RunResult.summary`.

    >>> r = RunResult(ExitCode.OK, "job", Path("runs/job"), "all workers finished", 1, 99)
    >>> RunResult.from_dict(r.to_dict()) == r
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.actions import JobAction
from trainguard.chaos import Injected
from trainguard.incidents import Incident
from trainguard.supervisor.config import ExitCode

__all__ = ["RunEvent", "RunResult"]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One thing that happened, for live displays: kind is job_started | attempt_started |
    progress | chaos | incident | diagnosis | preflight | recovered | teardown_abort |
    checkpoint_requested | finished | watchers (what is watched, at start in ``job_started`` and
    again when heartbeats appear); with replica groups also group_started | group_healed |
    group_stopped | lighthouse_restarted | restart_all | state."""

    kind: str
    time: float
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_code: ExitCode
    job_id: str
    run_dir: Path
    reason: str
    attempts: int
    final_step: int | None
    incidents: tuple[Incident, ...] = ()
    injected: tuple[Injected, ...] = ()
    goodput: dict[str, Any] = field(default_factory=dict)
    recoveries: tuple[dict[str, Any], ...] = ()  # per restart: failure time, first step after, mttr
    world_sizes: tuple[int, ...] = ()  # per attempt: the job's world size after rendezvous
    diagnostics: tuple[dict[str, Any], ...] = ()  # per pre-flight / diagnosis: verdict, summary, file
    nodes: tuple[dict[str, Any], ...] = ()  # multi-node changes: a spare admitted, a node replaced

    @property
    def lost_gpus(self) -> tuple[int, ...]:
        """The GPUs this run's policy took out of service (excluded, or failed with none left)."""
        out = []
        for i in self.incidents:
            verb = JobAction.of(i.action)
            if i.gpu is not None and verb is not None and verb.loses_gpu and i.gpu not in out:
                out.append(i.gpu)
        return tuple(out)

    def summary(self) -> str:
        """The one line ``trainguard run`` ends with."""
        ettr = self.goodput.get("ettr")
        return (
            f"{self.exit_code.name.lower()} (exit {int(self.exit_code)}): {self.reason}; "
            f"{len(self.incidents)} incident(s), {self.attempts} attempt(s), "
            f"ETTR {'n/a (no heartbeats: the Guard reports steps)' if ettr is None else f'{ettr:.2f}'}; "
            f"{''.join(str(n['summary']) + '; ' for n in self.nodes if n.get('summary'))}"
            f"run dir {self.run_dir}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``trainguard run --json``)."""
        return {
            "exit_code": int(self.exit_code),
            "status": self.exit_code.name.lower(),
            "reason": self.reason,
            "job_id": self.job_id,
            "run_dir": str(self.run_dir),
            "attempts": self.attempts,
            "final_step": self.final_step,
            "goodput": self.goodput,
            "incidents": [i.to_dict() for i in self.incidents],
            "injected": [i.to_dict() for i in self.injected],
            "recoveries": list(self.recoveries),
            "world_sizes": list(self.world_sizes),
            "diagnostics": list(self.diagnostics),
            "nodes": list(self.nodes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """The value `to_dict` wrote. Raises ValueError/KeyError/TypeError on a document that is
        not one (the caller decides what a missing result means)."""
        return cls(
            ExitCode(int(data["exit_code"])),
            str(data["job_id"]),
            Path(data["run_dir"]),
            str(data.get("reason", "")),
            int(data.get("attempts", 0)),
            data.get("final_step"),
            tuple(Incident.from_dict(i) for i in data.get("incidents", ())),
            tuple(Injected.from_dict(i) for i in data.get("injected", ())),
            dict(data.get("goodput") or {}),
            tuple(data.get("recoveries", ())),
            tuple(data.get("world_sizes", ())),
            tuple(data.get("diagnostics", ())),
            tuple(data.get("nodes", ())),
        )
