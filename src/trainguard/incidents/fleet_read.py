"""Fleet readers: what ``trainguard fleet``, the fleet page and ``report --fleet`` ask the store.

    store (SQLite or PostgreSQL) --> status / nodes / lemons / mtbf / incidents / breakers --> JSON

Each function takes an open `IncidentStore` and returns plain JSON-ready data. The queries
are the same SQL on both backends and are written to stay fast at fleet size: ``status`` and
``nodes`` read the ``nodes`` table (one row per node), ``lemons`` the per-GPU failure counters
the writers keep (``gpu_failures``), never a scan of the incident history; ``since`` windows
use the ``time`` indexes::

    >>> import tempfile, os
    >>> from trainguard.incidents import IncidentStore
    >>> with IncidentStore(os.path.join(tempfile.mkdtemp(), "tg.db")) as store:
    ...     status(store, now=0.0)["nodes"]
    0
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from trainguard.incidents.store import HARDWARE_CAUSES

if TYPE_CHECKING:
    from trainguard.incidents.store import IncidentStore

HEALTHS = ("ok", "degraded", "failed", "unknown")
STALE_S = 300.0  # a node not heard from for this long shows as stale (its agent heartbeats every 60 s)
NO_GROUP = "(none)"
_NODE_COLS = "host, rack, node_group, gpu_uuids, health, action, reason, since, last_seen"
_INCIDENT_COLS = "id, time, job, host, rack, node_group, gpu, gpu_uuid, rank, root_cause, action, summary"


def _filters(**values: Any) -> tuple[str, list[Any]]:
    clauses, params = [], []
    for column, value in values.items():
        if value is None:
            continue
        if value == NO_GROUP and column in ("node_group", "rack"):  # what the readers show for NULL
            clauses.append(f"{column} IS NULL")
            continue
        op = ">=" if column == "time" else "="
        clauses.append(f"{column} {op} ?")
        params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def status(store: IncidentStore, now: float | None = None, group: str | None = None) -> dict[str, Any]:
    """Node counts by verdict, per group and rack; stale nodes; incidents of the last 24 hours."""
    now = time.time() if now is None else now
    where, params = _filters(node_group=group)
    rows = store.read(
        "SELECT node_group, rack, health, COUNT(*) AS n, "
        f"SUM(CASE WHEN last_seen < ? THEN 1 ELSE 0 END) AS stale FROM nodes{where} "
        "GROUP BY node_group, rack, health",
        [now - STALE_S, *params],
    )
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    totals = dict.fromkeys(HEALTHS, 0)
    stale = 0
    for r in rows:
        key = (r["node_group"] or NO_GROUP, r["rack"] or NO_GROUP)
        g = groups.setdefault(
            key, {"group": key[0], "rack": key[1], "nodes": 0, "stale": 0, **dict.fromkeys(HEALTHS, 0)}
        )
        health = r["health"] if r["health"] in HEALTHS else "unknown"
        g[health] += int(r["n"])
        g["nodes"] += int(r["n"])
        g["stale"] += int(r["stale"] or 0)
        totals[health] += int(r["n"])
        stale += int(r["stale"] or 0)
    where, params = _filters(time=now - 86400.0, node_group=group)
    recent = store.read(f"SELECT COUNT(*) AS n FROM incidents{where}", params)[0]["n"]
    return {
        "time": now,
        "nodes": sum(totals.values()),
        "by_health": totals,
        "stale": stale,
        "incidents_24h": int(recent),
        "groups": [groups[k] for k in sorted(groups)],
    }


def nodes(
    store: IncidentStore,
    group: str | None = None,
    rack: str | None = None,
    health: str | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Every node with its current verdict, by group, rack and host."""
    now = time.time() if now is None else now
    where, params = _filters(node_group=group, rack=rack, health=health)
    rows = store.read(f"SELECT {_NODE_COLS} FROM nodes{where} ORDER BY node_group, rack, host", params)
    for r in rows:
        r["gpu_uuids"] = _json_list(r["gpu_uuids"])
        r["stale"] = r["last_seen"] is not None and r["last_seen"] < now - STALE_S
    return rows


