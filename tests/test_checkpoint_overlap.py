"""Overlapped snapshots: parameters and optimizer state are copied alongside the next step, and the
checkpoint still holds exactly the state of the step it was saved at."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trainguard.errors import CheckpointError
from trainguard.torch import Checkpointer, TrainState, snapshot
from trainguard.torch.staging import Staging


def make_state() -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 2))
    return TrainState(model, torch.optim.Adam(model.parameters(), lr=0.1))


def step(state: TrainState) -> None:
    state.model(torch.randn(16, 8)).square().mean().backward()  # updates BatchNorm's running stats
    state.optimizer.step()
    state.optimizer.zero_grad()


def saved_state(state: TrainState) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    return (
        {k: v.clone() for k, v in state.model.state_dict().items()},
        [t.clone() for s in state.optimizer.state.values() for t in s.values()],
    )


@pytest.fixture
def slow_copy(monkeypatch):
    """The deferred copy starts only after 0.3 s: an update it does not wait for would win the race."""
    copy = snapshot.copy_pairs
    deferred_threads: list[str] = []

    def slow(pairs, non_blocking=False):
        if threading.current_thread().name == "trainguard-snapshot":
            deferred_threads.append("copied")
            time.sleep(0.3)
        copy(pairs, non_blocking)

    monkeypatch.setattr(snapshot, "copy_pairs", slow)
    return deferred_threads


def test_the_next_optimizer_step_waits_for_the_snapshot_so_the_checkpoint_holds_the_saved_step(
    tmp_path, slow_copy
):
    state = make_state()
    step(state)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.resume(state)
        ckpt.save(1, state)
        expected = saved_state(state)
        step(state)  # forward changes BatchNorm's buffers at once, the update waits for the copy
        assert slow_copy == ["copied"], "the parameters were not copied alongside the step"
        moved = saved_state(state)
    fresh = make_state()
    assert Checkpointer(tmp_path, async_save=False).resume(fresh) == 1
    model, moments = saved_state(fresh)
    assert all(torch.equal(model[k], expected[0][k]) for k in model)
    assert all(torch.equal(a, b) for a, b in zip(moments, expected[1], strict=True))
    assert not torch.equal(moved[0]["1.running_mean"], expected[0]["1.running_mean"])
    assert not torch.equal(moved[0]["0.weight"], expected[0]["0.weight"])


def test_wait_completes_a_snapshot_when_no_optimizer_step_follows(tmp_path, slow_copy):
    state = make_state()
    step(state)
    ckpt = Checkpointer(tmp_path)
    ckpt.resume(state)
    ckpt.save(1, state)
    expected = saved_state(state)
    ckpt.wait()
    assert ckpt.latest_step == 1
    ckpt.close()
    fresh = make_state()
    Checkpointer(tmp_path, async_save=False).resume(fresh)
    assert all(torch.equal(a, b) for a, b in zip(saved_state(fresh)[1], expected[1], strict=True))


def test_without_overlap_everything_is_copied_inside_save(tmp_path, slow_copy):
    state = make_state()
    step(state)
    with Checkpointer(tmp_path, overlap=False) as ckpt:
        ckpt.resume(state)
        ckpt.save(1, state)
        step(state)
    assert slow_copy == []


def test_a_failed_snapshot_copy_surfaces_at_the_next_save_and_writes_nothing(tmp_path, monkeypatch):
    state = make_state()
    step(state)
    copy = snapshot.copy_pairs

    def broken(pairs, non_blocking=False):
        if threading.current_thread().name == "trainguard-snapshot":
            raise RuntimeError("simulated copy failure")
        copy(pairs, non_blocking)

    ckpt = Checkpointer(tmp_path)
    ckpt.resume(state)
    monkeypatch.setattr(snapshot, "copy_pairs", broken)
    ckpt.save(1, state)
    step(state)  # the optimizer step must not die of it
    monkeypatch.setattr(snapshot, "copy_pairs", copy)
    with pytest.raises(CheckpointError, match="simulated copy failure"):
        ckpt.save(2, state)
    ckpt.save(3, state)
    ckpt.close()
    assert [p.name for p in sorted(tmp_path.glob("step-*"))] == ["step-00000003"]


def test_only_tensors_the_optimizer_owns_are_deferred():
    state = make_state()
    step(state)
    owned = snapshot.optimizer_tensors(state.optimizer)
    sd = state.model.state_dict()
    assert sd["0.weight"].data_ptr() in owned
    assert sd["1.running_mean"].data_ptr() not in owned  # forward writes it: copied at once
    staging = Staging(list(sd.values()))
    try:
        pending = staging.copy_from(list(sd.values()), owned)
        assert pending is not None
        pending.join()
        assert all(torch.equal(v, s) for v, s in zip(staging.views, sd.values(), strict=True))
    finally:
        staging.close()


def test_a_parameter_changed_in_place_during_the_copy_fails_the_save_instead_of_tearing_it(
    tmp_path, slow_copy
):
    state = make_state()
    step(state)
    ckpt = Checkpointer(tmp_path)
    ckpt.resume(state)
    ckpt.save(1, state)
    with torch.no_grad():
        state.model[0].weight.mul_(2.0)  # outside optimizer.step(), while the copy runs
    with pytest.raises(CheckpointError, match="changed in place outside optimizer"):
        ckpt.wait()
    ckpt.close()
    assert list(tmp_path.glob("step-*")) == []


def test_the_write_starts_when_the_snapshot_is_copied_without_waiting_for_the_next_optimizer_step(
    tmp_path,
):
    state = make_state()
    step(state)
    ckpt = Checkpointer(tmp_path)
    ckpt.resume(state)
    ckpt.save(1, state)
    # no optimizer.step(), no wait(): only the copy thread can have handed the save over
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("step-*/manifest.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.parent.name for p in tmp_path.glob("step-*/manifest.json")] == ["step-00000001"]
    ckpt.close()
    assert ckpt.latest_step == 1
