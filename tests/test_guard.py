"""The Guard around a training loop: heartbeats, numerics policies, error files, preemption."""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard import rundir
from trainguard.rundir import WorkerExit, read_findings, read_heartbeats, read_last_heartbeat
from trainguard.supervisor.ports import private_port
from trainguard.torch.guard import Guard, StepAction

WORKER = Path(__file__).with_name("test_guard_worker.py")


class MemoryCheckpointer:
    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}

    def save(self, step: int, state: Any) -> None:
        self.saved[step] = copy.deepcopy((state.model.state_dict(), state.optimizer.state_dict()))

    def wait(self) -> None:
        pass

    def resume(self, state: Any) -> int:
        if not self.saved:
            return 0
        step = max(self.saved)
        model, optimizer = self.saved[step]
        state.model.load_state_dict(model)
        state.optimizer.load_state_dict(optimizer)
        return step


class State:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)


def _train(guard: Guard, state: State, start: int, stop: int, loss_at=None) -> list[tuple[int, str]]:
    """Run the documented loop; ``loss_at(step, loss)`` may replace the loss (to inject faults)."""
    trace = []
    for step in guard.range(start, stop):
        loss = ((state.model(torch.randn(16, 4)) - 1.0) ** 2).mean()
        if loss_at is not None:
            loss = loss_at(step, loss)
        loss.backward()
        action = guard.step(step, loss)
        trace.append((step, action.value))
        if action == "proceed":
            state.optimizer.step()
        state.optimizer.zero_grad()
    return trace


