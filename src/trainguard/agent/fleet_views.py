"""The fleet page's API: ``/api/v1/fleet/{status,nodes,incidents,lemons,breakers}`` over the store.

Behind the same token as every other route. Each agent of a fleet points at the one fleet store
(``postgresql://...``), so any agent serves the whole fleet's page at ``/fleet``; on one node's
SQLite store it shows that node. Read-only: these views only call `incidents.fleet_read`.

Queries: ``group``, ``rack``, ``health`` (nodes), ``host``, ``group``, ``since``, ``limit``
(incidents, at most 500).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.agent.views import NotFound, Query, Unavailable, arg, arg_float, arg_int
from trainguard.errors import StoreError
from trainguard.incidents import fleet_read

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon

PREFIX = "/api/v1/fleet/"
MAX_LIMIT = 500


def route(daemon: AgentDaemon, path: str, q: Query) -> Any:
    """The JSON body of one fleet route (runs in a worker thread: the store may be remote)."""
    name = path[len(PREFIX) :]
    if name not in ("status", "nodes", "incidents", "lemons", "breakers"):
        raise NotFound(f"no such path: {path}")
    try:
        store = daemon.store()
        if name == "status":
            return fleet_read.status(store, group=arg(q, "group"))
        if name == "nodes":
            return fleet_read.nodes(
                store, group=arg(q, "group"), rack=arg(q, "rack"), health=arg(q, "health")
            )
        if name == "lemons":
            return fleet_read.lemons(store, limit=arg_int(q, "limit", 10, 1, MAX_LIMIT))
        if name == "breakers":
            return fleet_read.breakers(store, since=arg_float(q, "since", None))
        limit = arg_int(q, "limit", 50, 1, MAX_LIMIT)
        return fleet_read.incidents(
            store, host=arg(q, "host"), group=arg(q, "group"), since=arg_float(q, "since", None), limit=limit
        )
    except StoreError as exc:
        raise Unavailable(str(exc)) from None
