"""examples/train_digits.py under torchrun (2 ranks, gloo): it learns, and it survives preemption and
SIGKILL. One test with three launches: torchrun startup dominates the run time."""

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


def _children(pid: int) -> list[int]:
    return [
        p
        for p in _descendants(pid)
        if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
    ]


def _kill_everything(pid: int) -> None:
    """SIGKILL torchrun and every process under it: workers run in sessions of their own."""
    for victim in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def _start(args: list[str], run: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*TORCHRUN, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(run),
    )


def _wait_for(metrics: Path, n: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.time() + 120
    while len(_steps(metrics)) < n:
        assert proc.poll() is None and time.time() < deadline, "the run ended early"
        time.sleep(0.05)


def test_digits_learns_above_90_percent_through_a_preemption_and_a_kill(tmp_path):
    run, ckpt, metrics = tmp_path / "run", tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    args = ["--steps", "120", "--checkpoint-every", "20", "--checkpoint-dir", str(ckpt)]
    args += ["--metrics", str(metrics), "--step-delay", "0.005"]

    # 1. a preemption notice (SIGTERM) to the rank processes: they agree on one step, save, exit 83
    proc = _start(args, run)
    _wait_for(metrics, 25, proc)
    for worker in _children(proc.pid):
        os.kill(worker, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert "exitcode  : 83" in err or "exitcode: 83" in err, err[-3000:]
    exits = [rundir.read_last_heartbeat(rundir.heartbeat_path(run, r)) for r in (0, 1)]
    assert all(b is not None and b.phase == "exit" for b in exits), err[-3000:]
    preempted = exits[0].step + 1  # type: ignore[union-attr]
    assert exits[1].step + 1 == preempted  # type: ignore[union-attr]
    assert "saving step" in err and [c.step for c in list_checkpoints(ckpt)][-1] == preempted

    # 2. the next attempt resumes from exactly there; then SIGKILL everything mid-run
    proc = _start(args, run)
    _wait_for(metrics, len(_steps(metrics)) + 45, proc)
    _kill_everything(proc.pid)
    out, _ = proc.communicate(timeout=30)
    assert f"resumed from step {preempted}" in out
    valid = [c.step for c in list_checkpoints(ckpt) if verify(c.path).ok]
    assert valid and preempted < max(valid) < 120 and max(valid) % 20 == 0
    before = len(_steps(metrics))

    # 3. the last attempt resumes from the newest valid checkpoint and finishes above 90%
    resumed = subprocess.run(
        [*TORCHRUN, str(EXAMPLE), *args], capture_output=True, text=True, timeout=240, env=_env(run)
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {max(valid)}" in resumed.stdout
    assert _accuracy(resumed.stdout) > 0.90
    steps = _steps(metrics)
    assert steps[-1] == 119  # the file was continued, not restarted
    assert steps[before:] == list(range(max(valid), 120))  # replayed from the checkpoint on
    for rank in (0, 1):
        last = rundir.read_last_heartbeat(rundir.heartbeat_path(run, rank))
        assert last is not None and (last.phase, last.step, last.attempt) == ("exit", 119, 0)
    assert [c.step for c in list_checkpoints(ckpt)][-1] == 120  # the final save
    assert not (run / "findings").exists()  # minibatch noise raised no spike
