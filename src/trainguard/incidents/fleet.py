"""Fleet writes: a node's verdict changes, remediation actions and breaker events.

    agent tick -> NodeVerdict -> FleetWriter.observe()  --changes only-->  nodes, verdicts
    remediation (trainguard.remediate) -> FleetWriter.action() / .breaker()

A `FleetWriter` is one node's writer: its identity (host, rack, group, GPU UUIDs) goes on every
row, it remembers what it wrote last and writes a verdict row only when a GPU's (or the node's,
``gpu = -1``) health, action or reason changes, plus a heartbeat of the node row every
``heartbeat_s``. Writes go through `IncidentStore` (its spool included) and are idempotent::

    >>> import tempfile, os
    >>> from trainguard.incidents import IncidentStore
    >>> from trainguard.incidents.identity import NodeIdentity
    >>> store = IncidentStore(os.path.join(tempfile.mkdtemp(), "tg.db"))
    >>> w = FleetWriter(store, NodeIdentity("gpu-001", rack="r1", group="a"))
    >>> w.breaker("gpu_reset", "open", reason="3 resets in 1h", gpu=2, time=50.0)
    >>> store.read("SELECT host, breaker, state FROM breaker_events")
    [{'host': 'gpu-001', 'breaker': 'gpu_reset', 'state': 'open'}]
    >>> store.close()

``breaker_events`` (written by the remediation breakers, read by ``trainguard fleet breaker``):
``key`` (idempotency), ``time``, ``host``, ``rack``, ``node_group``, ``gpu`` (None: the node),
``gpu_uuid``, ``breaker`` (its name), ``state`` (closed | open | half_open | held | reset),
``reason``, ``source`` (who wrote it). ``remediation_actions``: ``time``, node columns, ``gpu``,
``action``, ``target``, ``outcome`` (dry_run | held | done | already | failed | ambiguous),
``detail``, ``incident_key``, ``source``. What remediation writes: remediate/fleetlog.py.
"""

from __future__ import annotations

import json
import time as _time
from typing import TYPE_CHECKING, Any

from trainguard.incidents.identity import NodeIdentity, gpu_uuids, row_key

if TYPE_CHECKING:
    from trainguard.incidents.backend import Backend
    from trainguard.incidents.store import IncidentStore
    from trainguard.records import NodeVerdict

NODE = -1  # the gpu column of a node-level verdict or failure
_State = tuple[str, str, str]  # health, action, reason


