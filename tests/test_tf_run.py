"""``trainguard run --framework tf`` on real TensorFlow: a foreign MultiWorkerMirroredStrategy script
(tests/workers/tf_mwms.py: TF's tutorial, no trainguard in it) with two workers on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_parts import require_module

WORKER = Path(__file__).with_name("workers") / "tf_mwms.py"
TRAINGUARD = [sys.executable, "-m", "trainguard.cli"]
pytestmark = pytest.mark.slow


def need_tf() -> None:
    require_module("tensorflow", install="make install (tensorflow-cpu 2.21)")
    require_module("tf_keras", install="make install (tf-keras 2.21: multi-worker model.fit)")


def run(tmp_path: Path, job: str, *worker_args: str) -> subprocess.Popen[bytes]:
    argv = [*TRAINGUARD, "run", "--framework", "tf", "--nproc-per-node", "2", "--job-id", job, "--no-tee"]
    argv += ["--runs-dir", str(tmp_path / "runs"), "--db", str(tmp_path / "tg.db")]
    argv += ["--json", str(tmp_path / f"{job}.json")]
    return subprocess.Popen(
        [*argv, "--", sys.executable, str(WORKER), *worker_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def lines(tmp_path: Path, job: str, attempt: int, rank: int) -> str:
    files = list((tmp_path / "runs" / job / "logs").glob(f"*/attempt{attempt}/rank{rank}.stdout"))
    return files[0].read_text() if files else ""


def worker_pid(run_dir: Path, index: int) -> int | None:
    """The pid of TF worker ``index`` of the run (from /proc: its TF_CONFIG and run directory)."""
    mark = f"TRAINGUARD_RUN_DIR={run_dir.resolve()}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        config = next((v[len(b"TF_CONFIG=") :] for v in env if v.startswith(b"TF_CONFIG=")), None)
        if mark in env and config is not None and json.loads(config)["task"]["index"] == index:
            return int(entry.name)
    return None


def test_a_foreign_multiworker_script_runs_clean(tmp_path):
    need_tf()
    sup = run(tmp_path, "clean", "--epochs", "2")
    out, _ = sup.communicate(timeout=600)
    assert sup.returncode == 0, out.decode()[-3000:]
    result = json.loads((tmp_path / "clean.json").read_text())
    assert (result["exit_code"], result["attempts"], result["incidents"]) == (0, 1, [])
    assert all("done step 40" in lines(tmp_path, "clean", 0, r) for r in (0, 1))


def test_a_killed_worker_restarts_both_and_backup_and_restore_resumes(tmp_path):
    need_tf()
    backup = tmp_path / "backup"
    args = ("--epochs", "4", "--step-s", "0.1", "--backup-dir", str(backup), "--save-freq", "10")
    sup = run(tmp_path, "kill", *args)
    run_dir = tmp_path / "runs" / "kill"
    try:
        deadline = time.monotonic() + 400
        while "Epoch 2/" not in lines(tmp_path, "kill", 0, 0) and sup.poll() is None:
            assert time.monotonic() < deadline, "the job never reached its second epoch"
            time.sleep(0.2)
        pid = worker_pid(run_dir, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # rank 1 dies past the backup of step 20
        out, _ = sup.communicate(timeout=600)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    assert sup.returncode == 0, out.decode()[-3000:]
    result = json.loads((tmp_path / "kill.json").read_text())
    assert result["attempts"] == 2
    (incident,) = result["incidents"]
    assert (incident["rank"], incident["action"]) == (1, "restart")
    assert "killed by SIGKILL" in incident["summary"]
    for rank in (0, 1):
        again = lines(tmp_path, "kill", 1, rank)
        started = int(again.split("start step ")[1].split()[0])
        assert started >= 20 and started % 10 == 0, again[-500:]  # BackupAndRestore's last save, not 0
        assert "done step 80" in again
