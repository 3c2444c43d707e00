"""A hot spare node takes a lost node's place; the job comes back at full size (#35).

Three `trainguard run --nnodes 2:2` on one host act as nodes a, b and a spare s (`--spare`,
started with a and b): s waits in torch's c10d redundancy list while a and b train
tests/workers/plain_ddp.py (a script that never imports trainguard, its own snapshot). Node b's
supervisor and workers are SIGKILLed at once; a's attempt ends, the next round admits s, and the
job finishes with two nodes. Without a loss, s never runs a rank and exits 0."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_multinode import RDZV_CONF, _descendants, free_port
from trainguard.incidents import IncidentStore, RootCause

PLAIN = Path(__file__).parent / "workers" / "plain_ddp.py"
pytestmark = pytest.mark.slow


def start_node(tmp_path: Path, name: str, port: int, epochs: int, spare: bool = False) -> subprocess.Popen:
    args = [
        sys.executable, "-m", "trainguard.cli", "run", "--nnodes", "2:2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "spare2",
        "--max-restarts", "3", "--rdzv-conf", f"{RDZV_CONF},is_host={str(name == 'a').lower()}",
        "--db", str(tmp_path / f"{name}.db"), "--runs-dir", str(tmp_path / name), "--no-tee",
        "--json", str(tmp_path / f"{name}.json"), *(["--spare"] if spare else []),
        "--", sys.executable, str(PLAIN), "--epochs", str(epochs), "--save-every", "1", "--batch-sleep", "0.02",
    ]  # fmt: skip
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)


def rank_outputs(tmp_path: Path, name: str) -> list[str]:
    return [p.read_text(errors="replace") for p in tmp_path.glob(f"{name}/*/logs/*/attempt*/rank*.stdout")]


def both_train(tmp_path: Path) -> bool:
    return all(any(" | loss " in o for o in rank_outputs(tmp_path, n)) for n in ("a", "b"))


def result(tmp_path: Path, name: str) -> dict:
    path = tmp_path / f"{name}.json"
    assert path.exists(), (tmp_path / f"{name}.log").read_text()[-3000:]
    return json.loads(path.read_text())


def wait_training(tmp_path: Path, s: subprocess.Popen) -> None:
    """a and b train (a snapshot exists) and the spare's supervisor is up with its warm pool."""
    deadline = time.time() + 180
    while time.time() < deadline and not (
        both_train(tmp_path) and (tmp_path / "snapshot.pt").exists() and _descendants(s.pid)
    ):
        time.sleep(0.2)
    assert both_train(tmp_path), (tmp_path / "a.log").read_text()[-3000:]
    assert _descendants(s.pid), (tmp_path / "s.log").read_text()[-3000:]


def start_job(tmp_path: Path, epochs: int) -> tuple[subprocess.Popen, subprocess.Popen, subprocess.Popen]:
    """Nodes a and b of a 2-node job and s, its spare, on one free port."""
    port = free_port()
    a, b = (start_node(tmp_path, name, port, epochs=epochs) for name in ("a", "b"))
    return a, b, start_node(tmp_path, "s", port, epochs=epochs, spare=True)


def end(*procs: subprocess.Popen) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_spare_takes_the_lost_nodes_place_and_the_job_finishes_at_full_size(tmp_path):
    a, b, s = start_job(tmp_path, epochs=60)
    try:
        wait_training(tmp_path, s)
        assert rank_outputs(tmp_path, "s") == []  # waiting, not training
        for pid in [b.pid, *_descendants(b.pid)]:  # node b loses power: supervisor and workers at once
            os.kill(pid, signal.SIGKILL)
        assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
        assert s.wait(timeout=120) == 0, (tmp_path / "s.log").read_text()[-3000:]
    finally:
        end(a, b, s)
    ra, rs = result(tmp_path, "a"), result(tmp_path, "s")
    assert ra["world_sizes"] == [2, 2], ra  # back at full size, never shrunk
    assert rs["world_sizes"] == [2], rs
    [spare_out] = rank_outputs(tmp_path, "s")  # the spare ran a rank after the kill ...
    assert "resuming from snapshot at epoch" in spare_out and " | loss " in spare_out  # ... from the snapshot
    assert "epoch 59 |" in spare_out
    [admitted] = [n for n in rs["nodes"] if n["kind"] == "spare_admitted"]
    b_node = f"_{b.pid}_0"
    [replaced] = [n for n in ra["nodes"] if n["kind"] == "replaced"]
    assert replaced["lost"].endswith(b_node) and replaced["node"] == admitted["node"], ra["nodes"]
    assert ra["attempts"] == 2 and len(ra["recoveries"]) == 1  # a restart like any other
    final_a = (tmp_path / "a.log").read_text().splitlines()[-1]
    assert f"took the place of node {replaced['lost']}" in final_a, final_a
    assert "spare node" in (tmp_path / "s.log").read_text().splitlines()[-1]
    [first, *_] = IncidentStore(tmp_path / "a.db").incidents(job="spare2")
    assert first.root_cause is RootCause.HOST and first.category == "node_failure", first
    assert first.node is not None and first.node.endswith(b_node), first


def test_a_spare_that_is_never_needed_runs_no_rank_and_exits_cleanly(tmp_path):
    a, b, s = start_job(tmp_path, epochs=30)
    try:
        assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
        assert b.wait(timeout=60) == 0, (tmp_path / "b.log").read_text()[-3000:]
        assert s.wait(timeout=120) == 0, (tmp_path / "s.log").read_text()[-3000:]
    finally:
        end(a, b, s)
    ra, rs = result(tmp_path, "a"), result(tmp_path, "s")
    assert ra["world_sizes"] == [2] and ra["attempts"] == 1, ra
    assert (
        rs["world_sizes"] == []
        and rs["nodes"] == []
        and rs["attempts"] == 0
        and rs["reason"].startswith("spare node, never needed")
    )
    assert rank_outputs(tmp_path, "s") == []
    assert "epoch 29 |" in "".join(rank_outputs(tmp_path, "a"))
    # torch's exit barrier passed on every node (it waits on the agent's rendezvous store)
    assert "terminal_state/last_member" not in (tmp_path / "a.log").read_text()
    assert "Error waiting on exit barrier" not in (tmp_path / "b.log").read_text()
