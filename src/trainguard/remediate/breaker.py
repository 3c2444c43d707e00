"""The breakers: a fleet-wide and a per-job limit on how many nodes remediation takes out.

    policy.choose  ->  breaker.admit (pure)  ->  executor acts, or records the action as held

Fleet: at most ``max_nodes`` nodes, and at most ``max_fraction`` of the fleet, actioned in a
sliding ``window_s`` (a node already out in the window counts once). Job: never more nodes of one
training job than its spare pool per ``job_window_s``. Past a limit the breaker **trips**: that
action and every later one (of the fleet, or of that job) is held until a person resets it
(``trainguard fleet breaker reset`` or ``POST /api/v1/breaker/reset`` with the admin token)::

    >>> lim = BreakerLimits(max_nodes=2, max_fraction=1.0)
    >>> s = BreakerState()
    >>> for node in ["a", "b", "c", "a"]:
    ...     ok, why, s = admit(s, lim, node, None, now=0.0, fleet_size=10)
    ...     print(node, ok)
    a True
    b True
    c False
    a False

State is a small JSON file written atomically under an exclusive lock, so the agents of a
shared filesystem see one breaker; its trips, held actions and resets are also events in the
fleet store (remediate/fleetlog.py), which ``trainguard fleet breaker`` reads.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from trainguard.remediate.jsonfile import JsonFile
from trainguard.remediate.policy import BreakerLimits

__all__ = ["Actioned", "BreakerFile", "BreakerState", "admit", "fleet_limit", "rack_to_report", "reset"]


@dataclass(frozen=True, slots=True)
class Actioned:
    time: float
    node: str
    job: str | None = None


@dataclass(frozen=True, slots=True)
class BreakerState:
    actioned: tuple[Actioned, ...] = ()
    tripped: str | None = None  # why the fleet breaker tripped; None: closed
    tripped_at: float | None = None
    jobs_tripped: tuple[tuple[str, str], ...] = ()  # (job, why)
    held: int = 0  # actions held since the last reset
    bad: tuple[Actioned, ...] = ()  # every node a take-out was asked for, actioned or held (racks)
    racks_reported: tuple[tuple[str, float], ...] = ()  # (rack, when its rack incident was recorded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "actioned": [[a.time, a.node, a.job] for a in self.actioned],
            "tripped": self.tripped,
            "tripped_at": self.tripped_at,
            "jobs_tripped": [list(j) for j in self.jobs_tripped],
            "held": self.held,
            "bad": [[a.time, a.node, a.job] for a in self.bad],
            "racks_reported": [list(r) for r in self.racks_reported],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BreakerState:
        acts = d.get("actioned") or []
        jobs = d.get("jobs_tripped") or []
        t_at = d.get("tripped_at")
        return cls(
            tuple(Actioned(float(t), str(n), None if j is None else str(j)) for t, n, j in acts),
            _tripped(d.get("tripped")),
            None if t_at is None else float(t_at),
            tuple((str(j), str(w)) for j, w in jobs),
            int(d.get("held") or 0),
            tuple(
                Actioned(float(t), str(n), None if j is None else str(j)) for t, n, j in d.get("bad") or []
            ),
            tuple((str(r), float(t)) for r, t in d.get("racks_reported") or []),
        )


def _tripped(raw: Any) -> str | None:
    """The fleet breaker's reason as stored: null is closed; anything else is open, an empty
    reason included (shown open and holding, never shown open while actions go through)."""
    if raw is None:
        return None
    return str(raw).strip() or "tripped (no reason recorded)"


def fleet_limit(limits: BreakerLimits, fleet_size: int) -> int:
    """The most nodes the fleet may lose in a window: the smaller of the two limits. The fraction
    allows at least one node (a 10-node fleet at 5% may still drain one); a fleet of unknown size
    (0) is held by ``max_nodes`` alone."""
    if fleet_size <= 0 or limits.max_fraction >= 1.0:
        return limits.max_nodes
    by_fraction = math.floor(limits.max_fraction * fleet_size + 1e-9)
    return min(limits.max_nodes, max(1, by_fraction) if limits.max_fraction > 0 else 0)


def admit(
    state: BreakerState,
    limits: BreakerLimits,
    node: str,
    job: str | None,
    now: float,
    fleet_size: int,
    job_spares: int | None = None,
) -> tuple[bool, str, BreakerState]:
    """(allowed, why, the new state) for taking ``node`` (of ``job``, which may lose ``job_spares``
    nodes per job window) out of service now."""
    horizon = max(limits.window_s, limits.job_window_s)
    recent = tuple(a for a in state.actioned if now - a.time < horizon)
    bad = tuple(a for a in state.bad if now - a.time < limits.window_s and a.node != node)
    state = replace(state, actioned=recent, bad=(*bad, Actioned(now, node, job)))
    if state.tripped is not None:
        return _hold(state, f"fleet breaker open: {state.tripped}")
    tripped_job = dict(state.jobs_tripped).get(job) if job else None
    if tripped_job:
        return _hold(state, f"job breaker open for {job}: {tripped_job}")
    in_window = {a.node for a in recent if now - a.time < limits.window_s}
    if node in in_window:  # already out: acting on it again loses nothing more
        return (
            True,
            "node already counted in this window",
            replace(state, actioned=(*recent, Actioned(now, node, job))),
        )
    if job is not None and job_spares is not None:
        job_nodes = {a.node for a in recent if a.job == job and now - a.time < limits.job_window_s}
        if len(job_nodes) + 1 > job_spares:
            why = f"{len(job_nodes)} of its nodes already out, {job_spares} spare(s) per {limits.job_window_s:g}s"
            state = replace(state, jobs_tripped=(*state.jobs_tripped, (job, why)))
            return _hold(state, f"job breaker tripped for {job}: {why}")
    limit = fleet_limit(limits, fleet_size)
    if len(in_window) + 1 > limit:
        why = (
            f"{len(in_window)} node(s) already actioned in {limits.window_s:g}s; limit {limit} "
            f"(max_nodes {limits.max_nodes}, max_fraction {limits.max_fraction:g} of {fleet_size})"
        )
        state = replace(state, tripped=why, tripped_at=now)
        return _hold(state, f"fleet breaker tripped: {why}")
    return True, "within limits", replace(state, actioned=(*recent, Actioned(now, node, job)))


def _hold(state: BreakerState, why: str) -> tuple[bool, str, BreakerState]:
    return False, why, replace(state, held=state.held + 1)


def reset(state: BreakerState, job: str | None = None) -> BreakerState:
    """What a person's reset does: close the fleet breaker (or one job's); the window's history
    stays, so the limit still counts the nodes already out."""
    if job is not None:
        return replace(state, jobs_tripped=tuple(j for j in state.jobs_tripped if j[0] != job))
    return replace(state, tripped=None, tripped_at=None, jobs_tripped=(), held=0)


def rack_to_report(
    state: BreakerState, racks: dict[str, str], node: str, now: float, window_s: float
) -> tuple[str, list[str], BreakerState] | None:
    """(rack, its bad nodes, the state marking it reported) when ``node``'s rack has at least half
    its nodes bad in the window and no rack incident was recorded for it in the window."""
    from trainguard.remediate.escalation import rack_incidents

    rack = racks.get(node)
    if rack is None or any(r == rack and now - t < window_s for r, t in state.racks_reported):
        return None
    hit = rack_incidents({a.node for a in state.bad if now - a.time < window_s}, racks).get(rack)
    if not hit:
        return None
    kept = tuple(r for r in state.racks_reported if now - r[1] < window_s)
    return rack, hit, replace(state, racks_reported=(*kept, (rack, now)))


class BreakerFile(JsonFile[BreakerState]):
    """The breaker's state in a JSON file: ``with f.update() as box: box[0] = new`` is locked."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, BreakerState.from_dict, BreakerState.to_dict, BreakerState)
