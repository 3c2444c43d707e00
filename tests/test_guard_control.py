"""The Guard serves the supervisor's checkpoint requests (`trainguard.control`) at its step
boundary: once per request, at the same step on every rank, and never at the cost of training
when the file is not one it can read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_guard import MemoryCheckpointer, State, _train  # noqa: E402
from trainguard import rundir  # noqa: E402
from trainguard.control import Control, control_path, read_control, write_control  # noqa: E402
from trainguard.rundir import read_last_heartbeat  # noqa: E402
from trainguard.torch.guard import Guard  # noqa: E402

WORKER = Path(__file__).with_name("test_guard_worker.py")


def _guard(run: Path, ckpt: MemoryCheckpointer, state: State, attempt: int = 0) -> Guard:
    return Guard(
        ckpt,
        state,
        run_dir=run,
        attempt=attempt,
        control_every=5,
        save_at_end=False,
        watchdog=False,
        chaos=False,
    )


def _ask_at(run: Path, steps: dict[int, Control]):
    """A loss hook that writes a control document as the given steps run (as the supervisor would)."""

    def loss_at(step: int, loss):
        if step in steps:
            write_control(run, steps[step])
        return loss

    return loss_at


def test_a_request_is_served_once_at_the_next_look(tmp_path):
    first = Control().asking_checkpoint("GPU 2 degraded", now=1.0)
    second = first.asking_checkpoint("GPU 2 still degraded", now=2.0)
    ckpt, state = MemoryCheckpointer(), State()
    with _guard(tmp_path, ckpt, state) as guard:
        trace = _train(guard, state, 0, 40, _ask_at(tmp_path, {12: first, 26: second}))
    assert sorted(ckpt.saved) == [15, 30]  # the next look (every 5 steps) after each request
    assert [a for _, a in trace] == ["proceed"] * 40


def test_a_document_that_changes_nothing_asked_brings_no_save(tmp_path):
    asked = Control().asking_checkpoint("once", now=1.0)
    rewritten = Control(seq=asked.seq + 1, time=2.0, save_now=asked.save_now, reason="once")  # seq only
    ckpt, state = MemoryCheckpointer(), State()
    with _guard(tmp_path, ckpt, state) as guard:
        _train(guard, state, 0, 30, _ask_at(tmp_path, {3: asked, 12: rewritten}))
    assert sorted(ckpt.saved) == [5]


def test_a_request_for_another_attempt_is_not_served(tmp_path):
    ckpt, state = MemoryCheckpointer(), State()
    for_attempt_0 = Control().asking_checkpoint("before the restart", now=1.0, attempt=0)
    with _guard(tmp_path, ckpt, state, attempt=1) as guard:
        _train(guard, state, 0, 20, _ask_at(tmp_path, {2: for_attempt_0}))
    assert ckpt.saved == {}


@pytest.mark.parametrize("text", ["{", json.dumps({"version": 99, "seq": 1, "save_now": 1}), "[]"])
def test_a_control_file_the_guard_cannot_read_is_ignored(tmp_path, text):
    control_path(tmp_path).write_text(text)
    ckpt, state = MemoryCheckpointer(), State()
    with _guard(tmp_path, ckpt, state) as guard:
        trace = _train(guard, state, 0, 20)
    assert ckpt.saved == {} and len(trace) == 20


@pytest.mark.slow
def test_two_ranks_serve_a_request_at_the_same_step(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if k != rundir.RUN_DIR_ENV}
    env["OMP_NUM_THREADS"] = "1"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = [
        "--run-dir",
        str(run),
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--steps",
        "300",
        "--step-sleep",
        "0.02",
    ]
    proc = subprocess.Popen(
        [*torchrun, str(WORKER), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 180
        beats = [rundir.heartbeat_path(run, r) for r in (0, 1)]
        while min(((b := read_last_heartbeat(p)) and b.step) or 0 for p in beats) < 20:
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read()[-3000:] if proc.stderr else ""
            )
            time.sleep(0.05)
        asked_at = max(read_last_heartbeat(p).step for p in beats)  # type: ignore[union-attr]
        write_control(run, Control().asking_checkpoint("test", now=time.time()))
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    saved = {
        r: sorted(int(p.stem[4:]) for p in (tmp_path / "ckpt" / f"rank{r}").glob("step*.pt")) for r in (0, 1)
    }
    assert saved[0] == saved[1], saved  # the same step on both ranks: they agreed on it
    [requested, last] = saved[0]  # the request's checkpoint, and the one at the end
    assert asked_at < requested < last == 300
    assert read_control(run) is not None