def _worker(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop(rundir.RUN_DIR_ENV, None)
    return subprocess.Popen(
        [sys.executable, str(WORKER), "--run-dir", str(tmp_path / "run"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def test_heartbeats_are_throttled_but_keep_first_phase_changes_and_final_step(tmp_path):
    state = State()
    with Guard(None, state, run_dir=tmp_path, heartbeat_interval_s=3600, watchdog=False) as guard:
        _train(guard, state, 0, 50)
    beats = read_heartbeats(rundir.heartbeat_path(tmp_path, 0))
    phases = [(b.phase, b.step) for b in beats]
    assert phases[0] == ("init", 0)
    assert ("train", 0) in phases  # the first step is written at once
    assert len(beats) < 10  # not one per step
    last = read_last_heartbeat(rundir.heartbeat_path(tmp_path, 0))
    assert last is not None and last.phase == "exit" and last.step == 49
    assert last.loss is not None and last.loss < beats[1].loss  # type: ignore[operator]
    assert last.pid == os.getpid()


def test_step_times_are_measured_per_step_and_reported(tmp_path):
    state = State()
    with Guard(None, state, run_dir=tmp_path, heartbeat_interval_s=0, watchdog=False) as guard:
        for step in guard.range(0, 5):
            time.sleep(0.02)
            guard.step(step, torch.tensor(1.0))
    assert len(guard.step_times) == 5
    assert all(t >= 0.02 for t in list(guard.step_times)[1:])
    beats = [b for b in read_heartbeats(rundir.heartbeat_path(tmp_path, 0)) if b.phase == "train"]
    assert beats[-1].step_time is not None and beats[-1].step_time >= 0.02


def test_nan_under_skip_drops_the_update_and_records_a_finding(tmp_path):
    state = State()
    with Guard(None, state, run_dir=tmp_path, on_nan="skip", watchdog=False) as guard:
        trace = _train(guard, state, 0, 10, lambda s, loss: loss * math.nan if s == 4 else loss)
    assert (4, "skip") in trace and [s for s, _ in trace] == list(range(10))
    assert all(p.grad is None for p in state.model.parameters())  # the NaN grads were dropped
    assert all(torch.isfinite(p).all() for p in state.model.parameters())
    [(rank, step, finding)] = read_findings(tmp_path)
    assert (rank, step, finding.rule) == (0, 4, "numerics.nonfinite_loss")


def test_nan_under_rollback_restores_the_checkpoint_and_replays(tmp_path):
    state, ckpt = State(), MemoryCheckpointer()
    bad = {7}
    with Guard(ckpt, state, run_dir=tmp_path, checkpoint_every=5, watchdog=False) as guard:
        trace = _train(
            guard, state, 0, 12, lambda s, loss: loss * math.nan if s in bad and not bad.clear() else loss
        )
    assert [s for s, _ in trace] == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 9, 10, 11]
    assert (7, "rollback") in trace
    rules = [f.rule for _, _, f in read_findings(tmp_path)]
    assert rules == ["numerics.nonfinite_loss", "numerics.rollback", "numerics.transient"]
    assert sorted(ckpt.saved) == [5, 10, 12]  # the final save after the last step


def test_rollback_without_a_checkpoint_skips_instead(tmp_path):
    state = State()
    with Guard(MemoryCheckpointer(), state, run_dir=tmp_path, watchdog=False) as guard:
        trace = _train(guard, state, 0, 6, lambda s, loss: loss * math.nan if s == 3 else loss)
    assert (3, "skip") in trace and len(trace) == 6


def test_nan_under_stop_exits_with_numerics_stop(tmp_path):
    state = State()
    with (
        pytest.raises(SystemExit) as exit_info,
        Guard(None, state, run_dir=tmp_path, on_nan="stop", watchdog=False) as guard,
    ):
        _train(guard, state, 0, 10, lambda s, loss: loss * math.inf if s == 2 else loss)
    assert exit_info.value.code == WorkerExit.NUMERICS_STOP == 85
    assert read_last_heartbeat(rundir.heartbeat_path(tmp_path, 0)).phase == "exit"  # type: ignore[union-attr]


def test_nonfinite_gradients_are_caught_by_check_grads(tmp_path):
    state = State()
    with Guard(None, state, run_dir=tmp_path, on_nan="skip", watchdog=False) as guard:
        state.model(torch.randn(2, 4)).sum().backward()
        state.model.weight.grad[0, 0] = math.inf  # type: ignore[index]
        guard.check_grads(state.model)
        assert guard.step(0, 1.0) is StepAction.SKIP
        state.model(torch.randn(2, 4)).sum().backward()
        guard.check_grads(state.model)
        assert guard.step(1, 1.0) is StepAction.PROCEED
    assert read_findings(tmp_path)[0][2].rule == "numerics.nonfinite_grad"


def test_a_spike_on_the_same_data_after_rollback_is_a_data_problem(tmp_path):
    state, ckpt = State(), MemoryCheckpointer()

    def spiky(step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss * 0 + (100.0 if step == 45 else 1.0 + 0.01 * (step % 5))  # step 45: a bad batch

    with Guard(ckpt, state, run_dir=tmp_path, checkpoint_every=20, watchdog=False) as guard:
        trace = _train(guard, state, 0, 50, spiky)
    assert [a for s, a in trace if s == 45] == ["rollback", "skip"]
    rules = [f.rule for _, _, f in read_findings(tmp_path)]
    assert rules == [
        "numerics.loss_spike",
        "numerics.rollback",
        "numerics.loss_spike",
        "numerics.data_problem",
    ]


def test_an_exception_in_the_block_leaves_an_error_file_before_the_process_dies(tmp_path):
    elastic = tmp_path / "elastic" / "error.json"
    proc = _worker(tmp_path, "--raise-at", "3", env={"TORCHELASTIC_ERROR_FILE": str(elastic), "RANK": "1"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "CUDA error: an illegal memory access" in err  # still printed as a real one would be
    [record] = rundir.read_errors(tmp_path / "run")
    assert (record.rank, record.step, record.exc_type) == (1, 3, "RuntimeError")
    assert "illegal memory access" in record.message and "Traceback" in record.traceback
    assert abs(record.time - time.time()) < 60
    body = json.loads(elastic.read_text())["message"]
    assert body["message"].startswith("RuntimeError: CUDA error")
    assert "Traceback" in body["extraInfo"]["py_callstack"] and body["extraInfo"]["timestamp"].isdigit()


def test_an_exception_outside_the_block_is_recorded_by_record(tmp_path):
    proc = _worker(tmp_path, "--steps", "2", "--record-outside")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "after the block" in err
    [record] = rundir.read_errors(tmp_path / "run")
    assert record.exc_type == "ValueError" and record.step == 1  # the last step run


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_boundary_and_exits_preempted(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    args = ["--ckpt-dir", str(ckpt_dir), "--steps", "100000", "--step-sleep", "0.02"]
    proc = _worker(tmp_path, *args)
    beats = rundir.heartbeat_path(tmp_path / "run", 0)
    deadline = time.time() + 60
    while (hb := read_last_heartbeat(beats)) is None or hb.step < 5:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == WorkerExit.PREEMPTED == 83
    last = read_last_heartbeat(beats)
    assert last is not None and last.phase == "exit"
    saved = sorted(ckpt_dir.glob("step*.pt"))  # resuming from it: test_example_digits.py
    assert len(saved) == 1 and saved[0].name == f"step{last.step + 1:08d}.pt"


@pytest.mark.slow
def test_a_second_sigterm_while_the_first_is_pending_ends_the_process(tmp_path):
    # Stuck before any boundary. The hang watchdog must not end it first (exit 84) however slowly a
    # loaded machine gets through the two signals: this test is about the signals, not the watchdog.
    # Nor the preemption watch (it would end the process by the first signal: the next test).
    args = ("--hang-at", "5", "--hang-floor", "3600", "--preempt-wait", "3600")
    proc = _worker(tmp_path, "--steps", "100000", *args)
    beats = rundir.heartbeat_path(tmp_path / "run", 0)
    deadline = time.time() + 60
    while (hb := read_last_heartbeat(beats)) is None or hb.phase != "train":
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)
    lines: list[str] = []
    noticed = threading.Event()

    def read_stderr() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "received SIGTERM: will checkpoint" in line:
                noticed.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    proc.send_signal(signal.SIGTERM)
    # The second signal only after the worker handled the first (two pending ones would merge).
    assert noticed.wait(120), "".join(lines)[-3000:]
    assert proc.poll() is None  # the first one waits for a step boundary that never comes
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    reader.join(timeout=30)
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.slow
def test_sigterm_to_a_rank_blocked_in_a_collective_ends_it(tmp_path):
    # Two ranks of DDP over gloo; rank 1 is stopped, so rank 0 blocks in the gradient all-reduce
    # (in C++, where Python runs no signal handler) for gloo's 30-minute timeout. A launcher's
    # SIGTERM must end it all the same: the step boundary will never come.
    port = str(private_port())
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    procs = [
        _worker(
            tmp_path, "--steps", "100000", "--step-sleep", "0.02", env={**env, "RANK": r, "LOCAL_RANK": r}
        )
        for r in ("0", "1")
    ]
    try:
        beats = rundir.heartbeat_path(tmp_path / "run", 0)
        deadline = time.time() + 120
        while (hb := read_last_heartbeat(beats)) is None or hb.step < 5:
            assert time.time() < deadline and all(p.poll() is None for p in procs), "never trained"
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(1.0)  # rank 0 reaches the all-reduce its stopped peer never joins
        procs[0].send_signal(signal.SIGTERM)
        _, err = procs[0].communicate(timeout=120)  # before: held until gloo's 30-minute timeout
        assert procs[0].returncode == -signal.SIGTERM, err[-3000:]
        assert "no step boundary will come" in err
    finally:
        for p in procs:
            p.kill()
            p.communicate(timeout=60)


# -- lazy checks (check_every / check_lag): the GPU and multi-rank default, exercised on CPU ------


def test_lazy_checks_roll_back_within_the_window_to_a_clean_checkpoint(tmp_path):
    state, ckpt = State(), MemoryCheckpointer()
    bad = {6}
    with Guard(
        ckpt, state, run_dir=tmp_path, checkpoint_every=4, check_every=4, check_lag=1, watchdog=False
    ) as guard:
        trace = _train(
            guard, state, 0, 12, lambda s, loss: loss * math.nan if s in bad and not bad.clear() else loss
        )
    # Windows of 4 steps. The NaN of step 6 sits in the window 4..7, which the checkpoint
    # boundary after step 7 checks before saving: rollback to step 4.
    steps = [s for s, _ in trace]
    assert steps == [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 8, 9, 10, 11]
    assert all(a == "proceed" for _, a in trace)  # the rollback came at the boundary, not in a step
    assert sorted(ckpt.saved) == [4, 8, 12]  # no checkpoint ever held the NaN update
    assert all(torch.isfinite(p).all() for p in state.model.parameters())
    findings = read_findings(tmp_path)
    assert [(s, f.rule) for _, s, f in findings] == [
        (6, "numerics.nonfinite_loss"),
        (7, "numerics.rollback"),
        (6, "numerics.transient"),  # the replay is checked step by step: a repeat could be skipped
    ]
    assert "rolled back from step 7 to the checkpoint of step 4" in findings[1][2].reason


def test_a_lazy_check_acts_one_step_late_before_that_steps_update(tmp_path):
    state, ckpt = State(), MemoryCheckpointer()
    with Guard(ckpt, state, run_dir=tmp_path, checkpoint_every=20, check_every=1, check_lag=1) as guard:
        trace = _train(guard, state, 0, 40, lambda s, loss: loss * math.inf if s == 25 else loss)
    assert (26, "rollback") in trace  # read at step 26, before step 26's update
    assert [a for s, a in trace if s == 25] == ["proceed", "skip"]  # the replay is checked at once
    assert sorted(ckpt.saved) == [20, 40]


def test_lazy_checks_cost_no_read_between_windows(tmp_path):
    class Loss:  # counts reads, like a GPU tensor would count syncs
        reads = 0

        def detach(self) -> Loss:
            return self

        def __float__(self) -> float:
            Loss.reads += 1
            return 1.0

    with Guard(None, None, run_dir=tmp_path, check_every=8, check_lag=1, watchdog=False) as guard:
        for step in range(33):
            guard.step(step, Loss())
            guard.end_step(step)
        assert Loss.reads == 32  # windows 0-7, 8-15, 16-23, 24-31, each read one step late
        assert guard.last_checked == 31
    assert Loss.reads == 33 and guard.last_checked == 32  # a clean exit checks the rest


def test_numerics_stop_under_lazy_checks_exits_within_the_window(tmp_path):
    state = State()
    with (
        pytest.raises(SystemExit) as exit_info,
        Guard(
            None, state, run_dir=tmp_path, on_nan="stop", check_every=4, check_lag=1, watchdog=False
        ) as guard,
    ):
        _train(guard, state, 0, 20, lambda s, loss: loss * math.nan if s == 6 else loss)
    assert exit_info.value.code == WorkerExit.NUMERICS_STOP
    assert guard.last_step == 8  # window 4..7 read at step 8
    assert read_findings(tmp_path)[0][1] == 6


def test_a_skip_policy_needs_every_step_checked_at_once(tmp_path):
    from trainguard.errors import ConfigError

    with pytest.raises(ConfigError, match="skip"):
        Guard(None, None, on_nan="skip", check_every=8)
    with pytest.raises(ConfigError, match="check_lag"):
        Guard(None, None, check_lag=2)
    guard = Guard(None, None, on_spike="skip")  # the default under skip: exact
    assert (guard.check_every, guard.check_lag) == (1, 0)


@pytest.mark.gpu
def test_a_cuda_loss_is_checked_without_a_device_sync_between_windows(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    model = torch.nn.Linear(64, 1).cuda()
    with Guard(None, None, run_dir=tmp_path, watchdog=False) as guard:
        assert guard.check_every == 1  # until the first loss shows where training runs
        for step in range(40):
            loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
            loss.backward()
            if step == 9:
                torch.cuda.set_sync_debug_mode("error")  # any synchronising call now raises
            try:
                assert guard.step(step, loss) == "proceed"
            finally:
                if step == 30:
                    torch.cuda.set_sync_debug_mode("default")
            guard.end_step(step)
        assert (guard.check_every, guard.check_lag) == (8, 1)
        assert guard.last_checked is not None and guard.last_checked >= 32
        assert guard.last_loss is not None and math.isfinite(guard.last_loss)


@pytest.mark.slow
def test_ddp_ranks_agree_on_a_nan_of_one_rank_and_roll_back_at_the_same_step(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "chaos.json").write_text(json.dumps({"faults": [{"kind": "nan", "rank": 1, "step": 13}]}))
    env = {k: v for k, v in os.environ.items() if k != rundir.RUN_DIR_ENV}
    env["OMP_NUM_THREADS"] = "1"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    args = ["--run-dir", str(run), "--ckpt-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "5"]
    args += ["--steps", "30", "--hang-floor", "30"]  # a stuck collective would leave a stack dump
    proc = subprocess.run(
        [*torchrun, str(WORKER), *args], capture_output=True, text=True, timeout=180, env=env
    )
    dumps = [p.read_text()[-2000:] for p in rundir.dumps_dir(run).glob("*.txt")]
    assert proc.returncode == 0, (proc.stderr[-3000:], dumps)
    by_rank = {r: [(s, f.rule, f.reason) for rank, s, f in read_findings(run) if rank == r] for r in (0, 1)}
    # Windows of 8 steps, read one step late; the checkpoint boundary after step 14 checks the
    # partial window 8..14 first: both ranks see the NaN of rank 1's step 13 and roll back there.
    assert by_rank[0] == by_rank[1]
    assert [(s, rule) for s, rule, _ in by_rank[0]] == [
        (13, "numerics.nonfinite_loss"),
        (14, "numerics.rollback"),
        (13, "numerics.transient"),
    ]
    assert "to the checkpoint of step 10" in by_rank[0][1][2]
    assert by_rank[0][0][2].endswith("from rank 1")  # whose own loss it was, on every rank
    nan_beats = {
        b.rank
        for r in (0, 1)
        for b in read_heartbeats(rundir.heartbeat_path(run, r))
        if b.phase == "train" and b.loss is not None and b.loss != b.loss
    }
    assert nan_beats == {1}  # only the rank that produced the NaN reports it in its step heartbeats
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][:1]
    assert json.loads(line)["steps_run"] == [*range(15), *range(10, 30)]


def test_a_lazy_check_never_claims_to_skip_an_update_already_applied(tmp_path, caplog):
    state = State()
    with Guard(
        MemoryCheckpointer(), state, run_dir=tmp_path, check_every=4, check_lag=1, watchdog=False
    ) as g:
        # losses near 1, step 74's 1000 times that (the gradients are the model's own); spike
        # verdicts start after ~50 losses
        level = lambda s: 1000.0 if s == 74 else 1.0 + 0.01 * (s % 5)  # noqa: E731
        trace = _train(g, state, 0, 80, lambda s, loss: loss - loss.detach() + level(s))
    # no checkpoint to roll back to, and step 74's (finite) update was applied before its window
    # was read: the spike is reported, training goes on
    assert all(a == "proceed" for _, a in trace)
    assert [(s, f.rule) for _, s, f in read_findings(tmp_path)] == [(74, "numerics.loss_spike")]
    assert "cannot skip an update applied 2 step(s) ago" in caplog.text


def test_a_nan_update_that_cannot_be_undone_stops_the_run(tmp_path, caplog):
    state, seen = State(), []
    # Nothing to roll back to and the update is in the weights: every later step is wasted.
    with (
        pytest.raises(SystemExit) as stopped,
        Guard(None, state, run_dir=tmp_path, check_every=4, check_lag=1, watchdog=False) as g,
    ):
        _train(g, state, 0, 12, lambda s, loss: seen.append(s) or (loss * math.nan if s == 2 else loss))
    assert stopped.value.code == WorkerExit.NUMERICS_STOP
    assert seen == [0, 1, 2, 3, 4]  # the window 0..3 is read at step 4: no update after it
    assert [(s, f.rule) for _, s, f in read_findings(tmp_path)] == [
        (2, "numerics.nonfinite_loss"),
        (2, "numerics.unrecoverable"),
    ]
    reason = read_findings(tmp_path)[1][2].reason
    assert "step 2" in reason and "no checkpoint to roll back to" in reason and reason.endswith("from rank 0")
    assert read_last_heartbeat(rundir.heartbeat_path(tmp_path, 0)).phase == "exit"
