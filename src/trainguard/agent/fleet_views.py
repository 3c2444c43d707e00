"""The fleet page's API: ``/api/v1/fleet/{status,nodes,incidents,lemons,breakers}`` over the store.

Behind the same token as every other route. Each agent of a fleet points at the one fleet store
(``postgresql://...``), so any agent serves the whole fleet's page at ``/fleet``; on one node's
SQLite store it shows that node. Read-only: these views only call `incidents.fleet_read`.

Queries: ``group``, ``rack``, ``health`` (nodes), ``host``, ``group``, ``since``, ``limit``
(incidents, at most 500).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.errors import StoreError
from trainguard.incidents import fleet_read

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon

PREFIX = "/api/v1/fleet/"
MAX_LIMIT = 500
Query = dict[str, list[str]]


class NotFound(LookupError):
    pass


class BadQuery(ValueError):
    pass


class Unavailable(RuntimeError):
    pass


def _one(q: Query, key: str) -> str | None:
    values = q.get(key)
    return values[-1] if values else None


def _number(q: Query, key: str, default: float | None) -> float | None:
    text = _one(q, key)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise BadQuery(f"{key} must be a number, got {text!r}") from None


def route(daemon: AgentDaemon, path: str, q: Query) -> Any:
    """The JSON body of one fleet route (runs in a worker thread: the store may be remote)."""
    name = path[len(PREFIX) :]
    if name not in ("status", "nodes", "incidents", "lemons", "breakers"):
        raise NotFound(f"no such path: {path}")
    try:
        store = daemon.store()
        if name == "status":
            return fleet_read.status(store, group=_one(q, "group"))
        if name == "nodes":
            return fleet_read.nodes(
                store, group=_one(q, "group"), rack=_one(q, "rack"), health=_one(q, "health")
            )
        if name == "lemons":
            return fleet_read.lemons(store, limit=max(1, min(MAX_LIMIT, int(_number(q, "limit", 10) or 0))))
        if name == "breakers":
            return fleet_read.breakers(store, since=_number(q, "since", None))
        limit = int(_number(q, "limit", 50) or 0)
        if not 1 <= limit <= MAX_LIMIT:
            raise BadQuery(f"limit must be 1..{MAX_LIMIT}")
        return fleet_read.incidents(
            store, host=_one(q, "host"), group=_one(q, "group"), since=_number(q, "since", None), limit=limit
        )
    except StoreError as exc:
        raise Unavailable(str(exc)) from None
