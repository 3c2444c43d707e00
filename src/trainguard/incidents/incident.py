"""The Incident record: one interruption (or near miss) of one job, as the store keeps it.

Written by the supervisor and the node agent, read by `trainguard incidents` and `report`::

    >>> inc = Incident(job="llm-7b", time=612.0, started=10.0, root_cause=RootCause.FAULTY_GPU,
    ...                action="exclude_gpu", summary="GPU 3 fell off the bus (Xid 79)",
    ...                gpu=3, detected_by="kernel_log", detection_delay_s=0.4)
    >>> inc.root_cause.value, inc.scope.value, inc.id is None
    ('faulty_gpu', 'job', True)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from trainguard.actions import Scope, scope_of
from trainguard.incidents.taxonomy import RootCause


@dataclass(frozen=True, slots=True)
class Incident:
    """One incident. ``id`` is None until `IncidentStore.add` assigns it.

    ``time`` is when it was detected; ``started`` the time of the earliest evidence (so
    ``time - started`` is roughly the detection delay). ``category`` is a records.Category value
    when one applies; ``action`` is a value of one of the action types of `trainguard.actions`
    (a finding's advice, or the decision a loop took: "restart", "exclude_gpu", "replace_group",
    "drain"...; `scope` says whose). ``evidence`` holds strings or small
    JSON-able values (kernel lines, error messages, rule names). Enums are normalised to their
    string values, lists to tuples.
    """

    job: str
    time: float
    root_cause: RootCause = RootCause.UNKNOWN
    action: str = "none"
    summary: str = ""
    started: float | None = None
    category: str | None = None
    evidence: tuple[Any, ...] = ()
    gpu: int | None = None
    node: str | None = None
    rank: int | None = None
    attempt: int | None = None
    detected_by: str | None = None  # exit_code | heartbeat | kernel_log | error_file | numerics | ...
    detection_delay_s: float | None = None
    time_lost_s: float | None = None
    resolved: bool = False
    resolution: str | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        # Accept what callers naturally have (an action enum, a list, a cause's string value).
        object.__setattr__(self, "root_cause", RootCause(self.root_cause))
        for name in ("action", "category", "detected_by"):
            value = getattr(self, name)
            if isinstance(value, Enum):
                object.__setattr__(self, name, str(value.value))
        object.__setattr__(self, "evidence", tuple(self.evidence))
        object.__setattr__(self, "resolved", bool(self.resolved))

    @property
    def scope(self) -> Scope | None:
        """Which loop's action ``action`` is (None: no action, or a value no loop takes today)."""
        return scope_of(self.action)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (enums as strings, evidence as a list)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["root_cause"] = self.root_cause.value
        out["evidence"] = list(self.evidence)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Incident:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


INCIDENT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Incident))
