"""Two `trainguard run` processes on one machine acting as two nodes (c10d rendezvous over
127.0.0.1, --nnodes 1:2) train one DDP job together, and recover when one node's workers die."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.incidents import IncidentStore

WORKER = Path(__file__).parent / "workers" / "ddp_worker.py"
pytestmark = pytest.mark.slow


# A node counts as dead once keep_alive_interval * keep_alive_max_attempt pass without its heartbeat,
# and a node counted dead (even by its own agent) sends no heartbeat again in that round. Heartbeats
# stop while a node re-joins and resume an interval later, so with a 2 s window busy nodes dropped
# each other and settled on separate one-node rounds. A partial round waits last_call_timeout for
# the other node before it completes without it. Both leave slack for a loaded host.
RDZV_CONF = "join_timeout=60,last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=15"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_node(tmp_path: Path, name: str, port: int, steps: int, plan: str | None = None) -> subprocess.Popen:
    args = [
        sys.executable, "-m", "trainguard.cli", "run", "--nnodes", "1:2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "mn", "--max-restarts", "3",
        # node a hosts the rendezvous store, b only connects (it waits for a's store): with both on
        # 127.0.0.1 the first to bind the port would host it, and b leaving would take it away
        "--rdzv-conf", f"{RDZV_CONF},is_host={str(name == 'a').lower()}",
        "--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / name), "--no-tee", "--no-warm-standby",
        "--json", str(tmp_path / f"{name}.json"),
    ]  # fmt: skip
    if plan is not None:
        (tmp_path / "plan.toml").write_text(plan)
        args += ["--chaos", str(tmp_path / "plan.toml")]
    args += ["--", sys.executable, str(WORKER), "--checkpoint-dir", str(tmp_path / "ckpt"),
             "--steps", str(steps), "--step-sleep", "0.1"]  # fmt: skip
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def checkpoints(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "ckpt").glob("step-*"))


def heartbeats(tmp_path: Path, name: str) -> list[Path]:
    """A node's worker heartbeat files: they exist once its workers train."""
    return list(tmp_path.glob(f"{name}/*/heartbeat/rank*"))


def result(tmp_path: Path, name: str) -> dict:
    path = tmp_path / f"{name}.json"
    assert path.exists(), (tmp_path / f"{name}.log").read_text()[-3000:]
    return json.loads(path.read_text())


def test_killed_workers_on_one_node_rejoin_and_both_nodes_finish(tmp_path):
    port = free_port()
    plan = '[[fault]]\nkind = "kill"\nrank = 1\nstep = 15\n'
    a = start_node(tmp_path, "a", port, steps=30, plan=plan)
    b = start_node(tmp_path, "b", port, steps=30, plan=plan)
    try:
        # generous: each node starts its workers twice, and each start imports torch (slow under load)
        assert a.wait(timeout=180) == 0, (tmp_path / "a.log").read_text()[-3000:]
        assert b.wait(timeout=60) == 0, (tmp_path / "b.log").read_text()[-3000:]
    finally:
        for p in (a, b):
            p.kill()
    ra, rb = result(tmp_path, "a"), result(tmp_path, "b")
    assert ra["final_step"] == rb["final_step"] == 29
    incidents = IncidentStore(tmp_path / "tg.db").incidents(job="mn")
    killed = [i for i in incidents if any("killed by SIGKILL" in str(e) for e in i.evidence)]
    assert len(killed) == 1 and killed[0].rank == 1, incidents  # on the node that lost it
    assert all(i.action == "restart" for i in incidents)
    assert ra["attempts"] >= 2 and rb["attempts"] >= 2  # both re-formed the group
    assert ra["world_sizes"][-1] == rb["world_sizes"][-1] == 2


def test_when_a_node_leaves_the_survivor_continues_alone(tmp_path):
    port = free_port()
    a = start_node(tmp_path, "a", port, steps=40)
    b = start_node(tmp_path, "b", port, steps=40)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (checkpoints(tmp_path) and heartbeats(tmp_path, "b")):
            time.sleep(0.2)  # both nodes train: a checkpoint exists and b's worker reports steps
        assert checkpoints(tmp_path) and heartbeats(tmp_path, "b"), (tmp_path / "a.log").read_text()[-3000:]
        b.send_signal(signal.SIGTERM)  # node b is drained: its workers stop, it leaves the job
        assert b.wait(timeout=30) == 130
        assert a.wait(timeout=180) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        for p in (a, b):
            p.kill()
    ra = result(tmp_path, "a")
    assert ra["final_step"] == 39
    assert 2 in ra["world_sizes"] and ra["world_sizes"][-1] == 1  # continued on the survivor
    assert ra["recoveries"], ra


def _descendants(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out += [int(d.name), *_descendants(int(d.name))]
    return out


def test_a_node_killed_whole_is_a_node_failure_naming_it_not_the_network(tmp_path):
    port = free_port()
    a = start_node(tmp_path, "a", port, steps=60)
    b = start_node(tmp_path, "b", port, steps=60)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (checkpoints(tmp_path) and heartbeats(tmp_path, "b")):
            time.sleep(0.2)
        assert checkpoints(tmp_path) and heartbeats(tmp_path, "b"), (tmp_path / "a.log").read_text()[-3000:]
        for pid in [b.pid, *_descendants(b.pid)]:  # node b loses power: supervisor and workers at once
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert a.wait(timeout=240) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        for p in (a, b):
            p.kill()
    incidents = IncidentStore(tmp_path / "tg.db").incidents(job="mn")
    assert incidents, (tmp_path / "a.log").read_text()[-3000:]
    first = incidents[0]
    assert first.root_cause.value == "host" and first.category == "node_failure", first
    assert first.node is not None and first.node.endswith(f"_{b.pid}_0") and first.rank == 1, first
    assert any("left the rendezvous" in str(e) for e in first.evidence)
