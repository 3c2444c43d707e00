"""Fail-slow simulated GPUs: telemetry shows the throttle, and the rank on the GPU really computes
slower (its forward and backward take 1 / speed as long)."""

from __future__ import annotations

import json

import pytest
import torch

from trainguard.clock import VirtualClock
from trainguard.records import Health, Throttle
from trainguard.supervisor.health import NodeHealth
from trainguard.telemetry.sim import SimNode, run_scenario
from trainguard.telemetry.sim.speed import SPEEDS_FILE, gpu_speeds, read_speed
from trainguard.torch.sim_gpu import SimGpu, from_file


def test_uneven_gpus_show_their_throttle_and_run_at_half_and_three_quarters():
    sim = SimNode(n_gpus=4, clock=VirtualClock())
    run_scenario("uneven-gpus", sim)
    samples = sim.sample()
    assert samples[1].throttle == {Throttle.SW_POWER_CAP}
    assert samples[2].throttle == {Throttle.SW_THERMAL}
    assert samples[1].sm_clock_mhz == pytest.approx(0.5 * samples[1].sm_clock_max_mhz, rel=0.02)
    assert gpu_speeds(sim) == {0: 1.0, 1: 0.5, 2: 0.75, 3: 1.0}


def test_a_gpu_slows_mid_run_and_recovers():
    clock = VirtualClock()
    sim = SimNode(n_gpus=4, clock=clock)
    run_scenario("slow-then-recover", sim, step_s=1.0)  # ends at t=30, after the recovery
    assert gpu_speeds(sim)[2] == 1.0 and sim.sample()[2].throttle == frozenset()
    sim = SimNode(n_gpus=4, clock=clock)
    sim.now().throttled(gpu=2, fraction=0.5, duration_s=20)
    clock.advance(10)
    assert gpu_speeds(sim)[2] == 0.5
    clock.advance(11)
    assert gpu_speeds(sim)[2] == 1.0


def test_clocks_stuck_low_and_slow_products_with_normal_clocks_both_slow_the_gpu():
    sim = SimNode(n_gpus=3, clock=VirtualClock())
    sim.now().straggler(gpu=0).slow_products(gpu=1, fraction=0.4)
    speeds = gpu_speeds(sim)
    assert speeds[0] == pytest.approx(0.5, abs=0.01) and speeds[1] == 0.4 and speeds[2] == 1.0
    assert sim.sample()[1].throttle == frozenset()  # nothing in telemetry shows the slow products


def test_a_lost_gpu_has_no_speed():
    sim = SimNode(n_gpus=2, clock=VirtualClock())
    sim.now().xid(79, gpu=1)
    assert gpu_speeds(sim) == {0: 1.0}


def test_the_supervisor_publishes_its_simulated_gpus_speeds_to_the_ranks(tmp_path):
    health = NodeHealth("sim", 4, tmp_path, interval=0.0)
    try:
        path = tmp_path / SPEEDS_FILE
        assert json.loads(path.read_text()) == {"gpus": {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0}}
        health.sim.now().throttled(gpu=3, fraction=0.5)
        verdict = health.tick(force=True)
        assert verdict is not None and verdict.health is Health.OK  # a software limit: no rule fires
        assert read_speed(path, 3) == 0.5 and read_speed(path, 0) == 1.0
        assert read_speed(path, 7) is None and read_speed(tmp_path / "missing.json", 0) is None
    finally:
        health.close()


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_rank_on_a_slow_gpu_sleeps_its_extra_compute_inside_the_forward():
    clock, naps = _Clock(), []
    speed = [0.5]
    gpu = SimGpu(lambda: speed[0], sleep=naps.append, clock=clock)
    model = torch.nn.Linear(4, 2)

    def forward_takes(seconds: float) -> None:
        def hook(module, args, output):
            clock.t += seconds

        h = model.register_forward_hook(hook)  # runs before the SimGpu's own (registered later)
        gpu.attach(model)
        model(torch.ones(3, 4)).sum().backward()
        h.remove()
        gpu.close()

    forward_takes(0.01)
    assert naps == [pytest.approx(0.03)]  # forward + backward (3x the forward) at half speed
    speed[0] = 1.0
    forward_takes(0.01)
    assert naps == [pytest.approx(0.03)]  # full speed: nothing added
    speed[0] = 0.75
    with torch.no_grad():  # evaluation is not slowed down by the simulation's bookkeeping
        gpu.attach(model)
        model(torch.ones(3, 4))
        gpu.close()
    assert len(naps) == 1


def test_the_rank_rereads_its_gpus_speed_as_it_changes(tmp_path):
    path = tmp_path / SPEEDS_FILE
    path.write_text(json.dumps({"gpus": {"2": 0.5}}))
    now = [0.0]
    speed = from_file(path, 2, clock=lambda: now[0])
    assert speed() == 0.5
    path.write_text(json.dumps({"gpus": {"2": 1.0}}))
    assert speed() == 0.5  # read at most every REFRESH_S
    now[0] = 1.0
    assert speed() == 1.0
