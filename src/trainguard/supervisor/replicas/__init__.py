"""replicas: ``trainguard run --replica-groups N``, the supervisor at job scale (docs/no-restart.md).

N replica groups, each a ``trainguard run`` of its own (the job loop, `supervisor.supervisor`),
under torchft's Lighthouse; a failed group is replaced while the others keep training.

    loop.py        the replica loop: look -> judge -> act over the groups (`ReplicaSupervisor`)
    judge.py       what it knows of each group and what to do about what it saw (pure)
    start.py       a group's config (the job's, `to_argv`), environment and process
    node.py        one node's share of a group that spans nodes (``--replica-group-id``): the job
                   loop with the group's config and environment, no replica loop
    lighthouse.py  torchft's Lighthouse as a child process
    result.py      its typed result (`ReplicaResult`), each group's runs read back typed
    console.py     each group's output on the job's console (``[g<i>] ...``)

Importing this package imports neither torch nor torchft (the groups' workers do).
"""

from __future__ import annotations

from trainguard.supervisor.replicas.lighthouse import Lighthouse, LighthouseConfig, program
from trainguard.supervisor.replicas.loop import ReplicaSupervisor
from trainguard.supervisor.replicas.node import node_group, node_group_refusal
from trainguard.supervisor.replicas.result import GroupResult, GroupRun, ReplicaResult
from trainguard.supervisor.replicas.start import ReplicaConfig, group_config, group_hang_floor

__all__ = [
    "GroupResult",
    "GroupRun",
    "Lighthouse",
    "LighthouseConfig",
    "ReplicaConfig",
    "ReplicaResult",
    "ReplicaSupervisor",
    "group_config",
    "group_hang_floor",
    "node_group",
    "node_group_refusal",
    "program",
]
