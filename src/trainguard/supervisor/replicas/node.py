"""One node's share of a replica group that spans nodes (docs/no-restart.md).

On each of group ``g``'s M nodes (M x K ranks in the group), as a multi-node torchrun job::

    trainguard run --replica-groups G --replica-group-id g --lighthouse http://LH:29510 \\
        --nnodes M --nproc-per-node K --rdzv-backend c10d --rdzv-endpoint NODE_OF_GROUP_g:29400 \\
        --rdzv-id job -- python train.py

Each node runs the job loop (`supervisor.supervisor`) with what makes it part of group ``g``: the
replica group's and torchft's environment (`start.group_env`, the same a one-node group gets),
the group's hang floor and job id (``<job>.g<g>``), and a rendezvous of the group's own
(``<rdzv-id>.g<g>``). The group's ranks rendezvous through c10d, and each start's workers get a
fresh TCPStore hosted by the group's node 0 agent (`elastic.GuardedAgent`): torchft's Manager
runs on the group's rank 0 and its other ranks find it through that store. The groups find
each other through torchft's Lighthouse, which runs once per job where the user starts it
(``torchft_lighthouse``, as torchft's own multi-node runs do): this module starts no Lighthouse.

A node lost from a group takes the group's ranks down (their collectives fail); the group's
other nodes restart their workers into a rendezvous that waits for M nodes, so the group
re-forms once the lost node's ``trainguard run`` is started again (by the scheduler), and heals
from a live group through torchft while the other groups keep committing.

A node started with the group's command plus ``--spare`` is a hot spare for group ``g``: it is
restart mode's spare (`elastic.GuardedAgent`) in the group's rendezvous, admitted in a lost node's
place once the group's survivors re-join.

`node_group` refuses (`ConfigError`) what cannot work: a group whose size could change (torchft
pairs group rank r with group rank r of every other group, so every group keeps M x K ranks),
a rendezvous other than c10d (a static one shares one store across starts, and torchft's
Manager would read a dead start's address from it), a launcher other than torch's, a spare for
a group of one node.
"""

from __future__ import annotations

from dataclasses import replace

from trainguard.errors import ConfigError
from trainguard.supervisor.config import SupervisorConfig
from trainguard.supervisor.replicas.start import ReplicaConfig, group_env, group_hang_floor

__all__ = ["node_group", "node_group_refusal", "spans_nodes"]


def spans_nodes(nnodes: str) -> bool:
    """True when ``--nnodes`` (N or MIN:MAX) allows more than one node (torchrun's parser
    reads the value; one it cannot read is its error, not this one)."""
    try:
        return max(int(x) for x in nnodes.split(":")) > 1
    except ValueError:
        return False


def node_group_refusal(config: SupervisorConfig) -> str | None:
    """Why this ``trainguard run`` cannot run its node's share of a replica group; None when it
    can (or when it is not one)."""
    groups, launch = config.replica_groups, config.launch
    group, lighthouse = config.replica_group_id, config.lighthouse
    if group is None:
        if lighthouse:
            return (
                "--lighthouse names the job's torchft Lighthouse for a group that spans nodes: give "
                "--replica-group-id too (on one node, --replica-groups N starts its own Lighthouse)"
            )
        if groups and not launch.standalone and spans_nodes(launch.nnodes):
            return (
                f"--replica-groups {groups} with --nnodes {launch.nnodes}: on one node, --replica-groups "
                "runs every group there; for groups that span nodes, run on each node of group g: "
                f"--replica-groups {groups} --replica-group-id g --lighthouse URL --nnodes M "
                "--rdzv-endpoint HOST:PORT (docs/no-restart.md)"
            )
        return None
    if groups < 1:
        return f"--replica-group-id {group}: give the job's number of groups too (--replica-groups N)"
    if not 0 <= group < groups:
        return f"--replica-group-id {group}: give a group from 0 to {groups - 1} (--replica-groups {groups})"
    if not lighthouse:
        return (
            f"--replica-group-id {group}: the groups find each other through torchft's Lighthouse: start "
            "one for the job (torchft_lighthouse --min_replicas 1 --bind [::]:29510) and give its "
            "address on every node: --lighthouse http://HOST:29510"
        )
    if not lighthouse.startswith(("http://", "https://")):
        return (
            f"--lighthouse {lighthouse}: give the Lighthouse's URL, e.g. http://{lighthouse or 'HOST:29510'}"
        )
    if launch.launcher != "torch":
        return f"--replica-group-id with --launcher {launch.launcher}: a group's nodes rendezvous through torch's agent (--launcher torch)"
    if launch.spare and not spans_nodes(launch.nnodes):
        return (
            f"--spare for group {group} with --nnodes {launch.nnodes}: a spare waits in the group's c10d "
            "rendezvous, whose store lives on the group's node 0; a group of one node loses that store "
            "with its node, so there is no round to admit the spare to: give the group --nnodes M > 1"
        )
    if launch.standalone:
        return None  # a group of one node, on a machine of its own
    low, _, high = launch.nnodes.partition(":")
    if high and low != high:
        return (
            f"--replica-group-id with --nnodes {launch.nnodes}: a replica group keeps its size (torchft pairs "
            "group rank r with group rank r of every other group); give one number of nodes, e.g. "
            f"--nnodes {high}"
        )
    if spans_nodes(launch.nnodes) and launch.rdzv_backend != "c10d":
        return (
            f"--replica-group-id with --rdzv-backend {launch.rdzv_backend}: a group's nodes rendezvous "
            "through c10d (--rdzv-backend c10d --rdzv-endpoint HOST:PORT); a static rendezvous keeps one "
            "store across restarts, where torchft's Manager would read a dead start's address"
        )
    if spans_nodes(launch.nnodes) and not launch.rdzv_endpoint:
        return "--replica-group-id with --nnodes > 1: give the group's rendezvous: --rdzv-endpoint HOST:PORT"
    return None


def node_group(config: SupervisorConfig, replicas: ReplicaConfig) -> tuple[SupervisorConfig, dict[str, str]]:
    """This node's config (a plain job's: no replica options left) and environment as its share
    of replica group ``config.replica_group_id`` (raises `ConfigError` where `node_group_refusal`
    says why not)."""
    refusal = node_group_refusal(config)
    if refusal is not None:
        raise ConfigError(refusal)
    group, lighthouse = config.replica_group_id, config.lighthouse
    if group is None:
        raise ConfigError("node_group: not a node of a replica group (no --replica-group-id)")
    job = config.resolved_job_id()
    config = replace(config, record=replace(config.record, job_id=job))  # resolved once: the env's too
    launch = config.launch
    rdzv_id = f"{launch.rdzv_id or 'none'}.g{group}"  # every node of the group gives the same id
    cfg = replace(
        config,
        launch=replace(launch, rdzv_id=rdzv_id),
        record=replace(config.record, job_id=f"{job}.g{group}"),
        watch=replace(
            config.watch, hang_timeout_floor=group_hang_floor(config.watch.hang_timeout_floor, replicas)
        ),
        recovery=replace(config.recovery, min_nproc=launch.nproc_per_node),
        replica_groups=0,
        replica_group_id=None,
        lighthouse="",
    )
    return cfg, group_env(config, replicas, group, lighthouse)
