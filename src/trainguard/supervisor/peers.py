"""A peer node the job lost, as this node's supervisor sees it (pure).

On a multi-node job only this node's ranks report to this supervisor. A peer node that dies whole
(killed, lost power, kernel panic) leaves no error file here: the survivors fail with
"Connection reset by peer" or "Connection closed by peer [addr]:port" (in the Guard's error file,
torchelastic's under ``@record``, or only their stderr), which the log classifier files under the
network. `peer_node_trouble` turns such a failure into what the evidence
supports, with ``incidents.nodes.node_failure`` judging the survivors' lines: a node named by the
evidence (torch elastic's dead-node line, a peer address that maps to a node) is a node failure
naming that node and its ranks; lines that only say a connection was lost leave it "unknown"
with both suspects, the other node (named, with its ranks) and the network between the two.
`peer_left` decides it later: a re-rendezvous without that node is the node's failure.

The nodes are torch elastic's rendezvous participants, ``<host>_<pid>_<n>`` (what its
"Detected dead node" line names), with their global ranks (`elastic.GuardedAgent.peers`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from trainguard.incidents import RootCause, suspects
from trainguard.incidents.nodes import NodeLine, node_failure
from trainguard.records import HARDWARE_CATEGORIES, Event, Severity
from trainguard.rundir import ErrorRecord
from trainguard.supervisor.policy import Trouble

__all__ = ["NODE_FAILURE", "peer_left", "peer_node_trouble"]

NODE_FAILURE = "node_failure"  # the trouble's category when a peer node failed

# What a surviving rank prints when a peer stops answering (symptoms of a peer, never causes).
_PEER_LOSS = re.compile(
    r"Connection (?:closed|reset)|Broken pipe|remote process exited|failed : Connection|recvValue failed|"
    r"timed out|[Tt]imeout|Watchdog caught|DistNetworkError|Detected dead node"
    r"|UnavailableError",  # TensorFlow's collectives when a peer task is gone
)
_DEAD = re.compile(r"Detected dead node '(?P<node>[^']+)'")
# The causes a peer node's death shows as on the survivors: only these are judged again.
_PEER_CAUSES = {
    RootCause.NETWORK_SWITCH_CABLE,
    RootCause.NCCL_WATCHDOG_TIMEOUT,
    RootCause.NIC,
    RootCause.UNKNOWN,
}


def _span(ranks: Sequence[int]) -> str:
    rs = sorted(ranks)
    if not rs:
        return "ranks unknown"
    return (
        f"ranks {rs[0]}-{rs[-1]}" if len(rs) > 1 and rs == list(range(rs[0], rs[-1] + 1)) else f"rank(s) {rs}"
    )


def peer_node_trouble(
    trouble: Trouble,
    node: str | None,
    local_ranks: Sequence[int],
    peers: Mapping[str, Sequence[int]],
    errors: Sequence[ErrorRecord],
    events: Sequence[Event],
    last_errors: Mapping[int, str] | None = None,
) -> Trouble | None:
    """The failure of a multi-node job's peer node, when that is what this node's failed ranks
    show; None when it is this node's own (a local cause, or a rank that failed otherwise).

    ``node``: this node's rendezvous name; ``peers``: the other nodes -> their global ranks;
    ``errors``: the Guard's error files; ``last_errors``: failed rank -> the exception it died
    of, for a rank without one (torchelastic's error file or its stderr: any script leaves that)."""
    if not peers or trouble.root_cause not in _PEER_CAUSES or trouble.category in HARDWARE_CATEGORIES:
        return None
    mine = set(local_ranks)
    texts: list[tuple[int, float | None, str]] = [
        (e.rank, e.time, f"{e.exc_type}: {e.message}") for e in errors if e.rank in mine
    ]
    guarded = {r for r, _, _ in texts}
    texts += [(r, None, t) for r, t in sorted((last_errors or {}).items()) if r in mine and r not in guarded]
    if not texts or not all(_PEER_LOSS.search(t) for _, _, t in texts):
        return None  # no error file, or one that says something else went wrong here
    here = node or "this node"
    lines = [NodeLine(r, here, t, text) for r, t, text in texts]
    lines += [
        NodeLine(None, here, e.time, e.text)
        for e in events
        if e.severity in (Severity.ERROR, Severity.FATAL) or "dead node" in e.text
    ]
    host_of_rank = {r: here for r in mine} | {r: p for p, rs in peers.items() for r in rs}
    # a peer's address names it, unless another node has it too (two nodes on one host)
    hosts = [p.rsplit("_", 2)[0] for p in [here, *peers]]
    addresses = {h: p for h, p in zip(hosts[1:], peers, strict=True) if hosts.count(h) == 1}
    for ln in lines:  # torch elastic names the participant it removed
        if (m := _DEAD.search(ln.text)) and m["node"] in peers:
            why = f"elastic removed dead node {m['node']!r}: {ln.text.strip()[:200]}"
            return _node_failed(trouble, m["node"], tuple(peers[m["node"]]), (why,))
    verdict = node_failure(lines, host_of_rank, addresses)
    if verdict is not None and verdict.host is not None and verdict.host != here:
        return _node_failed(trouble, verdict.host, verdict.ranks, verdict.evidence)
    candidates = tuple(verdict.suspects) if verdict is not None and verdict.suspects else tuple(sorted(peers))
    candidates = tuple(c for c in candidates if c in peers) or tuple(sorted(peers))
    first = min(lines, key=lambda ln: ln.time if ln.time is not None else float("inf"))
    named = "; ".join(f"{p} ({_span(peers[p])})" for p in candidates)
    ranks = tuple(sorted(r for p in candidates for r in peers[p]))
    return replace(
        trouble,
        category="unknown",
        root_cause=RootCause.UNKNOWN,
        rank=None,
        ranks=ranks,
        gpu=None,
        gpu_health=None,
        signature=None,
        summary=f"lost the connection to node {named}: {first.text.strip()}"[:300],
        evidence=(
            suspects(
                (RootCause.HOST, f"node {named} failed: killed, lost power or its host crashed"),
                (RootCause.NETWORK_SWITCH_CABLE, f"the network between {here} and node {named}"),
            ),
            *[f"rank {ln.rank} on {here}: {ln.text.strip()[:200]}" for ln in lines if ln.rank is not None][
                :4
            ],
            *trouble.evidence,
        ),
        extra={**trouble.extra, "suspect_nodes": list(candidates), "ranks": list(ranks)},
    )


def _node_failed(trouble: Trouble, host: str, ranks: Sequence[int], evidence: Sequence[str]) -> Trouble:
    return replace(
        trouble,
        category=NODE_FAILURE,
        root_cause=RootCause.HOST,
        rank=min(ranks) if ranks else None,
        ranks=tuple(ranks),
        gpu=None,
        gpu_health=None,
        signature=None,
        summary=f"node {host} ({_span(ranks)}) failed"[:300],
        evidence=(*evidence, *trouble.evidence),
        extra={**trouble.extra, "node": host, "ranks": list(ranks)},
    )


def peer_left(
    suspect_nodes: Sequence[str], ranks: Sequence[int], peers_now: Mapping[str, Sequence[int]]
) -> dict[str, Any] | None:
    """The changes that decide an "unknown" peer-node incident once the job re-formed: the one
    suspect node that is no longer a rendezvous participant failed (its ranks: ``ranks`` of the
    failed attempt). None: the rendezvous does not decide it."""
    gone = [p for p in suspect_nodes if p not in peers_now]
    if len(gone) != 1:
        return None
    named = ranks if len(suspect_nodes) == 1 else ()
    return {
        "root_cause": RootCause.HOST,
        "category": NODE_FAILURE,
        "rank": min(named) if named else None,
        "node": gone[0],
        "summary": f"node {gone[0]} ({_span(named)}) failed: the job re-formed without it",
    }
