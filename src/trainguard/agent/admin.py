"""The agent's one write route, and the remediation status it guards (agent/api.py routes here;
no HTTP code: a status and a JSON value come back).

    GET  /api/v1/remediation            the read token: enforcing?, breaker state, action counts
    POST /api/v1/breaker/reset[?job=J]  the ADMIN token only: a person closes the breaker

The admin token is a second file (``admin_token_file``, default ``<state_dir>/admin.token``,
created mode 0600 when missing); the read token that the dashboard and Prometheus hold can never
act. A reset is an incident record naming who asked (the client address), and a ``reset`` event
of each breaker it closed in the fleet store (``trainguard fleet breaker`` shows it).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.actions import PersonAction
from trainguard.agent.assemble import remediation_of
from trainguard.errors import StoreError
from trainguard.incidents import Incident
from trainguard.remediate.breaker import reset
from trainguard.remediate.fleetlog import reset_events
from trainguard.tokens import TokenCheck, create_token_file

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon

log = logging.getLogger(__name__)

__all__ = ["ADMIN_PATHS", "admin_refusal", "admin_token_path", "breaker_reset", "remediation_status"]

ADMIN_PATHS = frozenset({"/api/v1/breaker/reset"})


def admin_token_path(daemon: AgentDaemon) -> Path:
    return Path(daemon.config.admin_token_file or Path(daemon.state_dir) / "admin.token")


def remediation_status(daemon: AgentDaemon) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of ``GET /api/v1/remediation``."""
    remediation = remediation_of(daemon)
    if remediation is None:
        return 404, {
            "error": "this agent runs no remediation (its act step is another)",
            "reason": "not_found",
        }
    return 200, remediation.status()


def admin_refusal(
    daemon: AgentDaemon, method: str, authorization: str | None
) -> tuple[int, dict[str, Any]] | None:
    """(HTTP status, JSON body) refusing ``POST /api/v1/breaker/reset``, or None: the admin asks.

    The refusal does not name the admin token's file: whoever is refused may be a stranger."""
    if method != "POST":
        return 405, {"error": "POST with the admin token resets the breaker", "reason": "method"}
    path = admin_token_path(daemon)
    create_token_file(path)
    if not TokenCheck(path).verify(authorization):
        return 403, {"error": "remediation needs the admin token (admin_token_file); the read token cannot act",
                     "reason": "not_admin"}  # fmt: skip
    return None


def breaker_reset(
    daemon: AgentDaemon, method: str, authorization: str | None, query: dict[str, list[str]], client: str
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of ``POST /api/v1/breaker/reset``: the admin check, then the
    reset (which reads and writes the breaker file: the API runs it off its event loop)."""
    return admin_refusal(daemon, method, authorization) or reset_breaker(daemon, query, client)


def reset_breaker(
    daemon: AgentDaemon, query: dict[str, list[str]], client: str
) -> tuple[int, dict[str, Any]]:
    """The reset itself, once the admin token is checked: may block on the breaker file."""
    remediation = remediation_of(daemon)
    if remediation is None:
        return 404, {"error": "this agent runs no remediation: there is no breaker", "reason": "not_found"}
    jobs = query.get("job")
    job = jobs[0] if jobs else None
    breaker = remediation.remediator.breaker
    try:
        with breaker.update() as box:
            before = box[0]
            box[0] = reset(before, job=job)
    except StoreError as exc:  # unparsable: a person must look at the file, not have it replaced
        return 503, {"error": str(exc), "reason": "breaker_unreadable"}
    was = dict(before.jobs_tripped).get(job) if job else before.tripped
    what = f"job {job}'s breaker" if job else "the fleet breaker"
    inc = Incident(job=f"node:{daemon.hostname}", time=time.time(), action=PersonAction.BREAKER_RESET,
                   summary=f"{what} reset through the API from {client} (was: {was or 'closed'})",
                   evidence=(f"by admin token from {client}",), node=daemon.hostname, detected_by="person",
                   resolved=True, resolution="done")  # fmt: skip
    try:
        rec = daemon.store().add(inc)
        rec_id = rec.id
    except Exception:  # the reset stands; the record is best effort and said so
        rec_id = None
    events: list[str] = []
    try:
        events = reset_events(daemon.fleet_writer(), before, job, f"admin token from {client}")
    except StoreError as exc:  # likewise: the store could not be opened
        log.warning("breaker reset not written to the fleet store: %s", exc)
    return 200, {"reset": what, "was": was, "incident": rec_id, "fleet_events": events}
