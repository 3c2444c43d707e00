"""The diagnostics against the simulated node: each injected fault fails exactly its test, on its
GPU, from what the tests measure (the simulated GPU computes for real on the CPU)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from trainguard.agent import Agent
from trainguard.clock import VirtualClock
from trainguard.diagnose import budget_for, health_hook, measure, open_target, preflight, run_diagnostics
from trainguard.diagnose.judge import ThermalTrace, judge_thermal
from trainguard.diagnose.result import Verdict
from trainguard.diagnose.sim_device import SimDevice
from trainguard.diagnose.target import Target
from trainguard.records import Health
from trainguard.telemetry.sim import DIAGNOSE_SCENARIOS, SimNode

pytest.importorskip("torch")

# Smaller than the CLI's level 2, still past the 2 s after which hot-gpu throttles.
FAST = budget_for(
    2, "sim", compute_s=0.2, pattern_max_bytes=2**20, allreduce_bytes=2**20, allreduce_iters=4, stress_s=2.6
)


def _failing(report: Any) -> set[tuple[str, int]]:
    return {(t.name, g.index) for g in report.gpus for t in g.tests if t.verdict is Verdict.FAIL}


def _scenario_node(name: str) -> SimNode:
    sim = SimNode(n_gpus=8, load=0.0)
    DIAGNOSE_SCENARIOS[name].script(sim)
    return sim


@pytest.mark.parametrize("name", sorted(set(DIAGNOSE_SCENARIOS) - {"healthy"}))
def test_each_scenario_fails_exactly_its_test_on_its_gpu(name):
    scenario = DIAGNOSE_SCENARIOS[name]
    test = scenario.fails[0][0]
    target = open_target("sim", sim=_scenario_node(name))
    try:
        report = run_diagnostics(target, 2, tests=[test], budget=FAST)
    finally:
        target.close()
    assert _failing(report) == set(scenario.fails), report.summary()
    assert report.exit_code == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DIAGNOSE_SCENARIOS))
def test_cli_level_2_on_each_scenario_fails_only_the_injected_fault(name, capsys):
    from trainguard.cli import main

    code = main(["diagnose", "--backend", "sim", "--scenario", name, "--level", "2", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    failing = {(t["name"], g["index"]) for g in out["gpus"] for t in g["tests"] if t["verdict"] == "fail"}
    assert failing == set(DIAGNOSE_SCENARIOS[name].fails)
    assert code == (0 if name == "healthy" else 2) and out["verdict"] in ("pass", "fail")


def test_wrong_products_leave_no_telemetry_symptom():
    clock = VirtualClock()
    sim = SimNode(n_gpus=8, clock=clock)
    sim.now().wrong_products(gpu=5)
    with Agent(sim, clock=clock) as agent:
        verdict = agent.tick()
    assert verdict.health is Health.OK


def test_silicon_defects_survive_a_gpu_reset():
    sim = SimNode(n_gpus=2, load=0.0)
    sim.now().wrong_products(gpu=1).reset_gpu(gpu=1)
    assert sim.state(1).defects


def test_preflight_fails_the_gpu_that_returns_wrong_products():
    sim = SimNode(n_gpus=4, load=0.0)
    sim.now().wrong_products(gpu=2)
    report = preflight([0, 1, 2, 3], backend="sim", sim=sim)
    assert [report.gpu_health(g) for g in range(4)] == [Health.OK, Health.OK, Health.FAILED, Health.OK]
    assert "GPU 2 sdc fail: 3 of 3 rounds differ" in report.summary()
    stored = json.loads(json.dumps(report.to_dict()))  # what goes into the incident
    assert stored["purpose"] == "preflight" and stored["verdict"] == "fail"


def test_health_hook_has_the_supervisors_signature_and_names_a_straggler():
    sim = SimNode(n_gpus=4, load=0.0)
    sim.now().straggler(gpu=1)
    seen = []
    diagnose = health_hook(
        backend="sim",
        sim=sim,
        peers=[0, 1, 2, 3],
        tests=("compute",),
        on_report=lambda g, r: seen.append(r),
    )
    assert diagnose(1) is Health.FAILED
    assert diagnose(3) is Health.OK
    assert "of peers" in seen[0].gpu(1).test("compute").reason


def test_a_busy_moment_on_the_host_is_not_device_time(monkeypatch):
    # Beside two CPU hogs and two test runs, the straggler above (half clock) once measured as a
    # warning, not a failure: a product's CPU time grows while other processes share the host's
    # caches, and its peers had been measured in such a moment.
    import torch

    from trainguard.diagnose import sim_device

    sim = SimNode(n_gpus=3, load=0.0)
    sim.now().straggler(gpu=1)
    target = open_target("sim", sim=sim)
    cpu = [0.0]  # the thread's CPU clock

    class Operand:  # a product of these takes ``each`` s of CPU time
        shape, dtype = (8, 8), torch.float32

        def __init__(self, each: float) -> None:
            self.each = each

        def __matmul__(self, other: Any) -> torch.Tensor:
            cpu[0] += self.each
            return torch.ones(8, 8)

    def three_products(dev: Any, each: float) -> float:
        monkeypatch.setattr(sim_device.time, "thread_time", lambda: cpu[0])
        with dev.busy():
            start = dev.clock()
            for _ in range(3):
                dev.matmul(Operand(each), Operand(each))
            took = dev.clock() - start
        monkeypatch.undo()
        return took

    try:
        quiet, straggler, busy = (three_products(target.devices[g], s) for g, s in ((0, 1), (1, 20), (2, 20)))
    finally:
        target.close()
    # Each product at the least cost on the host, at the GPU's clock (a healthy one's dithers a few
    # bins below its max under load).
    assert quiet == pytest.approx(3.0, rel=0.1) and busy == pytest.approx(3.0, rel=0.1)
    assert straggler == pytest.approx(6.0, rel=0.1)


def test_a_busy_moment_on_the_host_does_not_slow_one_gpus_writes(monkeypatch):
    # `diagnose --scenario healthy --level 2` once warned in CI (exit 1): a simulated GPU's copy
    # bandwidth was the host's CPU time for its writes, which a host busy elsewhere stretches for
    # the GPUs measured in that moment. Writes are priced like products: the least a write of that
    # size and kind took on the host.
    import torch

    from trainguard.diagnose import sim_device
    from trainguard.diagnose.torch_device import TorchDevice

    target = open_target("sim", sim=SimNode(n_gpus=2, load=0.0))
    cpu, cost = [0.0], {0: 1.0, 1: 20.0}  # GPU 1's writes made while the host was busy

    def write(self: Any, dst: Any, src: Any) -> None:
        cpu[0] += cost[self.index]

    monkeypatch.setattr(TorchDevice, "write", write)
    monkeypatch.setattr(sim_device.time, "thread_time", lambda: cpu[0])
    took = {}
    try:
        for dev in target.devices:
            start = dev.clock()
            for _ in range(3):
                dev.write(torch.empty(4), torch.ones(4))
                dev.write(torch.empty(4), 0.5)
            took[dev.index] = dev.clock() - start
    finally:
        monkeypatch.undo()
        target.close()
    assert took == {0: pytest.approx(6.0), 1: pytest.approx(6.0)}


def test_a_slow_product_that_starts_midway_is_not_hidden_by_the_fast_ones_before():
    import torch

    sim = SimNode(n_gpus=1, load=0.0)
    dev = SimDevice(sim, 0)
    a = torch.randn(256, 256)

    def least() -> float:
        # busy(), as the diagnostics: the product in the one thread whose CPU time is counted (with
        # torch's thread pool the caller's time is its wait for the others: 10 x one product's
        # work, beside two CPU hogs and three test runs)
        with dev.busy():
            times = []
            for _ in range(10):
                start = dev.clock()
                dev.matmul(a, a)
                times.append(dev.clock() - start)
        return min(times)

    before = least()
    sim.now().slow_products(gpu=0, fraction=0.25)
    after = least()
    assert after > 2 * before  # four products' work each, really done


class _Wedged(SimDevice):
    """A GPU whose matrix products never return (a wedged device)."""

    release = threading.Event()

    def matmul(self, a: Any, b: Any) -> Any:
        self.release.wait()
        raise RuntimeError("released")


@pytest.mark.slow
def test_a_wedged_gpu_fails_its_test_and_the_run_goes_on():
    sim = SimNode(n_gpus=3, load=0.0)
    target = open_target("sim", sim=sim)
    target.devices[1] = _Wedged(sim, 1)
    # The wedged GPU is given up on after the whole timeout, however long: 15 s is a ceiling for the
    # healthy GPUs' tests on a loaded host (1 s once failed GPU 2's, 0.2 s of work, beside two hogs).
    budget = budget_for(2, "sim", compute_s=0.2, timeout_s=15.0, pattern_max_bytes=2**20)
    try:
        report = run_diagnostics(target, 2, tests=["compute", "sdc", "memory_pattern"], budget=budget)
    finally:
        _Wedged.release.set()  # let the abandoned thread finish: no thread outlives the test
        target.close()
    gpu1 = report.gpu(1)
    assert gpu1 is not None
    assert gpu1.test("compute").verdict is Verdict.FAIL and "did not finish" in gpu1.test("compute").reason
    assert gpu1.test("sdc").verdict is Verdict.SKIP and "wedged" in gpu1.test("sdc").reason
    assert report.gpu(0).verdict is Verdict.PASS and report.gpu(2).verdict is Verdict.PASS
    assert report.extra["wedged"] == {1: "compute did not finish"}


@pytest.mark.parametrize(
    ("model", "healthy_gbps"), [("NVIDIA H100 80GB HBM3", 360.0), ("NVIDIA A100 80GB PCIe", 25.2032)]
)
def test_a_simulated_link_runs_at_its_models_rate_and_a_slow_link_at_its_share(model, healthy_gbps):
    from trainguard.diagnose.interconnect import measure_interconnect

    sim = SimNode(n_gpus=3, load=0.0, model=model)
    sim.now().slow_link(gpu=2, fraction=0.25)
    target = open_target("sim", sim=sim)
    try:
        per_gpu, ring = measure_interconnect(target.devices, 2**16, 2, timeout_s=30.0)
    finally:
        target.close()
    # Pairs 0-1 run at the healthy rate; every pair with GPU 2 waits for its link, as does the ring.
    assert per_gpu == pytest.approx({0: healthy_gbps, 1: healthy_gbps, 2: healthy_gbps / 4}, rel=1e-9)
    assert ring == pytest.approx(healthy_gbps / 4, rel=1e-9)


def test_a_hung_collective_fails_interconnect_within_the_watchdog(monkeypatch):
    sim = SimNode(n_gpus=2, load=0.0)
    target = open_target("sim", sim=sim)
    release = threading.Event()
    monkeypatch.setattr(
        target.devices[1], "link_seconds", lambda nbytes, ranks, wall: release.wait(5) or wall
    )
    budget = budget_for(2, "sim", allreduce_bytes=2**16, allreduce_iters=2, timeout_s=1.0)
    try:
        report = run_diagnostics(target, 2, tests=["interconnect"], budget=budget)
    finally:
        release.set()
        target.close()
    for g in (0, 1):
        t = report.gpu(g).test("interconnect")
        assert t.verdict is Verdict.FAIL and "hung collective" in t.reason


def test_the_cpu_device_passes_level_2_on_this_machine():
    target = open_target("cpu")
    budget = budget_for(2, "cpu", compute_s=0.15, bandwidth_s=0.15, sdc_rounds=5, pattern_max_bytes=2**20)
    try:
        report = run_diagnostics(target, 2, budget=budget)
    finally:
        target.close()
    ran = {t.name: t.verdict for t in report.gpus[0].tests if t.verdict is not Verdict.SKIP}
    assert ran == dict.fromkeys(("compute", "sdc", "memory_bandwidth", "memory_pattern"), Verdict.PASS)
    assert report.exit_code == 0


def test_a_target_with_the_wrong_gpu_index_is_a_config_error():
    from trainguard.errors import ConfigError

    with pytest.raises(ConfigError, match="no GPU 9"):
        open_target("sim", [0, 9], n_sim=4)


def test_level_1_on_the_simulated_node_passes():
    target: Target = open_target("sim", n_sim=2)
    try:
        report = run_diagnostics(target, 1)
    finally:
        target.close()
    assert report.exit_code == 0 and {g.index for g in report.gpus} == {0, 1}


def test_a_single_gpu_is_checked_against_the_golden_checksum_of_a_first_run():
    clean = open_target("sim", [0, 1], n_sim=2)
    try:
        golden = run_diagnostics(clean, 2, tests=["sdc"], budget=FAST).extra["sdc_golden"]
    finally:
        clean.close()
    sim = SimNode(n_gpus=2, load=0.0)
    sim.now().wrong_products(gpu=1)
    alone = open_target("sim", [1], sim=sim)
    try:
        alone_without = run_diagnostics(alone, 2, tests=["sdc"], budget=FAST)
        alone_with = run_diagnostics(alone, 2, tests=["sdc"], budget=FAST, golden=golden)
    finally:
        alone.close()
    # A defect errs the same way on the same operands, so alone a GPU agrees with itself round
    # after round: only the golden checksum (or peers) can tell it is wrong.
    assert alone_with.gpu(1).test("sdc").verdict is Verdict.FAIL
    assert "golden checksum of the first run" in alone_with.gpu(1).test("sdc").reason
    assert alone_without.gpu(1).test("sdc").verdict is Verdict.PASS


class _LateDevice(SimDevice):
    """A simulated GPU whose load thread is scheduled late, as on a busy host."""

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        time.sleep(0.5)
        with super().busy():
            yield


def test_a_device_loaded_late_still_gets_the_whole_stress_and_a_reading_at_its_end():
    # GPU 1 throttles after 0.6 s of load; the stress lasts 0.7 s. Its load thread starts 0.5 s
    # late: counted from before the threads start, it would be read after 0.2 s of load at most.
    sim = SimNode(n_gpus=2, load=0.0)
    sim.now().hot_under_load(gpu=1, after_s=0.6)
    devices = [SimDevice(sim, 0), _LateDevice(sim, 1)]
    traces = measure.stress_all(devices, 64, seconds=0.7, every_s=0.05)
    for trace in traces.values():
        assert trace[-1][0] >= 0.7  # the last reading comes after the whole stress
    verdicts = {g: judge_thermal(ThermalTrace(tuple(t))).verdict for g, t in traces.items()}
    assert verdicts == {0: Verdict.PASS, 1: Verdict.FAIL}


def test_a_defect_at_the_demos_realistic_rate_fails_every_preflight_and_a_far_rarer_one_passes():
    # A defective unit errs on a small share of its operations, reproducibly (the same operands,
    # the same wrong elements): the pre-flight's fixed SDC workload sees the demo's 1-in-10,000
    # defect every time, and cannot see one a thousand times rarer (its 131,072 results a round).
    from trainguard.demo.plan import SDC_RATE

    assert SDC_RATE <= 1e-4
    for _ in range(2):
        sim = SimNode(n_gpus=4, load=0.0)
        sim.now().wrong_products(gpu=2, rate=SDC_RATE)
        report = preflight([0, 1, 2, 3], backend="sim", sim=sim)
        assert [report.gpu_health(g) for g in range(4)] == [Health.OK, Health.OK, Health.FAILED, Health.OK]
        assert "GPU 2 sdc fail: 3 of 3 rounds differ" in report.summary()
    sim = SimNode(n_gpus=4, load=0.0)
    sim.now().wrong_products(gpu=2, rate=SDC_RATE / 1000)
    report = preflight([0, 1, 2, 3], backend="sim", sim=sim)
    assert [report.gpu_health(g) for g in range(4)] == [Health.OK] * 4


def test_wrong_products_err_on_the_same_elements_for_the_same_operands():
    import torch

    from trainguard.diagnose.sim_device import SimDevice

    sim = SimNode(n_gpus=2, load=0.0)
    sim.now().wrong_products(gpu=1, rate=0.01)
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    first, again = SimDevice(sim, 1).matmul(a, b), SimDevice(sim, 1).matmul(a, b)
    wrong = (first != a @ b).sum().item()
    assert torch.equal(first, again) and 0 < wrong < 0.05 * first.numel()
