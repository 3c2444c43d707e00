"""A node's share of a replica group that spans nodes (`supervisor.replicas.node`): the options
that cannot work are refused with the fix, and a node's config and environment make it part of
its group (end to end on loopback: tests/test_replicas_nodes.py)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")  # torchrun's options are read by torchrun's parser

from trainguard.cli import build_parser
from trainguard.cli.run import config_from_args
from trainguard.errors import ConfigError
from trainguard.supervisor.config import SupervisorConfig
from trainguard.supervisor.replicas import ReplicaConfig
from trainguard.supervisor.replicas.node import node_group
from trainguard.supervisor.replicas.start import SITE_DIR

COMMAND = ["--", "python", "train.py"]
NODE = ["--replica-groups", "2", "--replica-group-id", "1", "--lighthouse", "http://lh:29510"]
RDZV = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.7:29400", "--rdzv-id", "mnr"]


def config_of(argv: list[str]) -> SupervisorConfig:
    return config_from_args(build_parser("run").parse_args(["run", *argv, *COMMAND]))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # one-node groups, --nnodes ignored (what --replica-groups did before groups spanned nodes)
        (["--replica-groups", "2", "--nnodes", "2", *RDZV], r"for groups that span nodes, run on each node"),
        (["--replica-group-id", "1", "--lighthouse", "http://lh:1"], r"give the job's number of groups too"),
        (["--replica-groups", "2", "--replica-group-id", "2", "--lighthouse", "http://lh:1"], r"from 0 to 1"),
        (["--replica-groups", "2", "--replica-group-id", "0", "--nnodes", "2", *RDZV], r"torchft_lighthouse"),
        (
            ["--replica-groups", "2", "--lighthouse", "http://lh:1", "--standalone"],
            r"give --replica-group-id",
        ),
        (["--replica-groups", "2", "--replica-group-id", "0", "--lighthouse", "lh:1"], r"e.g. http://lh:1"),
        ([*NODE, "--nnodes", "1:2", *RDZV], r"keeps its size .* --nnodes 2"),
        ([*NODE, "--nnodes", "2", "--master-addr", "10.0.0.7"], r"rendezvous through c10d"),
        ([*NODE, "--launcher", "local", "--nproc-per-node", "2"], r"--launcher torch"),
        ([*NODE, "--spare", "--nnodes", "1", *RDZV], r"--spare for group 1 .* --nnodes M > 1"),
    ],
)
def test_what_cannot_work_is_refused_with_the_fix(argv, says):
    with pytest.raises(ConfigError, match=says):
        config_of(argv)


def test_a_nodes_config_and_environment_make_it_part_of_its_group(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    config = config_of([*NODE, "--nnodes", "2", "--nproc-per-node", "2", *RDZV, "--hang-timeout-floor", "1"])
    replicas = ReplicaConfig(groups=2)
    node, env = node_group(config, replicas)
    assert node.launch.rdzv_id == "mnr.g1" and node.record.job_id == "mnr.g1"  # the group's own
    assert (node.launch.nnodes, node.launch.rdzv_endpoint) == ("2", "10.0.0.7:29400")
    assert node.watch.hang_timeout_floor > replicas.timeout_s  # outlasts a wait on a peer group
    assert node.recovery.min_nproc == 2  # a group keeps its size
    assert (node.replica_groups, node.replica_group_id, node.lighthouse) == (0, None, "")
    assert (env["REPLICA_GROUP_ID"], env["NUM_REPLICA_GROUPS"]) == ("1", "2")
    assert env["TORCHFT_LIGHTHOUSE"] == "http://lh:29510" and env["TRAINGUARD_JOB_ID"] == "mnr"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == SITE_DIR  # torchft's DDP gets trainguard's hook


def test_a_group_of_one_node_on_a_machine_of_its_own_runs_standalone():
    node, env = node_group(config_of([*NODE, "--standalone", "--job-id", "j"]), ReplicaConfig(groups=2))
    assert node.launch.standalone and node.record.job_id == "j.g1" and env["REPLICA_GROUP_ID"] == "1"


def test_a_spare_for_a_group_joins_that_groups_rendezvous():
    config = config_of([*NODE, "--spare", "--nnodes", "2", *RDZV])
    node, env = node_group(config, ReplicaConfig(groups=2))
    assert node.launch.spare and node.launch.rdzv_id == "mnr.g1" and node.record.job_id == "mnr.g1"
    assert env["REPLICA_GROUP_ID"] == "1"
    with pytest.raises(ConfigError, match=r"--spare: .* --replica-group-id g"):  # groups on one node
        config_of(["--replica-groups", "2", "--spare", "--nnodes", "2", *RDZV])
