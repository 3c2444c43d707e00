"""`trainguard run --launcher mpirun` with a real Open MPI mpirun on loopback and a plain mpi4py
script that never imports trainguard (examples/mpi/train_mpi.py): a clean run, a killed rank, a
failed GPU, a crash loop, a drained node and a lost node ("nodes" are loopback daemons started by a
stand-in for ssh)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_parts import require_module, require_real
from trainguard.incidents import IncidentStore
from trainguard.incidents.fleet import FleetWriter
from trainguard.incidents.identity import NodeIdentity

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "mpi" / "train_mpi.py"
INSTALL = (
    "apt-get install openmpi-bin libopenmpi-dev; pip install 'trainguard[mpi]' (make test-all does both)"
)
# ssh's stand-in: drops ssh's options and the host, runs the daemon here as that host
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
exec env TRAINGUARD_HOST=$host /bin/sh -c "$*"
"""


@pytest.fixture(autouse=True)
def real_mpi() -> None:
    require_real("mpirun", install=INSTALL)
    require_module("mpi4py", install=INSTALL)


def run(tmp_path: Path, *options: str, steps: int = 60, script: list[str] | None = None,
        background: bool = False) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:  # fmt: skip
    job = script or [sys.executable, str(JOB), "--steps", str(steps), "--step-time", "0.05",
                     "--checkpoint-dir", str(tmp_path / "ckpt")]  # fmt: skip
    cmd = [sys.executable, "-m", "trainguard.cli", "run", "--launcher", "mpirun", "--oversubscribe", *options,
           "--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), "--job-id", "mpi",
           "--json", str(tmp_path / "result.json"), "--no-tee", "--", *job]  # fmt: skip
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


def attempts(tmp_path: Path) -> list[Path]:
    logs = tmp_path / "runs" / "mpi" / "logs"
    return sorted(a for node in (logs.iterdir() if logs.exists() else ()) for a in node.glob("attempt*"))


def started(tmp_path: Path, rank: int) -> dict | None:
    """The first attempt's record of ``rank``'s process, once its wrapper wrote it."""
    found = attempts(tmp_path)
    path = found[0] / f"rank{rank}.proc" if found else None
    return json.loads(path.read_text()) if path is not None and path.exists() else None


def result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "result.json").read_text())