def lemons(
    store: IncidentStore, limit: int = 10, since: float | None = None, history: int = 3
) -> dict[str, Any]:
    """The GPUs and nodes with the most hardware incidents, each with its latest incidents."""
    if since is None:
        gpus = store.read(
            "SELECT host, gpu, gpu_uuid, rack, node_group, incidents, first_time, last_time FROM gpu_failures "
            "WHERE gpu >= 0 ORDER BY incidents DESC, last_time DESC, host, gpu LIMIT ?",
            [limit],
        )
        hosts = store.read(
            "SELECT host, MAX(rack) AS rack, MAX(node_group) AS node_group, SUM(incidents) AS incidents, "
            "MIN(first_time) AS first_time, MAX(last_time) AS last_time FROM gpu_failures "
            "GROUP BY host ORDER BY incidents DESC, last_time DESC, host LIMIT ?",
            [limit],
        )
    else:
        hw = ", ".join("?" * len(HARDWARE_CAUSES))
        base = f"FROM incidents WHERE time >= ? AND root_cause IN ({hw}) AND host IS NOT NULL"
        params = [since, *sorted(HARDWARE_CAUSES)]
        gpus = store.read(
            "SELECT host, gpu, MAX(gpu_uuid) AS gpu_uuid, MAX(rack) AS rack, MAX(node_group) AS node_group, "
            f"COUNT(*) AS incidents, MIN(time) AS first_time, MAX(time) AS last_time {base} AND gpu IS NOT NULL "
            "GROUP BY host, gpu ORDER BY incidents DESC, last_time DESC, host, gpu LIMIT ?",
            [*params, limit],
        )
        hosts = store.read(
            "SELECT host, MAX(rack) AS rack, MAX(node_group) AS node_group, COUNT(*) AS incidents, "
            f"MIN(time) AS first_time, MAX(time) AS last_time {base} "
            "GROUP BY host ORDER BY incidents DESC, last_time DESC, host LIMIT ?",
            [*params, limit],
        )
    uuids = _node_uuids(store, {g["host"] for g in gpus if not g["gpu_uuid"]})
    for g in gpus:
        if not g["gpu_uuid"] and 0 <= g["gpu"] < len(uuids.get(g["host"], [])):
            g["gpu_uuid"] = uuids[g["host"]][g["gpu"]]
    _attach_history(store, gpus, ("host", "gpu"), history)
    for h in hosts:
        h["incidents"] = int(h["incidents"])
    _attach_history(store, hosts, ("host",), history)
    return {"since": since, "gpus": gpus, "nodes": hosts}


def mtbf(store: IncidentStore, since: float | None = None, now: float | None = None) -> dict[str, Any]:
    """Mean time between failures (node-hours per incident) by root cause and by node group.

    Exposure is every known node (the ``nodes`` table and every host an incident names) over the
    window: ``since`` (else the first incident) to ``now``.
    """
    now = time.time() if now is None else now
    where, params = _filters(time=since)
    first = store.read(f"SELECT MIN(time) AS t FROM incidents{where}", params)[0]["t"]
    start = since if since is not None else first
    span_h = max(0.0, (now - start) / 3600.0) if start is not None else 0.0
    group_nodes: dict[str, int] = {}
    for r in store.read("SELECT node_group, COUNT(*) AS n FROM nodes GROUP BY node_group"):
        group_nodes[r["node_group"] or NO_GROUP] = int(r["n"])
    unseen = store.read(
        "SELECT node_group, COUNT(DISTINCT host) AS n FROM incidents WHERE host IS NOT NULL "
        "AND host NOT IN (SELECT host FROM nodes) GROUP BY node_group"
    )
    for r in unseen:
        key = r["node_group"] or NO_GROUP
        group_nodes[key] = group_nodes.get(key, 0) + int(r["n"])
    total_nodes = sum(group_nodes.values())
    causes = store.read(f"SELECT root_cause, COUNT(*) AS n FROM incidents{where} GROUP BY root_cause", params)
    hw = ", ".join("?" * len(HARDWARE_CAUSES))
    clause = f"{where} AND" if where else " WHERE"
    groups = store.read(
        f"SELECT node_group, COUNT(*) AS n FROM incidents{clause} root_cause IN ({hw}) GROUP BY node_group",
        [*params, *sorted(HARDWARE_CAUSES)],
    )

    def entry(name: str, key: str, failures: int, n_nodes: int) -> dict[str, Any]:
        hours = n_nodes * span_h
        return {key: name, "failures": failures, "node_hours": hours, "nodes": n_nodes,
                "mtbf_h": hours / failures if failures and hours else None}  # fmt: skip

    by_cause = sorted(
        (entry(r["root_cause"], "root_cause", int(r["n"]), total_nodes) for r in causes),
        key=lambda e: -e["failures"],
    )
    failed = {(r["node_group"] or NO_GROUP): int(r["n"]) for r in groups}
    by_group = [entry(g, "group", failed.get(g, 0), n) for g, n in sorted(group_nodes.items())]
    return {"since": start, "until": now, "span_h": span_h, "nodes": total_nodes,
            "by_root_cause": by_cause, "by_group": by_group}  # fmt: skip