class FleetWriter:
    def __init__(self, store: IncidentStore, identity: NodeIdentity, *, heartbeat_s: float = 60.0) -> None:
        self.store = store
        self.identity = identity
        self.heartbeat_s = heartbeat_s
        self._last: dict[int, _State] = {}
        self._last_write: float | None = None

    def observe(self, verdict: NodeVerdict, now: float) -> int:
        """Write what changed since the last verdict (and replay the spool); returns rows written."""
        uuids = gpu_uuids(verdict)
        if uuids and uuids != self.identity.gpu_uuids:
            self.identity = self.identity.with_gpus(uuids)
        states: dict[int, _State] = {
            NODE: (verdict.health.value, verdict.action.value, _reason([f.reason for f in verdict.findings]))
        }
        for g in verdict.gpus:
            states[g.gpu.index] = (g.health.value, g.action.value, _reason(g.reasons))
        node_state = (verdict.health.value, verdict.action.value, _reason(verdict.reasons))
        return self.record(states, now, node_state)

    def record(self, states: dict[int, _State], now: float, node_state: _State) -> int:
        """Write the states (gpu index or NODE -> health, action, reason) that changed."""
        changed = {gpu: s for gpu, s in states.items() if self._last.get(gpu) != s}
        beat = self._last_write is None or now - self._last_write >= self.heartbeat_s
        if not changed and not beat:
            self.store.flush_spool()
            return 0
        n = self.identity
        rows = [
            {"key": row_key("verdict", n.host, gpu, now, *s), "host": n.host, "rack": n.rack,
             "node_group": n.group, "gpu": gpu, "gpu_uuid": n.uuid_of(gpu), "time": now,
             "health": s[0], "action": s[1], "reason": s[2]}
            for gpu, s in sorted(changed.items())
        ]  # fmt: skip
        node = {
            "host": n.host, "rack": n.rack, "node_group": n.group,
            "gpu_uuids": json.dumps(list(n.gpu_uuids)), "health": node_state[0], "action": node_state[1],
            "reason": node_state[2], "since": now, "last_seen": now,
        }  # fmt: skip
        self.store._submit("verdicts", {"node": node, "rows": rows, "changed": bool(changed)})
        self._last.update(changed)
        self._last_write = now
        return len(rows)

    def action(
        self,
        action: str,
        *,
        outcome: str,
        target: str | None = None,
        gpu: int | None = None,
        detail: str = "",
        incident_key: str | None = None,
        source: str = "remediate",
        time: float | None = None,
    ) -> None:
        """One remediation action taken (or held back) on this node."""
        t = _time.time() if time is None else time
        n = self.identity
        row = {
            "key": row_key("action", n.host, t, action, target, gpu, outcome), "time": t, "host": n.host,
            "rack": n.rack, "node_group": n.group, "gpu": gpu, "gpu_uuid": n.uuid_of(gpu),
            "action": action, "target": target, "outcome": outcome, "detail": detail,
            "incident_key": incident_key, "source": source,
        }  # fmt: skip
        self.store._submit("action", {"row": row})

    def breaker(
        self,
        breaker: str,
        state: str,
        *,
        reason: str = "",
        gpu: int | None = None,
        source: str = "remediate",
        time: float | None = None,
    ) -> None:
        """A breaker changed state (closed | open | half_open | held | reset)."""
        t = _time.time() if time is None else time
        n = self.identity
        row = {
            "key": row_key("breaker", n.host, t, breaker, state, gpu), "time": t, "host": n.host,
            "rack": n.rack, "node_group": n.group, "gpu": gpu, "gpu_uuid": n.uuid_of(gpu),
            "breaker": breaker, "state": state, "reason": reason, "source": source,
        }  # fmt: skip
        self.store._submit("breaker", {"row": row})


def _reason(reasons: list[str]) -> str:
    return "; ".join(reasons)[:500]


def apply(backend: Backend, op: str, p: dict[str, Any]) -> None:
    """Run one fleet write (called by `IncidentStore`, directly or replaying its spool)."""
    if op == "verdicts":
        _verdicts(backend, p["node"], p["rows"], p.get("changed", True))
    elif op in ("action", "breaker"):
        table = "remediation_actions" if op == "action" else "breaker_events"
        row = p["row"]
        cols = list(row)
        with backend.transaction() as tx:
            tx.run(
                f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                "ON CONFLICT (key) DO NOTHING",
                tuple(row.values()),
            )
    else:
        raise ValueError(f"unknown store write {op!r}")


def _verdicts(backend: Backend, node: dict[str, Any], rows: list[dict[str, Any]], changed: bool) -> None:
    cols = list(node)
    # A heartbeat moves last_seen only; a change also moves the state and its `since`. A replayed
    # older write never overwrites a newer one.
    update = (
        "rack = excluded.rack, node_group = excluded.node_group, gpu_uuids = excluded.gpu_uuids, "
        "health = excluded.health, action = excluded.action, reason = excluded.reason, "
        "since = CASE WHEN excluded.health = nodes.health THEN nodes.since ELSE excluded.since END, "
    )
    sql = (
        f"INSERT INTO nodes ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
        f"ON CONFLICT (host) DO UPDATE SET {update if changed else ''}last_seen = excluded.last_seen "
        "WHERE nodes.last_seen IS NULL OR excluded.last_seen >= nodes.last_seen"
    )
    with backend.transaction(durable=False) as tx:
        tx.run(sql, tuple(node.values()))
        if rows:
            from trainguard.incidents.store import _values

            vcols = list(rows[0])
            tx.run(
                f"INSERT INTO verdicts ({', '.join(vcols)}) VALUES {_values(len(rows), len(vcols))} "
                "ON CONFLICT (key) DO NOTHING",
                [r[c] for r in rows for c in vcols],
            )
