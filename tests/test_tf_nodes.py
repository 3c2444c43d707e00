"""``trainguard run --framework tf --nnodes 2`` on real TensorFlow: two node supervisors on loopback
(one worker each) run one MultiWorkerMirroredStrategy cluster of tests/workers/tf_mwms.py (TF's
tutorial, no trainguard in it), its addresses exchanged on torch's c10d rendezvous."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_parts import require_module

WORKER = Path(__file__).with_name("workers") / "tf_mwms.py"
pytestmark = pytest.mark.slow
# as tests/test_multinode.py: keep-alive slack for a loaded host
RDZV_CONF = "join_timeout=300,keep_alive_interval=1,keep_alive_max_attempt=30"


def need_tf() -> None:
    require_module("tensorflow", install="make install (tensorflow-cpu 2.21)")
    require_module("tf_keras", install="make install (tf-keras 2.21: multi-worker model.fit)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_node(tmp_path: Path, rank: int, port: int, *worker_args: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "trainguard.cli", "run", "--framework", "tf", "--nnodes", "2",
        "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "tfn",
        "--rdzv-conf", RDZV_CONF, "--local-addr", "127.0.0.1", "--nproc-per-node", "1", "--no-tee",
        "--runs-dir", str(tmp_path / f"node{rank}"), "--db", str(tmp_path / "tg.db"),
        "--json", str(tmp_path / f"node{rank}.json"), "--", sys.executable, str(WORKER), *worker_args,
    ]  # fmt: skip
    log = open(tmp_path / f"node{rank}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def finish(nodes: list[subprocess.Popen[bytes]], tmp_path: Path, timeout: float) -> list[dict]:
    """Each node's result once both exit; a node past ``timeout`` is killed, never left behind."""
    try:
        deadline = time.monotonic() + timeout
        for node in nodes:
            node.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    results = []
    for r, node in enumerate(nodes):
        log = (tmp_path / f"node{r}.log").read_text(errors="replace")[-3000:]
        assert node.returncode == 0, log
        results.append(json.loads((tmp_path / f"node{r}.json").read_text()))
    return results


def lines(tmp_path: Path, node: int, attempt: int) -> str:
    """Node ``node``'s worker output in ``attempt``."""
    files = list((tmp_path / f"node{node}").glob(f"*/logs/*/attempt{attempt}/rank0.stdout"))
    return files[0].read_text() if files else ""


def tf_config(pid: int) -> dict | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    raw = next((v[len(b"TF_CONFIG=") :] for v in env if v.startswith(b"TF_CONFIG=")), None)
    return json.loads(raw) if raw else None


def worker_pid(tmp_path: Path, node: int) -> int | None:
    """The pid of node ``node``'s TF worker (from /proc: its run directory)."""
    mark = f"TRAINGUARD_RUN_DIR={(tmp_path / f'node{node}').resolve()}/".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(v.startswith(mark) for v in env) and any(v.startswith(b"TF_CONFIG=") for v in env):
                return int(entry.name)
    return None


def test_two_nodes_run_one_cluster_clean(tmp_path):
    need_tf()
    port = free_port()
    nodes = [start_node(tmp_path, r, port, "--epochs", "2") for r in (0, 1)]
    configs: dict[int, dict] = {}
    try:
        deadline = time.monotonic() + 300
        while len(configs) < 2 and all(n.poll() is None for n in nodes) and time.monotonic() < deadline:
            for r in (0, 1):
                pid = worker_pid(tmp_path, r)
                config = tf_config(pid) if pid is not None else None
                if config is not None:
                    configs[r] = config
            time.sleep(0.2)
    finally:
        results = finish(nodes, tmp_path, 600)
    # one cluster, the same on both nodes, each node's worker the task of its --node-rank
    assert configs[0]["cluster"] == configs[1]["cluster"] and len(configs[0]["cluster"]["worker"]) == 2
    assert [configs[r]["task"]["index"] for r in (0, 1)] == [0, 1]
    for r, result in enumerate(results):
        assert (result["exit_code"], result["attempts"], result["incidents"]) == (0, 1, [])
        assert result["world_sizes"] == [2]
        assert "done step 40" in lines(tmp_path, r, 0)


def test_a_worker_killed_on_one_node_restarts_both_nodes_from_backup_and_restore(tmp_path):
    need_tf()
    port = free_port()
    args = ("--epochs", "4", "--step-s", "0.1", "--backup-dir", str(tmp_path / "backup"), "--save-freq", "10")
    nodes = [start_node(tmp_path, r, port, *args) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 400
        while "Epoch 2/" not in lines(tmp_path, 0, 0) and all(n.poll() is None for n in nodes):
            assert time.monotonic() < deadline, "the job never reached its second epoch"
            time.sleep(0.2)
        pid = worker_pid(tmp_path, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # node 1's worker (rank 1) dies past the backup of step 20
    finally:
        results = finish(nodes, tmp_path, 600)
    assert [r["attempts"] for r in results] == [2, 2]  # both nodes restarted, together
    incidents = [i for r in results for i in r["incidents"]]
    killed = [i for i in incidents if "killed by SIGKILL" in i["summary"]]
    assert [(i["rank"], i["action"]) for i in killed] == [(1, "restart")], incidents
    # node 0's worker was never at fault: nothing blames rank 0
    assert all(i["rank"] != 0 for i in incidents), incidents
    for r in (0, 1):
        again = lines(tmp_path, r, 1)
        started = int(again.split("start step ")[1].split()[0])
        assert started >= 20 and started % 10 == 0, again[-500:]  # BackupAndRestore's last save, not 0
        assert "done step 80" in again
