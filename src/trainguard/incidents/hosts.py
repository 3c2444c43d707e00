"""Which hosts a job may use now, with their slots: MPI host files and Horovod's host discovery.

    store: nodes + verdicts + remediation_actions --read_nodes--> {host: NodeState}
    agents' verdicts (trainguard hosts --agent)   --node_state--> NodeState
        --choose(states, wanted)--> [Host] (slots, or why it is left out) --render--> text

A host is left out when its node verdict is FAILED (not for a failed GPU: that GPU's slot goes) or
asks for a drain, when remediation drained,
cordoned or sent it to hardware inspection (and no resume followed), when its agent has been
silent for ``stale_s``, or when none of its GPUs is left. Its slots are its GPUs whose latest
verdict is not FAILED, at most the slots asked for (GPUs not known: the slots asked for). A host the store has never heard
of is kept: unknown is not broken. ``choose`` and the formats are pure::

    >>> states = {"a": NodeState("a", gpus=2), "b": NodeState("b", health="failed", reason="xid 79")}
    >>> hosts = choose(states, None, now=0.0)
    >>> print(render(hosts, "horovod"))
    a:2
    >>> [h.left_out for h in hosts]
    ['', 'failed: xid 79']
    >>> parse_host_list("n1:4,n2")
    [('n1', 4), ('n2', None)]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainguard.errors import ConfigError

if TYPE_CHECKING:
    from trainguard.incidents.store import IncidentStore
    from trainguard.records import NodeVerdict

__all__ = [
    "FORMATS",
    "Host",
    "NodeState",
    "choose",
    "from_verdict",
    "parse_host_list",
    "parse_hostfile",
    "read_nodes",
    "render",
]

FORMATS = ("horovod", "hostfile", "host", "json")
STALE_S = 300.0  # as the fleet readers: an agent heartbeats its node row every 60 s
OUT_OF_SERVICE = {"drain": "drained", "cordon": "cordoned", "hardware_inspection": "in hardware inspection"}
DONE = ("done", "already")
Wanted = Sequence[tuple[str, "int | None"]]  # (host, slots asked for; None: what the host has)


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the fleet knows of one host."""

    host: str
    health: str = "unknown"  # the node verdict: ok | degraded | failed | unknown
    action: str = "none"  # the verdict's action (actions.Advice value)
    reason: str = ""
    gpus: int = 0  # GPUs the node has (0: not known)
    failed_gpus: tuple[int, ...] = ()  # GPUs whose latest verdict is FAILED
    out_of_service: str = ""  # "drained by remediate: ..." while remediation holds it out
    last_seen: float | None = None  # None: no heartbeat time known (agents' verdicts are fresh)


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    slots: int
    left_out: str = ""  # why the host is not usable now ("" when it is)


def choose(
    states: Mapping[str, NodeState],
    wanted: Wanted | None,
    now: float,
    stale_s: float = STALE_S,
    default_slots: int = 1,
) -> list[Host]:
    """Every host of ``wanted`` (default: every host in ``states``), usable or with why not."""
    pairs = list(wanted) if wanted is not None else [(h, None) for h in sorted(states)]
    out = []
    for name, asked in pairs:
        st = states.get(name)
        if st is None:  # never heard of: kept, as asked
            out.append(Host(name, asked if asked is not None else default_slots))
            continue
        healthy = st.gpus - len(st.failed_gpus)
        if st.gpus <= 0:  # GPUs not known: what was asked
            slots = asked if asked is not None else default_slots
        else:
            slots = min(asked, healthy) if asked is not None else healthy
        out.append(Host(name, max(0, slots), _why_out(st, now, stale_s, slots)))
    return out


def _why_out(st: NodeState, now: float, stale_s: float, slots: int) -> str:
    if st.out_of_service:
        return st.out_of_service
    if st.health == "failed" and not st.failed_gpus:  # the node's own failure, not its GPUs'
        return f"failed: {st.reason}".rstrip(": ")
    if st.action == "drain":
        return f"its agent asks for a drain: {st.reason}".rstrip(": ")
    if st.last_seen is not None and now - st.last_seen > stale_s:
        return f"no word from its agent for {now - st.last_seen:.0f} s"
    if slots <= 0:
        failed = ", ".join(map(str, st.failed_gpus))
        return f"no healthy GPU left (failed: {failed})" if failed else "no slots"
    return ""