def incidents(
    store: IncidentStore,
    host: str | None = None,
    group: str | None = None,
    since: float | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """The latest incidents with the node that wrote them, newest first."""
    where, params = _filters(host=host, node_group=group, time=since)
    return store.read(
        f"SELECT {_INCIDENT_COLS} FROM incidents{where} ORDER BY time DESC, id DESC LIMIT ?", [*params, limit]
    )


# Fleet-scoped breakers (remediate/fleetlog.py): one breaker whatever host wrote its event, so a
# reset written from a login node closes what the agents opened. Others are one per host and GPU.
_SCOPE = "CASE WHEN breaker = 'fleet' OR breaker LIKE 'job:%' THEN '' ELSE host END"


def breakers(store: IncidentStore, since: float | None = None, limit: int = 50) -> dict[str, Any]:
    """What the remediation breakers hold now (the latest state of each) and their recent events."""
    current = store.read(
        "SELECT time, host, rack, node_group, gpu, gpu_uuid, breaker, state, reason, source FROM ("
        f"SELECT *, ROW_NUMBER() OVER (PARTITION BY breaker, {_SCOPE}, gpu ORDER BY time DESC, id DESC) "
        "AS rn FROM breaker_events) latest WHERE rn = 1 ORDER BY time DESC"
    )
    where, params = _filters(time=since)
    events = store.read(
        "SELECT id, time, host, rack, node_group, gpu, gpu_uuid, breaker, state, reason, source "
        f"FROM breaker_events{where} ORDER BY time DESC, id DESC LIMIT ?",
        [*params, limit],
    )
    held = [c for c in current if c["state"] not in ("closed", "reset")]
    where, params = _filters(time=since)
    actions = store.read(
        "SELECT time, host, rack, node_group, gpu, gpu_uuid, action, target, outcome, detail, source "
        f"FROM remediation_actions WHERE outcome = 'held'{where.replace(' WHERE ', ' AND ', 1)} "
        "ORDER BY time DESC, id DESC LIMIT ?",
        [*params, limit],
    )
    return {"held": held, "current": current, "events": events, "held_actions": actions}


def _attach_history(store: IncidentStore, units: list[dict[str, Any]], keys: tuple[str, ...], n: int) -> None:
    """Each unit's latest ``n`` incidents, in one statement (one LIMIT subquery per unit)."""
    for u in units:
        u["history"] = []
    if not units:
        return
    where = " AND ".join(f"{k} = ?" for k in keys)
    part = (
        f"SELECT * FROM (SELECT {_INCIDENT_COLS} FROM incidents WHERE {where} ORDER BY time DESC LIMIT ?) h"
    )
    sql = " UNION ALL ".join([part] * len(units))
    rows = store.read(sql, [v for u in units for v in (*(u[k] for k in keys), n)])
    by_unit = {tuple(u[k] for k in keys): u for u in units}
    for r in rows:
        by_unit[tuple(r[k] for k in keys)]["history"].append(r)
    for u in units:
        u["history"].sort(key=lambda r: (-r["time"], -r["id"]))


def _node_uuids(store: IncidentStore, hosts: set[str]) -> dict[str, list[str | None]]:
    if not hosts:
        return {}
    marks = ", ".join("?" * len(hosts))
    rows = store.read(f"SELECT host, gpu_uuids FROM nodes WHERE host IN ({marks})", sorted(hosts))
    return {r["host"]: _json_list(r["gpu_uuids"]) for r in rows}


def _json_list(text: str | None) -> list[Any]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return value if isinstance(value, list) else []
