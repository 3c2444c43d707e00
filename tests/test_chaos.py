"""In-process chaos faults: each kind has its real effect and fires once per run, across restarts."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainguard import rundir
from trainguard.chaos import FaultKind
from trainguard.chaos.inject import FIRED_DIR, Chaos, load_faults
from trainguard.rundir import WorkerExit
from trainguard.torch.guard import Guard

WORKER = Path(__file__).with_name("test_guard_worker.py")


def _chaos_file(run_dir: Path, *faults: dict[str, object]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "chaos.json").write_text(json.dumps({"faults": list(faults)}))


def _fired(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / FIRED_DIR).glob("*"))


def test_only_this_ranks_valid_faults_are_loaded_in_step_order(tmp_path):
    _chaos_file(
        tmp_path,
        {"kind": "exit", "rank": 0, "step": 9, "code": 3},
        {"kind": "nan", "rank": 1, "step": 2},
        {"kind": "meteor", "rank": 0, "step": 1},
        {"kind": "slow", "rank": 0, "step": "soon"},
        {"kind": "nan", "rank": 0, "step": 4},
    )
    faults = load_faults(tmp_path, 0)
    assert [(f.kind, f.step) for f in faults] == [(FaultKind.NAN, 4), (FaultKind.EXIT, 9)]
    assert faults[1].code == 3
    (tmp_path / "chaos.json").write_text("{not json")
    assert load_faults(tmp_path, 0) == []
    assert load_faults(tmp_path / "missing", 0) == []


def test_nan_fires_once_at_or_after_its_step_and_never_after_a_restart(tmp_path):
    _chaos_file(tmp_path, {"kind": "nan", "rank": 0, "step": 5})
    chaos = Chaos(tmp_path, 0)
    assert [chaos.at_step(s) for s in (3, 4, 6, 7)] == [False, False, True, False]
    assert _fired(tmp_path) == ["000-nan-rank0-step5"]
    assert not any(Chaos(tmp_path, 0).at_step(s) for s in range(10))  # the restarted worker


def test_slow_sleeps_delay_s_for_steps_steps_once(tmp_path):
    _chaos_file(tmp_path, {"kind": "slow", "rank": 0, "step": 2, "delay_s": 0.5, "steps": 3})
    sleeps: list[float] = []
    chaos = Chaos(tmp_path, 0, sleep=sleeps.append)
    for step in range(10):
        if chaos.next_step is not None and step >= chaos.next_step:
            chaos.at_step(step)
    assert sleeps == [0.5, 0.5, 0.5]
    again: list[float] = []
    restarted = Chaos(tmp_path, 0, sleep=again.append)
    for step in range(10):
        restarted.at_step(step)
    assert again == [] and restarted.next_step is None


def test_raise_raises_the_named_exception_once(tmp_path):
    message = "CUDA error: an illegal memory access was encountered"
    _chaos_file(
        tmp_path,
        {"kind": "raise", "rank": 0, "step": 1, "exc": "MemoryError", "message": message},
        {"kind": "raise", "rank": 0, "step": 2, "exc": "NoSuchError"},
    )
    chaos = Chaos(tmp_path, 0)
    with pytest.raises(MemoryError, match="illegal memory access"):
        chaos.at_step(1)
    with pytest.raises(RuntimeError):  # an unknown type name falls back to RuntimeError
        chaos.at_step(2)
    Chaos(tmp_path, 0).at_step(5)  # nothing left to fire
    assert len(_fired(tmp_path)) == 2


def test_a_nan_fault_through_guard_loss_poisons_backward_and_runs_the_policy(tmp_path):
    _chaos_file(tmp_path, {"kind": "nan", "rank": 0, "step": 3})
    model = torch.nn.Linear(4, 1)
    seen = []
    with Guard(None, None, run_dir=tmp_path, on_nan="skip", watchdog=False) as guard:
        for step in guard.range(0, 6):
            loss = guard.loss(model(torch.randn(8, 4)).pow(2).mean())
            loss.backward()
            grads_nan = any(
                not torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
            )
            seen.append((step, math.isnan(loss.item()), grads_nan, guard.step(step, loss).value))
            model.zero_grad()
    assert [s for s in seen if s[1]] == [(3, True, True, "skip")]
    assert [f.rule for _, _, f in rundir.read_findings(tmp_path)] == ["numerics.nonfinite_loss"]


def _run_worker(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != rundir.RUN_DIR_ENV}
    return subprocess.run(
        [sys.executable, str(WORKER), "--run-dir", str(run_dir), "--steps", "20", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.slow
def test_exit_and_raise_end_the_worker_for_real_once_each_across_restarts(tmp_path):
    message = "CUDA error: an illegal memory access was encountered"
    _chaos_file(
        tmp_path,
        {"kind": "exit", "rank": 0, "step": 4, "code": 7},
        {"kind": "raise", "rank": 0, "step": 8, "message": message},
    )
    first = _run_worker(tmp_path)
    assert first.returncode == 7 and not first.stdout
    second = _run_worker(tmp_path)  # the exit fault fired already: this attempt dies at step 8
    assert second.returncode == 1 and f"RuntimeError: {message}" in second.stderr
    [record] = rundir.read_errors(tmp_path)
    assert record.message == message and record.step == 8
    assert _fired(tmp_path) == ["000-exit-rank0-step4", "001-raise-rank0-step8"]


@pytest.mark.slow
def test_hang_blocks_the_rank_until_the_watchdog_ends_it_once(tmp_path):
    _chaos_file(tmp_path, {"kind": "hang", "rank": 0, "step": 6})
    first = _run_worker(tmp_path, "--hang-floor", "1.0", "--step-sleep", "0.01")
    assert first.returncode == WorkerExit.HANG == 84
    assert "hang detected" in first.stderr
    [dump] = rundir.dumps_dir(tmp_path).glob("rank0-*.txt")
    text = dump.read_text()
    assert "no step completed" in text and "chaos/inject.py" in text  # the stack shows where it is stuck
    assert text.count("hread 0x") >= 2  # every thread: the main one and the watchdog
    [(rank, step, finding)] = rundir.read_findings(tmp_path)
    assert (rank, step, finding.rule) == (0, 6, "hang.watchdog")
    last = rundir.read_last_heartbeat(rundir.heartbeat_path(tmp_path, 0))
    assert last is not None and last.phase == "exit" and last.step == 6
    second = _run_worker(tmp_path, "--hang-floor", "1.0")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.splitlines()[-1])["steps_run"] == list(range(20))
