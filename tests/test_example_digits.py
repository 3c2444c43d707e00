"""examples/train_digits.py under torchrun (2 ranks, gloo): it learns, and it survives being killed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard import rundir
from trainguard.checkpoint import list_checkpoints, verify

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_digits.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

pytestmark = pytest.mark.slow


def _env(run_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != rundir.RUN_DIR_ENV}
    env["OMP_NUM_THREADS"] = "1"
    if run_dir is not None:
        env[rundir.RUN_DIR_ENV] = str(run_dir)
    return env


def _accuracy(stdout: str) -> float:
    match = re.search(r"test accuracy: ([0-9.]+)", stdout)
    assert match, stdout
    return float(match.group(1))


def _steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    steps = []
    for line in metrics.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:  # the line a kill tore
            continue
    return steps


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_everything(pid: int) -> None:
    """SIGKILL torchrun and every process under it: workers run in sessions of their own."""
    for victim in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def test_digits_trains_above_90_percent_with_two_ranks_and_heartbeats(tmp_path):
    run, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"
    args = ["--steps", "120", "--metrics", str(metrics), "--checkpoint-dir", str(tmp_path / "ckpt")]
    proc = subprocess.run(
        [*TORCHRUN, str(EXAMPLE), *args], capture_output=True, text=True, timeout=240, env=_env(run)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _accuracy(proc.stdout) > 0.90
    assert _steps(metrics) == list(range(120))
    for rank in (0, 1):
        last = rundir.read_last_heartbeat(rundir.heartbeat_path(run, rank))
        assert last is not None and (last.phase, last.step) == ("exit", 119)
    assert [c.step for c in list_checkpoints(tmp_path / "ckpt")][-1] == 120
    assert not (run / "findings").exists()  # clean minibatch noise raised no spike


def test_digits_killed_mid_run_resumes_from_the_newest_valid_checkpoint_and_finishes(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    args = ["--steps", "120", "--checkpoint-every", "20", "--checkpoint-dir", str(ckpt)]
    args += ["--metrics", str(metrics), "--step-delay", "0.005"]
    proc = subprocess.Popen(
        [*TORCHRUN, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )
    deadline = time.time() + 120
    while len(_steps(metrics)) < 50:
        assert proc.poll() is None and time.time() < deadline, "the first run ended early"
        time.sleep(0.05)
    _kill_everything(proc.pid)
    proc.communicate(timeout=30)
    valid = [c.step for c in list_checkpoints(ckpt) if verify(c.path).ok]
    assert valid and 40 <= max(valid) < 120
    killed_at = _steps(metrics)[-1]

    resumed = subprocess.run(
        [*TORCHRUN, str(EXAMPLE), *args], capture_output=True, text=True, timeout=240, env=_env()
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {max(valid)}" in resumed.stdout
    assert _accuracy(resumed.stdout) > 0.90
    steps = _steps(metrics)
    assert steps[-1] == 119  # the file was continued, not restarted
    tail = steps[steps.index(killed_at) + 1 :]
    assert tail[0] == max(valid) and tail == list(range(max(valid), 120))
