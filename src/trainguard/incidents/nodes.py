"""Which node a multi-node job lost, from what the survivors print (pure).

Where it sits: ``logs explain`` gathers a job's lines (``incidents.joblogs``) and asks
`node_failure` whether the failure is a node's (killed, lost power, network gone) before it
settles for the rank-level explanation. A peer node that left is a node failure naming that node,
or "unknown" with the suspects, never the network by default: "Connection reset by peer" is what
every survivor of a dead node prints.

Evidence, strongest first:

1. torch elastic's ``Detected dead node '<host>_<pid>_<n>'`` (the rendezvous removed it), and the
   launchers' and schedulers' own word on a lost node (Open MPI/PRRTE's ``Remote daemon: ... on
   node <host>``, Slurm's ``Node failure on <host>``, Ray's ``... ip: <addr> has been marked dead``:
   ``detect.culprit.lost_node``);
2. survivors naming a peer's address in a reset/closed connection (gloo ``Connection closed by
   peer [addr]:port``, NCCL ``Call to recv from addr<port> failed``, ``Connection closed by remote
   peer host<port>``, TCPStore ``remote=[host]:port``), mapped to a host by NCCL's bootstrap lines
   (``host:pid:tid [d] NCCL INFO Bootstrap : Using eth0:10.0.0.17<0>``) — a reporter never
   accuses its own host;
3. ranks whose output stops: every rank of one host falls silent before the others' first error.

One host from the evidence: that node, its ranks. Two hosts accusing each other: unknown, both
suspects.

>>> lines = [NodeLine(0, "a", 10.0, "RuntimeError: Connection closed by peer [10.0.0.2]:4242")]
>>> node_failure(lines, {0: "a", 1: "b"}, {"10.0.0.2": "b"}).host
'b'
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from trainguard.detect.culprit import lost_node

__all__ = ["LostNode", "NodeLine", "bootstrap_addresses", "lone_rank", "node_failure"]


@dataclass(frozen=True, slots=True)
class NodeLine:
    rank: int | None
    host: str | None  # the host of the rank that printed it
    time: float | None
    text: str


@dataclass(frozen=True, slots=True)
class LostNode:
    """The node a multi-node job lost, as its survivors' lines tell it."""

    host: str | None  # the failed node; None when the evidence cannot decide
    ranks: tuple[int, ...]
    category: str  # node_failure | unknown
    evidence: tuple[str, ...]
    suspects: tuple[str, ...] = field(default=())


_DEAD = re.compile(r"Detected dead node '(?P<node>[^']+)'")
_PEER = re.compile(
    r"(?:Connection (?:closed|reset) by (?:remote )?peer|Call to (?:recv|send) (?:from|to)|remote=|peer)\s*"
    r"\[?(?P<addr>[A-Za-z0-9][\w.\-]*?|[0-9a-fA-F:]+)\]?(?:[:<]\d+)"
)
_LOSS = re.compile(
    r"Connection (?:closed|reset)|Broken pipe|remote process exited|failed : Connection|recvValue failed"
)
_FAIL = re.compile(_LOSS.pattern + r"|timed out|[Tt]imeout|Watchdog caught")
_BOOT = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(?P<host>[^\s:\[\]]+):\d+:\d+ \[\d+\] NCCL INFO Bootstrap ?: Using \w+:(?P<addr>[\w.:]+)<",
    re.M,
)


def bootstrap_addresses(text: str) -> dict[str, str]:
    """address -> host from NCCL's bootstrap lines."""
    return {m["addr"]: m["host"] for m in _BOOT.finditer(text)}


def _host_of(addr: str, addresses: dict[str, str], hosts: set[str]) -> str | None:
    if addr in addresses:
        return addresses[addr]
    short = addr.split(".")[0]
    return addr if addr in hosts else short if short in hosts else None


def node_failure(
    lines: Iterable[NodeLine],
    host_of_rank: dict[int, str],
    addresses: dict[str, str],
    last_seen: dict[int, float] | None = None,
) -> LostNode | None:
    """The node the job lost, or None when nothing points at a node (see the module docstring).

    ``last_seen``: rank -> time of its last stamped line (for ranks whose output stops)."""
    hosts = set(host_of_rank.values())
    ranks_of: dict[str, list[int]] = {}
    for r, h in host_of_rank.items():
        ranks_of.setdefault(h, []).append(r)
    if len(hosts) < 2:
        return None
    dead: Counter[str] = Counter()
    accused: dict[str, set[str]] = {}  # accused host -> hosts of the accusers
    why: dict[str, list[str]] = {}
    first_error: float | None = None
    for ln in lines:
        if m := _DEAD.search(ln.text):
            host = m["node"].rsplit("_", 2)[0]
            host = _host_of(host, addresses, hosts) or host
            dead[host] += 1
            why.setdefault(host, []).append(f"elastic removed dead node {m['node']!r}")
            continue
        if (lost := lost_node(ln.text)) is not None:
            host = _host_of(lost, addresses, hosts) or lost
            dead[host] += 1
            why.setdefault(host, []).append(f"reported lost: {ln.text.strip()[:200]}")
            continue
        if not _FAIL.search(ln.text):
            continue
        if ln.time is not None:
            first_error = ln.time if first_error is None else min(first_error, ln.time)
        if not _LOSS.search(ln.text):
            continue
        for m in _PEER.finditer(ln.text):
            peer = _host_of(m["addr"], addresses, hosts)
            if peer is None or peer == ln.host:
                continue
            accused.setdefault(peer, set()).add(ln.host or "?")
            if len(why.setdefault(peer, [])) < 3:
                who = f"rank {ln.rank}" if ln.rank is not None else "a survivor"
                why[peer].append(f"{who} on {ln.host}: {ln.text.strip()[:200]}")
    silent = _silent_hosts(ranks_of, last_seen or {}, first_error)
    for host in silent:
        why.setdefault(host, []).append(
            f"every rank of {host} ({_span(ranks_of[host])}) stopped printing before the others' first error"
        )
    if dead:
        candidates = set(dead)
    elif accused:  # a silent accused host, else one whose accusers are not accused themselves
        candidates = (
            (set(accused) & silent) or {h for h in accused if not accused[h] & set(accused)} or set(accused)
        )
    elif silent:
        candidates = silent
    else:
        return None
    if len(candidates) != 1:
        evidence = tuple(e for h in sorted(candidates) for e in why.get(h, []))
        return LostNode(None, (), "unknown", evidence, tuple(sorted(candidates)))
    host = candidates.pop()
    return LostNode(host, tuple(sorted(ranks_of.get(host, []))), "node_failure", tuple(why.get(host, [])))


def _silent_hosts(
    ranks_of: dict[str, list[int]], last_seen: dict[int, float], first_error: float | None
) -> set[str]:
    if first_error is None:
        return set()
    out = set()
    for host, ranks in ranks_of.items():
        seen = [last_seen[r] for r in ranks if r in last_seen]
        if seen and len(seen) == len(ranks) and max(seen) < first_error:
            out.add(host)
    return out


def _span(ranks: list[int]) -> str:
    rs = sorted(ranks)
    return f"ranks {rs[0]}-{rs[-1]}" if rs == list(range(rs[0], rs[-1] + 1)) else f"ranks {rs}"


def lone_rank(timed_out: set[int], ranks: set[int]) -> int | None:
    """The only rank of a job that did not time out while every other one did (the hang's origin:
    it never entered the collective the others waited in), else None."""
    rest = ranks - timed_out
    return next(iter(rest)) if len(ranks) >= 2 and len(rest) == 1 and timed_out <= ranks else None
