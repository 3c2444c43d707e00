"""A TensorFlow cluster across nodes: every start's worker addresses, exchanged on torch's c10d rendezvous.

    trainguard run --framework tf --nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT \\
        --rdzv-id job7 --nproc-per-node K -- python train.py

Each node's supervisor is a participant of torch's dynamic c10d rendezvous (the one torchrun's
``--rdzv-backend c10d`` uses; `TfRendezvous` drives torch's handler, no protocol of ours). Before
every start of its workers a node joins the next round, picks fresh ports for its K workers and
publishes them, with its ``--node-rank`` and address, in that round's store
(``torch.distributed.elastic.utils.store.synchronize``: each node's value under its round rank,
read back by every node). Every node orders the same values the same way (`cluster_of`: by
``--node-rank``, then the rendezvous' rank), so the cluster in ``TF_CONFIG`` is the same on every
node and worker ``i`` of node ``j`` is task ``sum(workers of the nodes before j) + i`` (with K
each: ``node_rank * K + i``). Two nodes of one host that picked the same port pick again
(`clashes`), in another exchange of the same round.

A worker lost anywhere restarts the whole cluster: the node that lost it stops its workers and
joins the next round; the others see a node waiting (``num_nodes_waiting``, the supervisor's
membership watch) and restart theirs into the same round, so every worker starts again with
fresh ports, from the newest checkpoint. A node whose job ends (finished, or stopped by its
policy) closes the rendezvous after an exit barrier, and the others' next round then fails.

The rendezvous store is hosted by node 0 (``--node-rank 0``; without ``--node-rank``, by the
node whose address is the endpoint's, torch's rule): a lost node 0 supervisor takes the store
with it, and every other node's supervisor ends (exit 1, "launcher error": the rendezvous store
went away), as under ``--launcher torch``.

    >>> a = NodeAddrs("b_1_0", 1, 0, "10.0.0.2", (7002,))
    >>> b = NodeAddrs("a_1_0", 0, 1, "10.0.0.1", (7001,))
    >>> cluster_of([a, b])[0]
    ['10.0.0.1:7001', '10.0.0.2:7002']
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError

__all__ = ["NodeAddrs", "TfRendezvous", "clashes", "cluster_of"]

log = logging.getLogger(__name__)

EXCHANGE_TIMEOUT_S = 300.0  # a node that joined the round but never published its ports
EXIT_BARRIER_TIMEOUT_S = 60.0  # torch's agent waits as long for the other nodes at the end
EXCHANGE_TRIES = 4  # port clashes between nodes of one host: pick again this many times
PREFIX = "trainguard/tf"


@dataclass(frozen=True, slots=True)
class NodeAddrs:
    """One node's workers in one round, as it publishes them."""

    name: str  # the node, as the incidents name it (host_pid_0, torch's participant shape)
    node_rank: int  # the user's --node-rank (0 when not given)
    rdzv_rank: int  # its rank in this round of the rendezvous
    host: str  # the address its workers listen on
    ports: tuple[int, ...]  # one per worker, local rank order

    def to_bytes(self) -> bytes:
        return json.dumps([self.name, self.node_rank, self.rdzv_rank, self.host, list(self.ports)]).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> NodeAddrs:
        name, node_rank, rdzv_rank, host, ports = json.loads(data)
        return cls(str(name), int(node_rank), int(rdzv_rank), str(host), tuple(int(p) for p in ports))


def ordered(nodes: Sequence[NodeAddrs]) -> list[NodeAddrs]:
    """Every node's order of the round's nodes: by --node-rank, then the rendezvous' rank."""
    return sorted(nodes, key=lambda n: (n.node_rank, n.rdzv_rank))


def cluster_of(nodes: Sequence[NodeAddrs]) -> tuple[list[str], dict[str, int]]:
    """The cluster's worker addresses (TF_CONFIG's ``worker`` list) and each node's first task."""
    workers: list[str] = []
    first: dict[str, int] = {}
    for node in ordered(nodes):
        first[node.name] = len(workers)
        workers += [f"{node.host}:{p}" for p in node.ports]
    return workers, first


