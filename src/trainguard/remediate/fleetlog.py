"""Remediation into the fleet store: every action and every breaker event, with the node's identity.

    Remediator (executor.py) --action/admit--> fleetlog --FleetWriter--> remediation_actions
    a person's reset (CLI, API)            --> fleetlog --FleetWriter--> breaker_events

The breaker's state of record stays its JSON file (breaker.py); these rows are what
``trainguard fleet breaker`` and the fleet readers show across every node: which breaker opened
and why, each action it held, who reset it and when. Writes go through `FleetWriter`, so they are
idempotent and spooled while PostgreSQL is away; a write that fails anyway is logged and never
stops the action (its incident record is already stored)::

    >>> import tempfile, os
    >>> from trainguard.incidents import IncidentStore
    >>> from trainguard.incidents.fleet import FleetWriter
    >>> from trainguard.incidents.identity import NodeIdentity
    >>> from trainguard.remediate.breaker import BreakerState
    >>> store = IncidentStore(os.path.join(tempfile.mkdtemp(), "tg.db"))
    >>> w = FleetWriter(store, NodeIdentity("gpu-001"))
    >>> reset_events(w, BreakerState(tripped="3 nodes out"), None, "alice@login1", time=9.0)
    ['fleet']
    >>> store.read("SELECT breaker, state, source FROM breaker_events")
    [{'breaker': 'fleet', 'state': 'reset', 'source': 'alice@login1'}]
    >>> store.close()

Breaker names: ``fleet`` (the fleet-wide breaker) and ``job:<job>`` (one training job's). Both are
fleet-scoped: the readers take the latest event of each over all hosts, so a reset written from a
login node closes what the agents of other nodes opened.
"""

from __future__ import annotations

import logging
from typing import Any

from trainguard.errors import StoreError
from trainguard.remediate.breaker import BreakerState

log = logging.getLogger(__name__)

__all__ = ["FLEET", "admission_events", "breaker_name", "record_action", "reset_events"]

FLEET = "fleet"


def breaker_name(job: str | None) -> str:
    """The breaker's name in the store: ``fleet``, or ``job:<job>``."""
    return FLEET if job is None else f"job:{job}"


def _write(fn: Any, *args: Any, **kw: Any) -> bool:
    try:
        fn(*args, **kw)
        return True
    except StoreError as exc:  # the incident record stands; the fleet row is said to be missing
        log.warning("not written to the fleet store: %s", exc)
        return False


def record_action(
    fleet: Any,
    remedy: str,
    outcome: str,
    *,
    node: str,
    gpu: int | None,
    detail: str,
    incident_key: str | None,
    source: str,
    time: float,
) -> bool:
    """One remediation action: outcome ``dry_run``, ``held``, ``done``, ``already``, ``failed`` or
    ``ambiguous`` (the incident record's resolution, without its detail)."""
    if fleet is None:
        return False
    return _write(
        fleet.action, remedy, outcome=outcome, target=node, gpu=gpu, detail=detail[:500],
        incident_key=incident_key, source=source, time=time,
    )  # fmt: skip


def admission_events(
    fleet: Any,
    before: BreakerState,
    after: BreakerState,
    ok: bool,
    why: str,
    *,
    what: str,
    source: str,
    time: float,
) -> list[str]:
    """The breaker events of one admission: ``open`` for a breaker this admission tripped, then
    ``held`` for the action it held (``what``: the remedy and its target). The names written."""
    if fleet is None or ok:
        return []
    written: list[str] = []
    opened = bool(after.tripped) and not before.tripped
    if opened and _write(fleet.breaker, FLEET, "open", reason=after.tripped, source=source, time=time):
        written.append(FLEET)
    for job, job_why in after.jobs_tripped:
        if job not in dict(before.jobs_tripped):
            name = breaker_name(job)
            if _write(fleet.breaker, name, "open", reason=job_why, source=source, time=time):
                written.append(name)
    name = FLEET if after.tripped else _held_job(after, why)
    reason = f"held {what}: {why}"[:500]
    if _write(fleet.breaker, name, "held", reason=reason, source=source, time=time):
        written.append(name)
    return written


def _held_job(state: BreakerState, why: str) -> str:
    for job, _ in state.jobs_tripped:
        if f" {job}:" in why:
            return breaker_name(job)
    return FLEET


def reset_events(
    fleet: Any, before: BreakerState, job: str | None, by: str, *, time: float | None = None
) -> list[str]:
    """A person's reset: one ``reset`` event (who, when) per breaker it closed, or for the one
    named when it was already closed (the reset is recorded either way). The names written."""
    if job is not None:
        closed = [(breaker_name(job), dict(before.jobs_tripped).get(job))]
    else:
        closed = [(FLEET, before.tripped)] + [(breaker_name(j), w) for j, w in before.jobs_tripped]
    written = []
    for name, was in closed:
        reason = f"reset by {by} (was: {was or 'closed'})"[:500]
        if _write(fleet.breaker, name, "reset", reason=reason, source=by, time=time):
            written.append(name)
    return written
