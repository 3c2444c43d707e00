"""`trainguard run --launcher srun` inside a real Slurm allocation (tests/slurm_cluster.py: slurmctld,
slurmd and munged on loopback) with a plain mpi4py script that never imports trainguard
(examples/mpi/train_mpi.py, wired up by srun's PMIx plugin, ``--mpi=pmix``): a clean run, a killed
task, a failed GPU, a stopped task (a hang)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from real_parts import require_module
from slurm_cluster import NODE, SlurmCluster, require_slurm
from test_mpi_launcher import INSTALL, attempts, fail_gpu_1, result

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "mpi" / "train_mpi.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    require_module("mpi4py", install=INSTALL)
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=2) as c:
        yield c


def run(cluster: SlurmCluster, tmp_path: Path, *options: str, steps: int = 60, heartbeats: bool = False,
        background: bool = False) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:  # fmt: skip
    job = [sys.executable, str(JOB), "--steps", str(steps), "--step-time", "0.05",
           "--checkpoint-dir", str(tmp_path / "ckpt"), *(["--heartbeats"] if heartbeats else [])]  # fmt: skip
    # salloc: the user's allocation; trainguard runs in it, one srun step per attempt
    cmd = ["salloc", "--quiet", "-n", "2", sys.executable, "-m", "trainguard.cli", "run", "--launcher", "srun",
           "-n", "2", "--mpi=pmix", *options, "--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"),
           "--job-id", "mpi", "--json", str(tmp_path / "result.json"), "--no-tee", "--", *job]  # fmt: skip
    if background:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env
        )
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=cluster.env)


def test_a_plain_mpi4py_script_runs_clean_as_one_step(cluster: SlurmCluster, tmp_path: Path) -> None:
    r = run(cluster, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (attempt,) = attempts(tmp_path)
    assert "rank 0 of 2" in (attempt / "rank0.stdout").read_text()  # MPI's world: srun's two tasks
    assert "done step=60" in (attempt / "rank0.stdout").read_text()
    assert [json.loads((attempt / f"rank{i}.exit").read_text())["code"] for i in (0, 1)] == [0, 0]
    proc = json.loads((attempt / "rank1.proc").read_text())
    assert proc["host"] == NODE and proc["step"].endswith(".0")  # Slurm's node name, the first step
    assert (attempt / "hostfile").read_text() == f"{NODE}\n{NODE}\n"
    assert "CANCELLED" not in (attempt / "srun.log").read_text()  # the step ended by itself
    assert result(tmp_path)["incidents"] == []


def test_a_killed_task_ends_the_step_and_the_job_restarts_from_its_checkpoint(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "kill.toml").write_text('[[fault]]\nkind = "kill"\nrank = 1\nat_s = 6\n')
    r = run(cluster, tmp_path, "--chaos", str(tmp_path / "kill.toml"), steps=150)
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = attempts(tmp_path)
    assert json.loads((first / "rank1.exit").read_text())["code"] == -signal.SIGKILL
    assert json.loads((first / "rank0.exit").read_text())["signal"] is not None  # srun's teardown
    said = (first / "srun.log").read_text()
    assert f"{NODE}: task 1: Killed" in said and "Terminating StepId" in said  # srun's own teardown
    out = (second / "rank0.stdout").read_text()
    assert "rank 0 of 2: starting at step 0" not in out and "rank 0 of 2" in out and "done step=150" in out
    step0 = json.loads((first / "rank0.proc").read_text())["step"]
    assert json.loads((second / "rank0.proc").read_text())["step"] != step0  # a new step
    (incident,) = result(tmp_path)["incidents"]
    assert incident["rank"] == 1 and incident["action"] == "restart"


def test_a_failed_gpu_restarts_the_step_with_one_task_less(cluster: SlurmCluster, tmp_path: Path) -> None:
    proc = run(cluster, tmp_path, "--backend", "sim", "--no-preflight", steps=200, background=True)
    assert isinstance(proc, subprocess.Popen)
    out = fail_gpu_1(proc, tmp_path)
    assert proc.returncode == 0, out
    _, second = attempts(tmp_path)
    assert (second / "hostfile").read_text() == f"{NODE}\n"  # -n 2 -> 1: GPU 1 is out
    assert "rank 0 of 1" in (second / "rank0.stdout").read_text()
    assert not (second / "rank1.proc").exists()
    (incident,) = result(tmp_path)["incidents"]
    assert incident["gpu"] == 1 and incident["action"] == "exclude_gpu"


def test_a_stopped_task_is_a_hang_the_heartbeats_show_and_the_step_is_replaced(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "stop.toml").write_text('[[fault]]\nkind = "stop"\nrank = 1\nat_s = 6\n')
    r = run(cluster, tmp_path, "--chaos", str(tmp_path / "stop.toml"), "--hang-timeout-floor", "10",
            steps=150, heartbeats=True)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    first, second = attempts(tmp_path)
    assert json.loads((first / "rank1.exit").read_text())["code"] < 0  # stopped, then ended by a signal
    assert "done step=150" in (second / "rank0.stdout").read_text()
    (incident,) = result(tmp_path)["incidents"]
    assert incident["rank"] == 1 and incident["action"] == "restart"
    assert (incident["category"], incident["detected_by"]) == ("hang", "heartbeat")
