"""The launcher seam: `trainguard run --launcher local` supervises plain processes with no torch in
the supervisor, and the local launcher's hooks give each rank its own environment and command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainguard.supervisor import LaunchConfig, RecordConfig, SupervisorConfig, WatchConfig
from trainguard.supervisor.local import LocalLauncher
from trainguard.supervisor.supervisor import Supervisor

# A training script from no project of ours: no trainguard, no torch. Attempt 0 waits to be
# killed; a restarted attempt finishes at once.
PLAIN = """
import os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
rank, attempt = os.environ["RANK"], os.environ["TRAINGUARD_ATTEMPT"]
(out / f"rank{rank}.attempt{attempt}.pid").write_text(str(os.getpid()))
print(f"rank {rank} of {os.environ['WORLD_SIZE']}, attempt {attempt}", flush=True)
if attempt == "0":
    time.sleep(600)
print(f"rank {rank} done", flush=True)
"""

# The supervisor's process: torch cannot be imported, and none was by the end.
NO_TORCH = """
import json, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError(f"{name}: blocked by the test")
        return None

sys.meta_path.insert(0, NoTorch())
from trainguard.cli import main

code = main(sys.argv[1:])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "torch")))
sys.exit(code)
"""


def _wait_for(path: Path, proc: subprocess.Popen[str], within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert proc.poll() is None, f"trainguard run ended early ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_trainguard_run_supervises_a_plain_script_without_torch_and_restarts_a_killed_rank(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    argv = ["run", "--launcher", "local", "--nproc-per-node", "2", "--job-id", "plain"]
    argv += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), "--no-tee"]
    argv += ["--json", str(tmp_path / "result.json"), "--", sys.executable, str(script), str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-c", NO_TORCH, *argv],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "rank1.attempt0.pid", proc)
        _wait_for(tmp_path / "rank0.attempt0.pid", proc)
        os.kill(int((tmp_path / "rank1.attempt0.pid").read_text()), signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == []  # no torch module in the supervisor
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["exit_code"], result["attempts"]) == (0, 2)
    [incident] = result["incidents"]
    assert (incident["rank"], incident["action"]) == (1, "restart")
    assert "rank 1 killed by SIGKILL" in incident["summary"]
    logs = tmp_path / "runs" / "plain" / "logs"
    done = sorted(p.name for p in logs.glob("*/attempt1/rank*.stdout") if "done" in p.read_text())
    assert done == ["rank0.stdout", "rank1.stdout"]  # the restarted attempt's own log files


def test_the_local_launchers_hooks_give_each_rank_its_environment_and_command(tmp_path):
    seen = tmp_path / "seen"
    seen.mkdir()
    worker = "import os, sys; open(sys.argv[1] + '/' + os.environ['RANK'], 'w').write(os.environ['ROLE'] + ' ' + sys.argv[2])"

    def rank_env(local_rank: int, world_size: int, env: dict[str, str]) -> None:
        env["ROLE"] = f"{'chief' if local_rank == 0 else 'worker'}/{world_size}"

    def command(cmd, local_rank: int, world_size: int) -> list[str]:
        return [*cmd, f"task{local_rank}"]

    config = SupervisorConfig(
        LaunchConfig(cmd=(sys.executable, "-c", worker, str(seen)), nproc_per_node=2, launcher="local"),
        RecordConfig(job_id="hooks", runs_root=tmp_path / "runs", db=tmp_path / "tg.db"),
        WatchConfig(tee=False),
    )
    result = Supervisor(config, launcher=LocalLauncher(rank_env, command)).run()
    assert int(result.exit_code) == 0, result.reason
    assert {p.name: p.read_text() for p in seen.iterdir()} == {"0": "chief/2 task0", "1": "worker/2 task1"}
