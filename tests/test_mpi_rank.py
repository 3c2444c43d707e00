"""The per-rank wrapper (`trainguard.mpi.rank`) under a real Open MPI mpirun on loopback: each rank's
variables and GPU, its output files, and the records of how it ended that the supervisor reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real_parts import require_real

pytestmark = pytest.mark.slow

INSTALL = "apt-get install openmpi-bin libopenmpi-dev (make test-all does this)"


def mpirun(tmp_path: Path, script: str, np: int = 2, **env: str) -> subprocess.CompletedProcess[str]:
    exe = require_real("mpirun", install=INSTALL)
    (tmp_path / "job.py").write_text(script)
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    extra = {
        "TRAINGUARD_MPI_LOG_DIR": str(tmp_path / "logs"),
        "TRAINGUARD_RUN_DIR": str(tmp_path / "run"),
        **env,
    }
    return subprocess.run(
        [exe, "--oversubscribe", *root, "-np", str(np), sys.executable, "-m", "trainguard.mpi.rank", "--",
         sys.executable, str(tmp_path / "job.py")],
        env={**os.environ, **extra}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def record(tmp_path: Path, rank: int, kind: str) -> dict:
    return json.loads((tmp_path / "logs" / f"rank{rank}.{kind}").read_text())


def test_each_rank_gets_its_variables_gpu_and_files(tmp_path: Path) -> None:
    script = (
        "import os\n"
        "print(*(os.environ.get(k) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'CUDA_VISIBLE_DEVICES',"
        " 'TRAINGUARD_GPU')), os.getpid())\n"
    )
    r = mpirun(tmp_path, script, TRAINGUARD_MPI_GPUS="0,3")
    assert r.returncode == 0, r.stdout + r.stderr
    for rank, gpu in ((0, "0"), (1, "3")):
        *fields, pid = (tmp_path / "logs" / f"rank{rank}.stdout").read_text().split()
        assert fields == [str(rank), str(rank), "2", "0,3", gpu]
        assert record(tmp_path, rank, "proc")["pid"] == int(pid)
        assert (
            record(tmp_path, rank, "exit")["code"] == 0 and record(tmp_path, rank, "exit")["signal"] is None
        )


def test_a_rank_killed_by_a_signal_dies_of_it_under_mpirun(tmp_path: Path) -> None:
    script = "import os, signal, time\nif os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)\n"
    r = mpirun(tmp_path, script)
    assert r.returncode != 0
    assert record(tmp_path, 1, "exit")["code"] == -9
    assert "exited on signal 9" in r.stdout + r.stderr  # mpirun saw what it would see without us
    rank0 = record(tmp_path, 0, "exit")
    assert rank0["code"] < 0 and rank0["signal"] is not None  # ended by mpirun's teardown, passed on


def test_a_rank_that_raises_leaves_its_traceback_as_its_error_file(tmp_path: Path) -> None:
    script = (
        "import os, time\n"
        "def step():\n    raise ValueError('bad batch at step 20')\n"
        "if os.environ['RANK'] == '1':\n    step()\ntime.sleep(60)\n"
    )
    r = mpirun(tmp_path, script)
    assert r.returncode != 0
    assert record(tmp_path, 1, "exit")["code"] == 1
    error = json.loads((tmp_path / "run" / "errors" / "rank1.json").read_text())
    assert (error["exc_type"], error["message"], error["rank"]) == ("ValueError", "bad batch at step 20", 1)
    assert "in step" in error["traceback"]
    assert not (tmp_path / "run" / "errors" / "rank0.json").exists()  # torn down, no traceback of its own
