"""``--framework tf --nnodes N`` without TensorFlow: the cluster each node builds from the exchanged
addresses, the exchange itself on torch's c10d rendezvous (two nodes in one process), what a
survivor's TensorFlow error says, and the options refused."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from trainguard.cli import build_parser
from trainguard.cli.run import config_from_args
from trainguard.errors import ConfigError
from trainguard.supervisor import LaunchConfig, RecordConfig, SupervisorConfig, WatchConfig
from trainguard.supervisor.exits import Exited, exit_trouble
from trainguard.supervisor.fingerprint import fingerprint, last_error
from trainguard.supervisor.launch import LaunchJob
from trainguard.supervisor.logs import default_classifier
from trainguard.supervisor.peers import peer_node_trouble
from trainguard.supervisor.tf import TfWorkers
from trainguard.supervisor.tf_cluster import NodeAddrs, TfRendezvous, clashes, cluster_of

SURVIVOR = Path(__file__).with_name("data") / "tf_survivor_stderr.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_node_builds_the_same_cluster_in_node_rank_order():
    # as each node reads them back: round ranks in arrival order, not --node-rank order
    nodes = [
        NodeAddrs("c_3_0", 2, 0, "10.0.0.3", (7300, 7301)),
        NodeAddrs("a_1_0", 0, 1, "10.0.0.1", (7100, 7101)),
        NodeAddrs("b_2_0", 1, 2, "10.0.0.2", (7200,)),  # one GPU excluded: one worker fewer
    ]
    workers, first = cluster_of(nodes)
    assert workers == ["10.0.0.1:7100", "10.0.0.1:7101", "10.0.0.2:7200", "10.0.0.3:7300", "10.0.0.3:7301"]
    assert first == {"a_1_0": 0, "b_2_0": 2, "c_3_0": 3}
    assert cluster_of(list(reversed(nodes))) == (workers, first)  # the same on every node
    same_rank = [NodeAddrs("y", 0, 1, "h2", (2,)), NodeAddrs("x", 0, 0, "h1", (1,))]  # no --node-rank
    assert cluster_of(same_rank)[0] == ["h1:1", "h2:2"]  # the rendezvous' order decides
    node = nodes[0]
    assert NodeAddrs.from_bytes(node.to_bytes()) == node


def test_a_port_two_nodes_of_one_host_picked_is_picked_again_by_the_later_node():
    a, b = NodeAddrs("a", 0, 0, "h", (5000, 5001)), NodeAddrs("b", 1, 1, "h", (5001,))
    assert clashes([b, a]) == {"b"}
    assert clashes([a, NodeAddrs("b", 1, 1, "other", (5001,))]) == set()  # another host: no clash


def exchange(nodes: list[TfRendezvous], ports: dict[str, list[int]]) -> list[list[NodeAddrs]]:
    """Every node joins the next round at once; what each got."""
    got: list[list[NodeAddrs]] = [[] for _ in nodes]
    errors: list[BaseException] = []

    def join(i: int) -> None:
        try:
            got[i] = nodes[i].join(lambda n, avoid: ports[nodes[i].name][:n], 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and all(got), errors
    return got


def test_two_nodes_exchange_their_addresses_and_a_rejoin_is_seen_by_the_other():
    endpoint = f"127.0.0.1:{free_port()}"
    conf = "join_timeout=60,keep_alive_interval=1,keep_alive_max_attempt=30"
    # node 1 is created first, as any node may start first: it waits for node 0's store
    n1: list[TfRendezvous] = []
    t = threading.Thread(target=lambda: n1.append(TfRendezvous(endpoint, "j", "2", conf, 1, "127.0.0.2", 2)))
    t.start()
    n0 = TfRendezvous(endpoint, "j", "2", conf, 0, "127.0.0.1", 1)
    t.join(60)
    nodes = [n1[0], n0]
    try:
        ports = {n0.name: [6000], n1[0].name: [6100]}
        first = exchange(nodes, ports)
        assert first[0] == first[1] and cluster_of(first[0])[0] == ["127.0.0.1:6000", "127.0.0.2:6100"]
        assert n0.nodes_waiting() == 0
        # node 1 lost a worker: it joins the next round; node 0 sees it wait, and joins too
        ports = {n0.name: [6001], n1[0].name: [6101]}
        again: list[list[NodeAddrs]] = []
        t = threading.Thread(target=lambda: again.append(n1[0].join(lambda n, a: ports[n1[0].name], 1)))
        t.start()
        deadline = time.monotonic() + 60
        while n0.nodes_waiting() == 0:
            assert time.monotonic() < deadline, "node 0 never saw node 1 waiting"
            time.sleep(0.1)
        mine = n0.join(lambda n, a: ports[n0.name], 1)
        t.join(60)
        assert again == [mine] and cluster_of(mine)[0] == ["127.0.0.1:6001", "127.0.0.2:6101"]
    finally:
        closers = [threading.Thread(target=n.close, args=(True,)) for n in nodes]
        for c in closers:
            c.start()
        for c in closers:
            c.join(120)


def test_each_node_starts_its_workers_as_its_tasks_of_the_whole_cluster(tmp_path):
    seen = tmp_path / "seen"
    seen.mkdir()
    dump = (
        "import json, os, sys; keys = ('TF_CONFIG', 'RANK', 'WORLD_SIZE', 'GROUP_RANK');"
        "json.dump({k: os.environ[k] for k in keys}, open(sys.argv[1] + '/' + os.environ['LOCAL_RANK'], 'w'))"
    )
    config = SupervisorConfig(
        LaunchConfig(cmd=(sys.executable, "-c", dump, str(seen)), nproc_per_node=2, launcher="tf"),
        RecordConfig(job_id="tf", runs_root=tmp_path / "runs"),
        WatchConfig(tee=False),
    )
    workers = TfWorkers(LaunchJob(config, "tf", lambda lr, env: None, lambda: tmp_path / "logs"))

    class Joined:  # node 1 of a two-node round, as TfRendezvous.join leaves it
        def __init__(self) -> None:
            self.name, self.rank = "b_2_0", 0
            self.nodes = [NodeAddrs("a_1_0", 0, 1, "10.0.0.1", (7100, 7101))]

        def join(self, pick, n):
            self.nodes = [*self.nodes, NodeAddrs(self.name, 1, 0, "10.0.0.2", tuple(pick(n, set())))]
            return sorted(self.nodes, key=lambda x: x.node_rank)

    workers.rdzv = Joined()  # type: ignore[assignment]
    workers.start(2)
    deadline = time.monotonic() + 60
    while any(c is None for c in workers.exit_codes().values()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    seen_env = [json.loads((seen / str(lr)).read_text()) for lr in (0, 1)]
    configs = [json.loads(e["TF_CONFIG"]) for e in seen_env]
    # torchrun's variables for the whole cluster: its place by --node-rank, not the round's rank
    assert [(e["RANK"], e["WORLD_SIZE"], e["GROUP_RANK"]) for e in seen_env] == [
        ("2", "4", "1"),
        ("3", "4", "1"),
    ]
    cluster = configs[0]["cluster"]["worker"]
    assert cluster[:2] == ["10.0.0.1:7100", "10.0.0.1:7101"] and len(cluster) == 4
    assert [c["task"]["index"] for c in configs] == [2, 3]  # node_rank * K + local rank
    assert all(c["cluster"]["worker"] == cluster for c in configs)
    assert workers.ranks() == {0: 2, 1: 3} and workers.world_size() == 4
    assert workers.peers() == ("b_2_0", {"a_1_0": (0, 1)})


def test_a_survivors_tensorflow_error_names_the_lost_peer_not_its_own_rank():
    # what worker 0 printed when node 1's worker was SIGKILLed (tests/test_tf_nodes.py, real TF 2.21)
    text = SURVIVOR.read_text()
    classify = default_classifier()
    events = [e for ln in text.splitlines() if (e := classify(ln)) is not None]
    last = last_error(None, text)
    assert last == "tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:"
    assert fingerprint(1, None, text) is None  # a peer's loss is no crash loop of the script's
    trouble = exit_trouble(101.0, [Exited(0, 0, 1, 100.5)], [], events, [], {0: None}, {0: None}, classify)
    judged = peer_node_trouble(trouble, "a_1_0", [0], {"b_2_0": (1,)}, [], events, {0: last})
    assert judged is not None and judged.rank is None and judged.ranks == (1,)
    assert judged.extra["suspect_nodes"] == ["b_2_0"]


def parse(*argv: str):
    return config_from_args(
        build_parser("run").parse_args(["run", "--framework", "tf", *argv, "--", "python", "t.py"])
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--nnodes", "2"), "--rdzv-endpoint"),
        (("--nnodes", "1:2", "--rdzv-endpoint", "h:1"), "fixed number of nodes"),
        (("--nnodes", "2", "--rdzv-endpoint", "h:1", "--node-rank", "2"), "give 0 to 1"),
        (("--nnodes", "2", "--rdzv-endpoint", "h:1", "--rdzv-backend", "etcd"), "c10d"),
        (("--node-rank", "1"), "with --nnodes N"),
        (("--nnodes", "2", "--rdzv-endpoint", "h:1", "--replica-groups", "2"), "--replica-groups"),
        (("--nnodes", "2", "--rdzv-endpoint", "h:1", "--spare"), "--spare"),
    ],
)
def test_what_a_tensorflow_cluster_cannot_do_is_refused_with_the_fix(argv, says):
    with pytest.raises(ConfigError, match=says):
        parse(*argv)


def test_a_multi_node_tf_job_survives_to_argv():
    config = parse("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:29400", "--rdzv-id", "j",
                   "--local-addr", "10.0.0.2")  # fmt: skip
    launch = config.launch
    assert (launch.nnodes, launch.rdzv_endpoint, launch.rdzv_id) == ("2", "h:29400", "j")
    assert launch.extra_torchrun_args == ("--node-rank", "1", "--local-addr", "10.0.0.2")
    again = config_from_args(build_parser("run").parse_args(["run", *config.to_argv()]))
    assert again.launch == launch
