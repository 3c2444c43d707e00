"""Named scenarios: the list the CLI shows, what each leaves behind, and that every kernel line the
sim writes is read back by the kernel-log parser as the right Xid on the right GPU."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from trainguard.actions import Advice
from trainguard.clock import RealClock, VirtualClock
from trainguard.errors import ConfigError
from trainguard.records import EventKind, Gpu, GpuVerdict, Health, NodeVerdict
from trainguard.telemetry.sim import SCENARIOS, SimNode, run_scenario

EXPECTED = {
    "healthy": Health.OK,
    "xid79": Health.FAILED,
    "dbe": Health.FAILED,
    "row-remap-failure": Health.FAILED,
    "uncontained-xid95": Health.FAILED,
    "xid154-reset": Health.FAILED,
    "thermal": Health.DEGRADED,
    "power-brake": Health.DEGRADED,
    "pcie-replay": Health.DEGRADED,
    "nvlink-crc": Health.DEGRADED,
    "straggler": Health.DEGRADED,
    "app-xid13": Health.DEGRADED,
}

# The Xids each scenario makes the driver print (the tour covers many).
XIDS = {
    "xid79": {79},
    "dbe": {48, 63},
    "row-remap-failure": {64},
    "uncontained-xid95": {95},
    "xid154-reset": {154},
    "app-xid13": {13, 31, 45},
    "tour": {13, 31, 45, 48, 63, 154, 95, 79},
}


def played(name: str, tmp_path) -> tuple[SimNode, list[str]]:
    kmsg = tmp_path / f"{name}.log"
    sim = SimNode(clock=VirtualClock(), kmsg_path=kmsg)
    run_scenario(name, sim)
    return sim, kmsg.read_text().splitlines()


def test_every_required_scenario_exists_with_its_documented_verdict():
    for name, health in EXPECTED.items():
        assert SCENARIOS[name].expected is health, name
    assert "tour" in SCENARIOS and SCENARIOS["tour"].duration_s >= 55
    for s in SCENARIOS.values():
        assert s.name and s.description and s.duration_s > 0


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_runs_to_its_end_and_leaves_evidence_on_the_faulty_gpus(name, tmp_path):
    sim, lines = played(name, tmp_path)
    scenario = SCENARIOS[name]
    assert sim.elapsed == scenario.duration_s
    assert sim.pending() == []
    # cumulative counters (energy, NVLink data) count the time each node has run: left out
    samples = [replace(s, energy_mj=None, nvlink_data_kib=None) for s in sim.sample()]
    fresh = SimNode(clock=VirtualClock(start=sim.clock.time())).sample()
    healthy = [replace(s, energy_mj=None, nvlink_data_kib=None) for s in fresh]
    xid_lines = [line for line in lines if "NVRM: Xid" in line]
    if name == "healthy":
        assert xid_lines == []
        assert samples == healthy
        return
    for gpu in scenario.faulty_gpus:
        changed = samples[gpu] != healthy[gpu]
        logged = any(sim.gpus()[gpu].pci in line for line in xid_lines)
        assert changed or logged, f"{name}: GPU {gpu} shows no evidence"
    untouched = set(range(8)) - set(scenario.faulty_gpus)
    assert all(samples[i] == healthy[i] for i in untouched)


def test_run_scenario_refuses_unknown_names_and_real_clocks():
    with pytest.raises(ConfigError, match="unknown scenario"):
        run_scenario("nope", SimNode(clock=VirtualClock()))
    with pytest.raises(ConfigError, match="VirtualClock"):
        run_scenario("dbe", SimNode(clock=RealClock()))
    with pytest.raises(ConfigError, match="needs 8 GPUs"):
        run_scenario("nvlink-crc", SimNode(n_gpus=4, clock=VirtualClock()))


def test_run_scenario_calls_on_step_once_per_step():
    steps: list[float] = []
    run_scenario("healthy", SimNode(clock=VirtualClock()), step_s=5, on_step=steps.append)
    assert steps == [5, 10, 15, 20, 25, 30]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_kernel_line_the_fleet_writes_parses_to_the_right_xid_and_gpu(name, tmp_path):
    kernel_log = pytest.importorskip("trainguard.detect.kernel_log")
    sim, lines = played(name, tmp_path)
    by_pci = {g.pci: g for g in sim.gpus()}
    faulty_pcis = {sim.gpus()[i].pci for i in SCENARIOS[name].faulty_gpus}
    seen: set[int] = set()
    for line in lines:
        event = kernel_log.parse_kernel_line(line)
        if "NVRM: Xid" in line:
            code, pci = re.search(r"Xid \(PCI:([0-9a-f:]+)\): (\d+),", line).group(2, 1)
            assert event is not None and event.kind is EventKind.XID, line
            assert (event.xid, event.pci) == (int(code), pci), line
            assert event.pci in faulty_pcis
            seen.add(event.xid)
        elif "NVRM: GPU at PCI:" in line:
            assert event is not None and event.kind is EventKind.GPU_MAP
            assert by_pci[event.pci].uuid == event.uuid
        elif "fallen off the bus" in line:
            assert event is not None and event.kind is EventKind.GPU_LOST and event.pci in faulty_pcis
        else:  # driver banner, crash-dump notes, AER lines: not GPU events
            assert event is None or event.kind not in (EventKind.XID, EventKind.SXID), line
    assert seen == XIDS.get(name, set())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_ends_in_its_documented_verdict_through_the_agent(name, tmp_path):
    agent_mod = pytest.importorskip("trainguard.agent")
    clock, kmsg = VirtualClock(), tmp_path / "kmsg.log"
    sim = SimNode(clock=clock, kmsg_path=kmsg)
    with agent_mod.Agent(sim, kernel_log=kmsg, clock=clock) as agent:
        agent.tick()
        run_scenario(name, sim, on_step=lambda _t: agent.tick())
        verdict = agent.tick()
    assert verdict.health is SCENARIOS[name].expected, verdict.reasons
    got = {g.gpu.index: g.health for g in verdict.gpus}
    assert got == SCENARIOS[name].expected_gpus(sim.n_gpus)  # each GPU, faulty and healthy
    assert SCENARIOS[name].mismatches(verdict) == []


def test_the_tour_expects_two_failed_and_six_degraded_gpus():
    want = SCENARIOS["tour"].expected_gpus(8)
    assert sorted(g for g, h in want.items() if h is Health.FAILED) == [4, 6]
    assert sorted(g for g, h in want.items() if h is Health.DEGRADED) == [0, 1, 2, 3, 5, 7]
    assert SCENARIOS["xid79"].expected_gpus(8) == {
        g: Health.FAILED if g == 3 else Health.OK for g in range(8)
    }


def _verdict(health: Health, gpus: dict[int, Health]) -> NodeVerdict:
    return NodeVerdict(
        health, Advice.NONE, tuple(GpuVerdict(Gpu(g), h, Advice.NONE) for g, h in gpus.items())
    )


def test_the_scenario_check_fails_a_missed_gpu_a_flagged_healthy_gpu_and_a_wrong_node_verdict():
    scenario = SCENARIOS["xid79"]
    right = scenario.expected_gpus(8)
    assert scenario.mismatches(_verdict(Health.FAILED, right)) == []
    missed = {**right, 3: Health.DEGRADED}  # judged too mildly
    assert scenario.mismatches(_verdict(Health.FAILED, missed)) == ["GPU 3 degraded, expected failed"]
    flagged = {**right, 5: Health.DEGRADED}  # a healthy GPU flagged
    assert scenario.mismatches(_verdict(Health.FAILED, flagged)) == ["GPU 5 degraded, expected ok"]
    assert scenario.mismatches(_verdict(Health.DEGRADED, right)) == ["node degraded, expected failed"]
    tour = SCENARIOS["tour"]
    assert tour.mismatches(_verdict(Health.FAILED, {**tour.expected_gpus(8), 0: Health.FAILED})) == [
        "GPU 0 failed, expected degraded"
    ]
