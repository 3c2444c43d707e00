"""Replica groups that span nodes: 2 groups x 2 nodes on one host, four ``trainguard run
--replica-groups 2 --replica-group-id G --nnodes 2`` node supervisors on loopback (each group's
ranks rendezvous through c10d, the groups find each other through torchft's real Lighthouse),
one rank per node, trainguard's torchft DDP over gloo (tests/workers/dp_equal.py).

Fault-free, the four ranks follow a plain DDP job of 4 ranks under torchrun step by step. With
one node of group 1 SIGKILLed (its whole process group: supervisor, agent, worker), group 0 keeps
committing; once the scheduler starts that node's ``trainguard run`` again, group 1 re-forms,
heals from group 0 and trains with it, and all four ranks hold the same weights. With a hot
spare node for group 1 (its nodes' command plus ``--spare``), group 1 re-forms with the spare in
the lost node's place, and the lost node is never started again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from real_parts import require_module

require_module("torchft", install="pip install 'trainguard[ft]' (make install does)")
torch = pytest.importorskip("torch")

from test_replicas_dp import STEPS, WORKER, follows_plain_ddp, plain_ddp, same_weights, shards  # noqa: E402,F401
from trainguard.incidents import IncidentStore  # noqa: E402
from trainguard.supervisor.replicas import Lighthouse, LighthouseConfig  # noqa: E402

pytestmark = pytest.mark.slow

# As tests/test_multinode.py: slack for a loaded host. join_timeout: a group's surviving node
# waits this long in the rendezvous for its lost peer node to be started again.
RDZV_CONF = "join_timeout=300,last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=15"
WAIT_S = 300.0  # for any one thing the test waits on (never asserted as a speed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """The Lighthouse (torchft's, started once for the job) and the node supervisors."""

    def __init__(self, tmp: Path, worker_args: list[str]) -> None:
        self.tmp, self.worker_args = tmp, worker_args
        self.out = tmp / "out"
        self.out.mkdir()
        self.lighthouse = Lighthouse(LighthouseConfig(), tmp / "lighthouse.log")
        self.lighthouse.start()
        self.ports = {g: free_port() for g in (0, 1)}  # each group's own rendezvous
        self.nodes: dict[tuple[int, str], subprocess.Popen[bytes]] = {}
        self.starts = 0

    def start(self, group: int, node: str, spare: bool = False) -> subprocess.Popen[bytes]:
        """Node ``node`` (a: hosts the group's rendezvous store; b: joins it) of group ``group``;
        ``spare``: the same command plus ``--spare``."""
        self.starts += 1
        host = str(node == "a").lower()
        args = [
            sys.executable, "-m", "trainguard.cli", "run", "--replica-groups", "2",
            "--replica-group-id", str(group), "--lighthouse", self.lighthouse.address,
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{self.ports[group]}", "--rdzv-id", "mnr",
            "--rdzv-conf", f"{RDZV_CONF},is_host={host}", "--max-restarts", "3", "--backoff-base", "0.1",
            "--db", str(self.tmp / "tg.db"), "--runs-dir", str(self.tmp / f"g{group}{node}"),
            "--no-tee", "--no-warm-standby", "--json", str(self.tmp / f"g{group}{node}.json"),
            *(["--spare"] if spare else []), "--",
            sys.executable, str(WORKER), "--mode", "ft", "--out", str(self.out), *self.worker_args,
        ]  # fmt: skip
        log = open(self.tmp / f"g{group}{node}.{self.starts}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True
        )
        self.nodes[group, node] = proc
        return proc

    def logs_of(self, group: int, node: str) -> str:
        """The node's last start's output."""
        *_, last = sorted(self.tmp.glob(f"g{group}{node}.*.log"), key=lambda p: int(p.suffixes[0][1:]))
        return last.read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(self.tmp.glob("g*.log"))
        )

    def result(self, group: int, node: str) -> dict[str, Any]:
        return cast(dict[str, Any], json.loads((self.tmp / f"g{group}{node}.json").read_text()))

    def wait_all(self) -> None:
        for (group, node), proc in self.nodes.items():
            assert proc.wait(timeout=WAIT_S) == 0, f"group {group} node {node}\n{self.logs()}"

    def stop(self) -> None:
        for proc in self.nodes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        self.lighthouse.stop()

    def progress(self, shard: int) -> int:
        """The shard's last committed step (-1 before its first)."""
        try:
            return int((self.out / f"progress{shard}").read_text())
        except (OSError, ValueError):
            return -1

    def wait_for(self, what: str, ok: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ok():
            assert time.monotonic() < deadline, f"never: {what}\n{self.logs()}"
            for (group, node), proc in self.nodes.items():
                assert proc.poll() is None, (
                    f"group {group} node {node} exited ({proc.returncode})\n{self.logs()}"
                )
            time.sleep(0.2)


@pytest.fixture
def job(tmp_path):
    jobs: list[Job] = []

    def make(worker_args: list[str]) -> Job:
        jobs.append(Job(tmp_path, worker_args))
        return jobs[-1]

    yield make
    for j in jobs:
        j.stop()


def stop_and_heal(j: Job, stop_file: Path, at_loss: int) -> list[dict]:
    """Stop the ranks a few steps on and read their records (group 0's two, then group 1's), once
    group 1's ranks are known to have started again after the loss and healed from group 0."""
    # The ranks stop once their next step is this one (a group already past it when it reads
    # the file stops there: the groups then end a step apart, and the last common step counts).
    last = max(j.progress(s) for s in range(4)) + 3
    stop_file.with_name("stop.tmp").write_text(str(last))
    os.replace(stop_file.with_name("stop.tmp"), stop_file)
    j.wait_all()
    ft = shards(j.out)
    g1 = ft[2:]
    assert any(True in r["healed"] for r in g1), "no rank of group 1 healed from group 0"
    assert all(r["steps"][0] > at_loss for r in g1), "group 1's ranks did not start again"
    return ft


def last_common_step(ft: list[dict]) -> int:
    """The last step every rank committed, once their weights there are checked equal."""
    final = max(set.intersection(*(set(r["steps"]) for r in ft)))
    weights = [r["weights"][r["steps"].index(final)] for r in ft]
    for w in weights[1:]:
        for name, tensor in weights[0].items():
            assert torch.equal(w[name], tensor), f"ranks differ in {name} at step {final}"
    return final


def test_two_groups_of_two_nodes_follow_a_plain_ddp_job_of_four(job, plain_ddp):  # noqa: F811
    j = job(["--steps", str(STEPS)])
    for group in (0, 1):
        for node in ("a", "b"):
            j.start(group, node)
    j.wait_all()
    follows_plain_ddp(shards(j.out), plain_ddp)


@pytest.mark.parametrize("lost", ["b", "a"])
def test_a_lost_node_of_one_group_rejoins_and_heals_while_the_other_group_commits(job, tmp_path, lost):
    """Node b joins group 1's rendezvous; node a hosts it: its loss takes the rendezvous store,
    and with it node b's `trainguard run` (as any multi-node torchrun job's other nodes), so the
    scheduler starts both again."""
    stop_file = tmp_path / "stop"
    j = job(["--min-replicas", "1", "--stop-file", str(stop_file), "--step-sleep", "0.1"])
    for group in (0, 1):
        for node in ("a", "b"):
            j.start(group, node)
    j.wait_for("both groups train", lambda: min(j.progress(s) for s in range(4)) >= 3)

    gone = j.nodes.pop((1, lost))
    os.killpg(gone.pid, signal.SIGKILL)  # the node: its supervisor, agent and worker
    gone.wait(30)
    at_loss = j.progress(0)
    restart = [lost]
    if lost == "a":
        peer = j.nodes.pop((1, "b"))
        assert peer.wait(timeout=WAIT_S) != 0, "node b ran on without its group's rendezvous store"
        restart = ["a", "b"]
    j.wait_for("group 0 commits without group 1", lambda: j.progress(0) >= at_loss + 5)

    for node in restart:  # the scheduler starts the lost node again (and a failed one)
        j.start(1, node)
    at_restart = j.progress(0)
    j.wait_for(
        "group 1 heals and trains with group 0",
        lambda: min(j.progress(2), j.progress(3)) > at_restart,
    )
    ft = stop_and_heal(j, stop_file, at_loss)
    g0 = ft[:2]
    during = [s for s in g0[0]["steps"] if at_loss < s <= at_restart]
    assert len(during) >= 5, "group 0 did not commit while group 1 was down"
    assert last_common_step(ft) > at_restart, "group 1 never committed a step with group 0 after it healed"
    # group 1's incident names the node it lost (its agent's node id holds the supervisor's pid)
    incidents = IncidentStore(tmp_path / "tg.db").incidents(job="mnr.g1")
    named = [i for i in incidents if f"_{gone.pid}_0" in f"{i.node} {i.summary}"]
    assert named and all(i.action == "restart" for i in named), incidents
    for r in g0:  # group 0 kept its own state through the loss (its first step may heal: it
        # can start after group 1 committed alone)
        assert not any(h for s, h in zip(r["steps"], r["healed"], strict=True) if s > at_loss)


def test_a_spare_node_takes_the_lost_nodes_place_and_its_group_heals_while_the_other_commits(job, tmp_path):
    """Group 1 has a hot spare s (its nodes' command plus ``--spare``). Node b of group 1 is
    SIGKILLed and never started again: group 1 re-forms with a and s, heals from group 0 and
    trains with it, while group 0 goes on without a restart."""
    stop_file = tmp_path / "stop"
    j = job(["--min-replicas", "1", "--stop-file", str(stop_file), "--step-sleep", "0.1"])
    for group in (0, 1):
        for node in ("a", "b"):
            j.start(group, node)
    spare = j.start(1, "s", spare=True)
    spare_log = tmp_path / f"g1s.{j.starts}.log"
    j.wait_for("both groups train", lambda: min(j.progress(s) for s in range(4)) >= 3)
    j.wait_for("the spare's supervisor is up", lambda: "trainguard run:" in spare_log.read_text())
    assert not list((tmp_path / "g1s").glob("*/logs/*/attempt*/rank*")), "the spare ran a rank"

    gone = j.nodes.pop((1, "b"))
    os.killpg(gone.pid, signal.SIGKILL)  # the node: its supervisor, agent and worker
    gone.wait(30)
    at_loss = max(j.progress(s) for s in range(4))
    j.wait_for(  # node b is not started again: the spare takes its place
        "group 1 heals and trains with group 0", lambda: min(j.progress(2), j.progress(3)) > at_loss + 2
    )
    ft = stop_and_heal(j, stop_file, at_loss)
    g0 = ft[:2]
    for r in g0:  # one run each, every step from before the loss committed in order, its own
        # state throughout (its first step may heal: it can start after group 1 committed alone)
        first = r["steps"][0]
        assert first <= at_loss and r["steps"] == list(range(first, r["steps"][-1] + 1)), r["steps"]
        assert not any(h for s, h in zip(r["steps"], r["healed"], strict=True) if s > at_loss)
    assert last_common_step(ft) > at_loss, "group 1 never committed a step with group 0 after it healed"

    lost = f"_{gone.pid}_0"  # torch's name for node b holds its supervisor's pid
    ra, rs = j.result(1, "a"), j.result(1, "s")
    assert ra["world_sizes"] == [2, 2] and rs["world_sizes"] == [2], (ra, rs)  # full size, never shrunk
    [admitted] = [n for n in rs["nodes"] if n["kind"] == "spare_admitted"]
    [replaced] = [n for n in ra["nodes"] if n["kind"] == "replaced"]
    assert replaced["lost"].endswith(lost) and replaced["node"] == admitted["node"], ra["nodes"]
    assert ra["attempts"] == 2 and len(ra["recoveries"]) == 1, ra  # a restart like any other
    final_a = j.logs_of(1, "a").splitlines()[-1]
    assert f"took the place of node {replaced['lost']}" in final_a, final_a
    assert "spare node" in spare_log.read_text().splitlines()[-1]
    assert spare.returncode == 0
    incidents = IncidentStore(tmp_path / "tg.db").incidents(job="mnr.g1")
    named = [i for i in incidents if lost in f"{i.node} {i.summary}"]
    assert named and all(i.action == "restart" for i in named), incidents