def render(hosts: Sequence[Host], fmt: str) -> str:
    """The usable hosts as ``horovod`` (``host:slots`` lines, Horovod's discovery contract),
    ``hostfile`` (Open MPI's ``host slots=N``), ``host`` (mpirun's ``--host a:2,b:2``) or ``json``
    (every host, with why it is left out)."""
    usable = [h for h in hosts if not h.left_out]
    if fmt == "horovod":
        return "\n".join(f"{h.name}:{h.slots}" for h in usable)
    if fmt == "hostfile":
        return "\n".join(f"{h.name} slots={h.slots}" for h in usable)
    if fmt == "host":
        return ",".join(f"{h.name}:{h.slots}" for h in usable)
    if fmt == "json":
        return json.dumps([{"host": h.name, "slots": h.slots, "left_out": h.left_out or None} for h in hosts])
    raise ConfigError(f"--format {fmt}: use one of {', '.join(FORMATS)}")


def read_nodes(store: IncidentStore, group: str | None = None) -> dict[str, NodeState]:
    """Each node's state from the fleet store: its row, its GPUs' latest verdicts, and the latest
    scheduler remediation (drain, cordon, hardware inspection, resume) that took effect on it."""
    where, params = (" WHERE node_group = ?", [group]) if group else ("", [])
    rows = store.read(f"SELECT host, gpu_uuids, health, action, reason, last_seen FROM nodes{where}", params)
    failed: dict[str, list[int]] = {}
    for r in store.read(
        "SELECT v.host, v.gpu, v.health FROM verdicts v JOIN (SELECT host, gpu, MAX(time) AS t "
        "FROM verdicts WHERE gpu >= 0 GROUP BY host, gpu) last "
        "ON v.host = last.host AND v.gpu = last.gpu AND v.time = last.t"
    ):
        if r["health"] == "failed":
            failed.setdefault(r["host"], []).append(int(r["gpu"]))
    held: dict[str, str] = {}
    remedies = (*OUT_OF_SERVICE, "resume")
    marks = ", ".join("?" * len(remedies))
    for r in store.read(
        "SELECT COALESCE(target, host) AS node, action, detail, source, time FROM remediation_actions "
        f"WHERE action IN ({marks}) AND outcome IN ('done', 'already') ORDER BY time, id",
        [*remedies],
    ):
        if r["action"] == "resume":
            held.pop(r["node"], None)
        else:
            by = f" by {r['source']}" if r["source"] else ""
            held[r["node"]] = f"{OUT_OF_SERVICE[r['action']]}{by}: {r['detail']}".rstrip(": ")
    out = {}
    for r in rows:
        host = r["host"]
        out[host] = NodeState(
            host,
            health=r["health"],
            action=r["action"],
            reason=r["reason"] or "",
            gpus=len(_json_list(r["gpu_uuids"])),
            failed_gpus=tuple(sorted(set(failed.get(host, ())))),
            out_of_service=held.get(host, ""),
            last_seen=r["last_seen"],
        )
    for host, why in held.items():  # drained, though its agent never wrote a node row
        out.setdefault(host, NodeState(host, out_of_service=why))
    return out


def from_verdict(host: str, verdict: NodeVerdict | None, source: str) -> NodeState:
    """A host's state from its agent's verdict (None: the agent gave none, so it is left out)."""
    if verdict is None:
        return NodeState(host, out_of_service=f"no verdict from its agent at {source}")
    return NodeState(
        host,
        health=verdict.health.value,
        action=verdict.action.value,
        reason="; ".join(verdict.reasons)[:300],
        gpus=len(verdict.gpus),
        failed_gpus=tuple(g.gpu.index for g in verdict.gpus if g.health.value == "failed"),
    )


def parse_host_list(text: str) -> list[tuple[str, int | None]]:
    """mpirun's ``--host a:2,b`` (and Horovod's ``-H``): (host, slots or None)."""
    out: list[tuple[str, int | None]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, slots = item.partition(":")
        out.append((name, _slots(slots, item) if slots else None))
    return out


def parse_hostfile(text: str) -> list[tuple[str, int | None]]:
    """An Open MPI host file (``host slots=N [max_slots=M]``, ``#`` comments) or Horovod's
    discovery output (``host:slots``): (host, slots or None), in order."""
    out: list[tuple[str, int | None]] = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if ":" in words[0] and len(words) == 1:
            out.extend(parse_host_list(words[0]))
            continue
        slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "slot="))), None)
        out.append((words[0], _slots(slots, line.strip()) if slots is not None else None))
    return out


def _slots(text: str, item: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"{item!r}: slots must be a whole number (host:4 or host slots=4)")
    return int(text)


def _json_list(text: str | None) -> list[str]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