def wait_for(pred, what: str, ceiling_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + ceiling_s
    while not pred():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def test_a_plain_mpi4py_script_runs_clean(tmp_path: Path) -> None:
    r = run(tmp_path, "-np", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    (attempt,) = attempts(tmp_path)
    assert "done step=60" in (attempt / "rank0.stdout").read_text()
    assert [json.loads((attempt / f"rank{i}.exit").read_text())["code"] for i in (0, 1)] == [0, 0]
    assert result(tmp_path)["incidents"] == []


def test_a_killed_rank_restarts_the_job_from_its_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "kill.toml").write_text('[[fault]]\nkind = "kill"\nrank = 1\nat_s = 6\n')
    r = run(tmp_path, "-np", "2", "--chaos", str(tmp_path / "kill.toml"), steps=150)
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = attempts(tmp_path)
    assert json.loads((first / "rank1.exit").read_text())["code"] == -signal.SIGKILL
    assert "exited on signal 9" in (first / "mpirun.log").read_text()  # mpirun saw it as it would alone
    out = (second / "rank0.stdout").read_text()
    assert "rank 0 of 2" in out and "done step=150" in out
    (incident,) = result(tmp_path)["incidents"]
    assert incident["rank"] == 1 and incident["action"] == "restart"


def fail_gpu_1(proc: subprocess.Popen[str], tmp_path: Path) -> str:
    """Once rank 1 runs, the simulated node's driver reports Xid 79 on its GPU 1; the run's
    output once it ends."""
    from trainguard.telemetry.sim.kmsg import write_xid_line
    from trainguard.telemetry.sim.profiles import pci_address

    try:
        wait_for(lambda: started(tmp_path, 1) is not None, "rank 1 started")
        rank1 = started(tmp_path, 1)
        assert rank1 is not None and rank1["gpu"] == 1
        log = tmp_path / "runs" / "mpi" / "sim-kmsg.log"  # the simulated node's kernel log
        write_xid_line(log, pci_address(1), 79, pid=rank1["pid"])  # the driver's line (the kernel's)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


def test_a_failed_gpu_restarts_the_job_without_it(tmp_path: Path) -> None:
    proc = run(tmp_path, "-np", "2", "--backend", "sim", "--no-preflight", steps=200, background=True)
    assert isinstance(proc, subprocess.Popen)
    out = fail_gpu_1(proc, tmp_path)
    assert proc.returncode == 0, out
    _, second = attempts(tmp_path)
    assert "rank 0 of 1" in (second / "rank0.stdout").read_text()  # -np 2 -> 1: GPU 1 is out
    assert not (second / "rank1.proc").exists()
    (incident,) = result(tmp_path)["incidents"]
    assert incident["gpu"] == 1 and incident["action"] == "exclude_gpu"


def test_the_same_error_every_start_is_a_crash_loop(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "from mpi4py import MPI\nif MPI.COMM_WORLD.Get_rank() == 1:\n    raise ValueError('bad shard 7')\n"
        "MPI.COMM_WORLD.Barrier()\n"
    )
    # `python -m mpi4py`: mpi4py's own way to end the job on an uncaught exception (MPI_Abort)
    r = run(
        tmp_path,
        "-np",
        "2",
        "--backoff-base",
        "0",
        script=[sys.executable, "-m", "mpi4py", str(tmp_path / "bad.py")],
    )
    assert r.returncode == 3, r.stdout + r.stderr  # crash loop: do not requeue
    # The same failure before any step, twice in a row: the second try is the last (the wrapper
    # turns the rank's last traceback into its error file, whose fingerprint both tries share).
    assert len(attempts(tmp_path)) == 2
    assert "ValueError: bad shard 7" in result(tmp_path)["reason"]


def fake_nodes(tmp_path: Path) -> list[str]:
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    return ["--mca", "plm_rsh_agent", str(ssh), "--host", "nodeA:1,nodeB:1"]


def test_a_node_the_fleet_drained_is_left_out(tmp_path: Path) -> None:
    with IncidentStore(tmp_path / "tg.db") as store:
        FleetWriter(store, NodeIdentity("nodeB")).action(
            "drain", outcome="done", target="nodeB", detail="xid 79 on GPU 0", time=time.time()
        )
    r = run(tmp_path, "-np", "2", *fake_nodes(tmp_path), steps=20)
    assert r.returncode == 0, r.stdout + r.stderr
    (attempt,) = attempts(tmp_path)
    assert (attempt / "hostfile").read_text() == "nodeA slots=1\n"
    assert json.loads((attempt / "rank0.proc").read_text())["host"] == "nodeA"
    assert "attempt without nodeB: drained by remediate: xid 79 on GPU 0" in r.stderr


def test_a_lost_node_is_left_out_of_the_restart(tmp_path: Path) -> None:
    proc = run(tmp_path, "-np", "2", *fake_nodes(tmp_path), steps=200, background=True)
    assert isinstance(proc, subprocess.Popen)
    try:
        wait_for(lambda: started(tmp_path, 1) is not None, "rank 1 started on nodeB")
        rank1 = started(tmp_path, 1)
        assert rank1 is not None and rank1["host"] == "nodeB"
        daemon = int(
            Path(f"/proc/{rank1['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1]
        )  # the wrapper
        daemon = int(Path(f"/proc/{daemon}/stat").read_text().rsplit(")", 1)[1].split()[1])  # nodeB's orted
        os.kill(daemon, signal.SIGKILL)  # the node dies
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    first, second = attempts(tmp_path)
    assert "Remote daemon" in (first / "mpirun.log").read_text()
    assert (second / "hostfile").read_text() == "nodeA slots=1\n"
    assert "attempt without nodeB: mpirun lost it" in out
