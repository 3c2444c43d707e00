"""Checkpointer and TrainState in one process: round trips, corruption, errors, retention."""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from trainguard.checkpoint import list_checkpoints, verify
from trainguard.errors import CheckpointError
from trainguard.torch import Checkpointer, ResumableSampler, TrainState


class Counter:
    """A user object that checkpoints through state_dict()/load_state_dict()."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, sd: dict) -> None:
        self.seen = sd["seen"]


def make_state(seed: int = 0, width: int = 16) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 2)
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    sampler = ResumableSampler(range(40), num_replicas=1, rank=0, shuffle=True, seed=3)
    return TrainState(
        model, opt, sched, scaler=scaler, sampler=sampler, extra={"tokens": 0, "counter": Counter()}
    )


def train(state: TrainState, steps: int) -> None:
    for _ in range(steps):
        state.model(torch.randn(4, 8)).square().mean().backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.scheduler.step()
        state.extra["tokens"] = int(state.extra["tokens"]) + 32
        state.extra["counter"].seen += 1


def snapshot(state: TrainState) -> dict:
    return {
        "model": {k: v.clone() for k, v in state.model.state_dict().items()},
        "adam": [s["exp_avg_sq"].clone() for s in state.optimizer.state.values()],
        "lr": state.optimizer.param_groups[0]["lr"],
        "sched": state.scheduler.last_epoch,
        "scale": state.scaler.get_scale(),
        "tokens": state.extra["tokens"],
        "counter": state.extra["counter"].seen,
        "sampler": state.sampler.state_dict(),
    }


def assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(x, y) for x, y in zip(a["adam"], b["adam"], strict=True))
    assert (a["lr"], a["sched"], a["scale"], a["tokens"], a["sampler"]) == (
        b["lr"],
        b["sched"],
        b["scale"],
        b["tokens"],
        b["sampler"],
    )


# async: a writer process starts (seconds): in make test-all
@pytest.mark.parametrize("async_save", [pytest.param(True, marks=pytest.mark.slow), False])
def test_resume_restores_model_optimizer_scheduler_scaler_rng_and_extra(tmp_path, async_save):
    state = make_state()
    list(itertools.islice(state.sampler, 5))  # consume 5 samples of epoch 0
    train(state, 3)
    state.scaler.scale(torch.ones(()))
    state.scaler.update(512.0)
    with Checkpointer(tmp_path, async_save=async_save) as ckpt:
        assert ckpt.resume(state) == 0
        ckpt.save(3, state)
        expected = snapshot(state)
        rng_next = (random.random(), np.random.rand(), torch.rand(2))
    train(state, 2)  # diverge, then come back

    fresh = make_state(seed=1)
    ckpt = Checkpointer(tmp_path, async_save=async_save)
    assert ckpt.resume(fresh) == 3
    assert ckpt.latest_step == 3
    assert_same(snapshot(fresh), expected)
    assert fresh.sampler.state_dict()["offset"] == 5
    assert (random.random(), np.random.rand()) == rng_next[:2]
    assert torch.equal(torch.rand(2), rng_next[2])
    ckpt.close()


def test_checkpoint_file_loads_with_plain_torch_load(tmp_path):
    state = make_state()
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        ckpt.save(1, state)
    payload = torch.load(tmp_path / "step-00000001" / "state.pt", weights_only=True)
    assert payload["trainguard"]["step"] == 1
    model_sd = state.model.state_dict()
    assert all(torch.equal(payload["model"][k], v) for k, v in model_sd.items())
    assert payload["extra"] == {"tokens": 0, "counter": {"seen": 0}}


@pytest.mark.parametrize("damage", ["truncate", "flip", "torn"])
def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, damage, caplog):
    state = make_state()
    with Checkpointer(tmp_path, keep_last=5, async_save=False) as ckpt:
        ckpt.save(1, state)
        expected = snapshot(state)
        train(state, 1)
        ckpt.save(2, state)
    newest = tmp_path / "step-00000002"
    data = (newest / "state.pt").read_bytes()
    if damage == "truncate":
        (newest / "state.pt").write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        flipped = bytearray(data)
        flipped[random.Random(0).randrange(len(data))] ^= 0x10
        (newest / "state.pt").write_bytes(bytes(flipped))
    else:  # a save killed before its manifest was written
        (newest / "manifest.json").unlink()
    fresh = make_state(seed=1)
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        assert ckpt.resume(fresh) == 1
    assert_same(snapshot(fresh), expected)
    assert "skipping invalid checkpoint" in caplog.text


def test_resume_with_no_valid_checkpoint_starts_at_zero(tmp_path):
    state = make_state()
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        ckpt.save(4, state)
    (tmp_path / "step-00000004" / "state.pt").write_bytes(b"")
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        assert ckpt.resume(make_state()) == 0


def test_background_write_error_surfaces_at_wait(tmp_path):
    blocker = tmp_path / "ckpt"
    blocker.write_text("a file where the checkpoint directory should be")
    ckpt = Checkpointer(blocker)
    ckpt.save(1, make_state())  # returns: the failure happens in the writer process
    with pytest.raises(CheckpointError, match="background save of step 1 failed"):
        ckpt.wait()
    ckpt.close()


def test_background_write_error_surfaces_at_next_save(tmp_path):
    blocker = tmp_path / "ckpt"
    blocker.write_text("not a directory")
    ckpt = Checkpointer(blocker)
    state = make_state()
    ckpt.save(1, state)
    with pytest.raises(CheckpointError, match="step 1"):
        ckpt.save(2, state)
    ckpt.close()


@pytest.mark.slow
def test_writer_process_death_is_an_error_not_a_silent_loss(tmp_path):
    state = TrainState(torch.nn.Linear(2048, 4096))  # 32 MiB: the kill lands mid-write
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state)
    ckpt.wait()
    ckpt.save(2, state)
    ckpt._writer._proc.kill()
    with pytest.raises(CheckpointError, match="writer process died"):
        ckpt.wait()
    ckpt.save(3, state)  # a new writer is started
    ckpt.close()
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 3]
    assert all(verify(c.path).ok for c in list_checkpoints(tmp_path))


def test_writer_survives_the_preemption_signal_sent_to_the_whole_process_group(tmp_path):
    import os
    import signal

    state = TrainState(torch.nn.Linear(2048, 4096))  # 32 MiB: the signal lands mid-write
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state)
    ckpt.wait()
    ckpt.save(2, state)
    os.kill(ckpt._writer._proc.pid, signal.SIGTERM)  # what torchrun forwards to the group
    os.kill(ckpt._writer._proc.pid, signal.SIGINT)
    ckpt.wait()  # the save still completes
    ckpt.close()
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 2]
    assert all(verify(c.path).ok for c in list_checkpoints(tmp_path))


def test_staging_buffers_are_reused_and_reallocated_when_shapes_change(tmp_path):
    state = make_state(width=16)
    train(state, 1)
    ckpt = Checkpointer(tmp_path, keep_last=10)
    ckpt.save(1, state)
    first = ckpt._staging
    train(state, 1)
    ckpt.save(2, state)
    assert ckpt._staging is first  # same shapes: same buffer
    bigger = make_state(width=32)
    train(bigger, 1)
    ckpt.save(3, bigger)
    assert ckpt._staging is not first
    expected = snapshot(bigger)
    ckpt.close()
    fresh = make_state(width=32, seed=5)
    with Checkpointer(tmp_path, async_save=False) as again:
        assert again.resume(fresh) == 3
    assert_same(snapshot(fresh), expected)


def test_retention_keeps_last_k_and_milestones_and_saves_are_timed(tmp_path):
    state = make_state()
    with Checkpointer(tmp_path, keep_last=2, milestone_every=4) as ckpt:
        for step in range(1, 10):
            train(state, 1)
            ckpt.save(step, state)
            assert ckpt.last_stall_s is not None
    assert [c.step for c in list_checkpoints(tmp_path)] == [4, 8, 9]
    assert ckpt.last_result is not None and ckpt.last_result["step"] == 9
    assert (tmp_path / "latest").read_text().strip() == "step-00000009"


def test_rollback_waits_for_the_in_flight_save_and_restores_it(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path)
    train(state, 2)
    ckpt.save(2, state)
    expected = snapshot(state)
    train(state, 3)
    assert ckpt.rollback(state) == 2
    assert_same(snapshot(state), expected)
    ckpt.close()


def test_latest_step_reports_a_finished_background_save(tmp_path):
    ckpt = Checkpointer(tmp_path)
    assert ckpt.latest_step is None
    ckpt.save(7, make_state())
    deadline = time.monotonic() + 30
    while ckpt.latest_step != 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ckpt.latest_step == 7
    ckpt.close()
    assert Path(tmp_path / "step-00000007" / "manifest.json").exists()


def test_the_writer_process_starts_at_resume_not_inside_the_first_save(tmp_path):
    ckpt = Checkpointer(tmp_path)
    try:
        assert ckpt.resume(TrainState(torch.nn.Linear(2, 2))) == 0
        assert ckpt._writer is not None and ckpt._writer.alive
    finally:
        ckpt.close()