def clashes(nodes: Sequence[NodeAddrs]) -> set[str]:
    """The nodes that must pick their ports again: each port of one host goes to the first node
    (in cluster order) that published it."""
    taken: set[tuple[str, int]] = set()
    again: set[str] = set()
    for node in ordered(nodes):
        mine = {(node.host, p) for p in node.ports}
        if mine & taken:
            again.add(node.name)
        taken |= mine
    return again


def local_host(local_addr: str | None) -> str:
    """The address this node's workers are reached at: ``--local-addr``, else the host's name
    (what torch's rendezvous names a node by)."""
    return local_addr or socket.getfqdn()


class TfRendezvous:
    """This node's part in the job's c10d rendezvous (see the module docstring)."""

    def __init__(
        self, endpoint: str, run_id: str, nnodes: str, conf: str, node_rank: int | None, local_addr: str | None,
        pid: int,
    ) -> None:  # fmt: skip
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
        from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

        low, _, high = nnodes.partition(":")
        try:
            options = _parse_rendezvous_config(conf)
        except ValueError as exc:
            raise ConfigError(f"--rdzv-conf {conf}: {exc}") from None
        if node_rank is not None:  # node 0 hosts the store, unless the user said otherwise
            options.setdefault("is_host", str(node_rank == 0).lower())
        self.node_rank = node_rank or 0
        self.host = local_host(local_addr)
        self.name = f"{self.host}_{pid}_0"
        params = RendezvousParameters(
            "c10d", endpoint, run_id, int(low), int(high or low), local_addr=local_addr, **options
        )
        self.handler: Any = get_rendezvous_handler(params)
        self.store: Any = None
        self.rank, self.world = 0, 0
        self.nodes: list[NodeAddrs] = []
        self.round = 0

    def join(self, pick: Callable[[int, set[int]], list[int]], n: int) -> list[NodeAddrs]:
        """Join the next round and exchange addresses: ``pick(n, avoid)`` gives this node's ports.
        The round's nodes, in cluster order."""
        from torch.distributed.elastic.utils.store import synchronize

        info = self.handler.next_rendezvous()
        self.store, self.rank, self.world = info.store, info.rank, info.world_size
        self.round += 1
        avoid: set[int] = set()
        ports = pick(n, avoid)
        for attempt in range(EXCHANGE_TRIES):
            mine = NodeAddrs(self.name, self.node_rank, self.rank, self.host, tuple(ports))
            data = synchronize(self.store, mine.to_bytes(), self.rank, self.world, f"{PREFIX}/{attempt}/",
                               EXCHANGE_TIMEOUT_S)  # fmt: skip
            nodes = [NodeAddrs.from_bytes(d) for d in data]
            again = clashes(nodes)
            if not again:
                self.nodes = ordered(nodes)
                return self.nodes
            if self.name in again:  # every node sees the same clashes: the same nodes pick again
                avoid = {p for node in nodes for p in node.ports}
                ports = pick(n, avoid)
        raise RuntimeError(f"the nodes' worker ports clashed {EXCHANGE_TRIES} times in a row")

    def nodes_waiting(self) -> int:
        return int(self.handler.num_nodes_waiting())

    def close(self, finished: bool) -> None:
        """The job ended here: wait for the other nodes to finish too (they may still read the
        store node 0 hosts), then close the rendezvous, which ends any node still in it."""
        from torch.distributed.elastic.utils.store import barrier

        try:
            if finished and self.store is not None:
                barrier(self.store, self.world, f"{PREFIX}/exit", EXIT_BARRIER_TIMEOUT_S)
        except Exception as exc:  # the others ended first, or their store went away
            log.warning("tf: exit barrier: %s", exc)
        try:
            self.handler.shutdown()
        except Exception as exc:
            log.warning("tf: closing the rendezvous: %s", exc)
