"""What the replica loop tells its caller: each group's runs, the groups, the job (typed values).

Each start of a group is a ``trainguard run`` whose result file is a `RunResult` (read back with
`RunResult.from_dict`: `GroupRun`); the job's result is a `ReplicaResult`, whose `to_dict` is what
``trainguard run --replica-groups N --json`` writes and what the demo's self-test reads.

    >>> run = GroupRun(0, 1, 4, None)
    >>> GroupRun.from_dict(run.to_dict()) == run
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.incidents import Incident
from trainguard.supervisor.config import ExitCode
from trainguard.supervisor.result import RunResult
from trainguard.supervisor.state import RunState

__all__ = ["GroupResult", "GroupRun", "ReplicaResult"]


@dataclass(frozen=True, slots=True)
class GroupRun:
    """One start of a group's ``trainguard run``: its exit code and its result (None when it
    wrote none: killed, or it failed before it could)."""

    group: int
    start: int
    exit_code: int | None
    result: RunResult | None

    @property
    def lost_gpus(self) -> tuple[int, ...]:
        return self.result.lost_gpus if self.result is not None else ()

    @property
    def last_incident(self) -> Incident | None:
        return self.result.incidents[-1] if self.result is not None and self.result.incidents else None

    def to_dict(self) -> dict[str, Any]:
        base = (
            self.result.to_dict()
            if self.result is not None
            else {"exit_code": self.exit_code, "incidents": []}
        )
        return {**base, "group": self.group, "start": self.start}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupRun:
        result = RunResult.from_dict(data) if "job_id" in data else None
        return cls(int(data["group"]), int(data["start"]), data.get("exit_code"), result)


@dataclass(frozen=True, slots=True)
class GroupResult:
    group: int
    state: RunState
    starts: int
    started_at: tuple[float, ...]  # when the loop started each of its `trainguard run`s
    gpus: tuple[int, ...]
    final_step: int | None
    steps: tuple[tuple[float, int], ...]  # (time, step) as the loop first saw each
    heals_s: tuple[float, ...]  # per restart: seconds until it reached the live groups' step
    discarded_steps: int  # steps its rank 0 tried and the group did not commit
    runs: tuple[GroupRun, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "state": self.state.value,
            "starts": self.starts,
            "started_at": list(self.started_at),
            "gpus": list(self.gpus),
            "final_step": self.final_step,
            "steps": list(self.steps),
            "heals_s": list(self.heals_s),
            "discarded_steps": self.discarded_steps,
            "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupResult:
        return cls(
            int(data["group"]),
            RunState(data["state"]),
            int(data["starts"]),
            tuple(data.get("started_at", ())),
            tuple(data["gpus"]),
            data.get("final_step"),
            tuple((float(t), int(s)) for t, s in data.get("steps", ())),
            tuple(data.get("heals_s", ())),
            int(data.get("discarded_steps", 0)),
            tuple(GroupRun.from_dict(r) for r in data.get("runs", ())),
        )


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    exit_code: ExitCode
    job_id: str
    run_dir: Path
    reason: str
    groups: tuple[GroupResult, ...]
    lighthouse_restarts: int = 0
    excluded_gpus: tuple[int, ...] = ()
    states: tuple[dict[str, Any], ...] = ()  # the job's state changes: time, state, groups running
    capacity: dict[str, float] = field(default_factory=dict)  # `loop.ledger_capacity` or `judge.capacity`
    incidents: tuple[Incident, ...] = ()  # the job's own (a group's are in its runs)
    goodput: dict[str, Any] = field(default_factory=dict)

    @property
    def group_incidents(self) -> int:
        """Incidents the groups' own loops recorded (a rank that died, hung or lost its GPU)."""
        return sum(len(r.result.incidents) for g in self.groups for r in g.runs if r.result is not None)

    def summary(self) -> str:
        """The one line ``trainguard run --replica-groups N`` ends with: the job's incidents (a
        group replaced or stopped, the Lighthouse restarted) and its groups' own, the groups'
        restarts (a group's loop restarting its workers) and heals, and the capacity (n/a where
        no step was measured)."""
        cap = self.capacity.get("capacity")
        heals = sorted(h for g in self.groups for h in g.heals_s)
        healed = f", longest {heals[-1]:.1f}s" if heals else ""
        return (
            f"{self.exit_code.name.lower()} (exit {int(self.exit_code)}): {self.reason}; "
            f"incidents {len(self.incidents)} in the job, {self.group_incidents} in the groups; "
            f"{len(heals)} heal(s){healed}; {len(self.groups)} replica group(s), "
            f"{sum(g.starts for g in self.groups)} group start(s), capacity "
            f"{'n/a' if cap is None else f'{cap:.2f}'}; run dir {self.run_dir}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": int(self.exit_code),
            "status": self.exit_code.name.lower(),
            "reason": self.reason,
            "job_id": self.job_id,
            "run_dir": str(self.run_dir),
            "replica_groups": len(self.groups),
            "lighthouse_restarts": self.lighthouse_restarts,
            "excluded_gpus": list(self.excluded_gpus),
            "groups": [g.to_dict() for g in self.groups],
            "states": list(self.states),
            "capacity": self.capacity,
            "incidents": [i.to_dict() for i in self.incidents],
            "goodput": self.goodput,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaResult:
        return cls(
            ExitCode(int(data["exit_code"])),
            str(data["job_id"]),
            Path(data["run_dir"]),
            str(data.get("reason", "")),
            tuple(GroupResult.from_dict(g) for g in data.get("groups", ())),
            int(data.get("lighthouse_restarts", 0)),
            tuple(data.get("excluded_gpus", ())),
            tuple(data.get("states", ())),
            dict(data.get("capacity") or {}),
            tuple(Incident.from_dict(i) for i in data.get("incidents", ())),
            dict(data.get("goodput") or {}),
        )
