"""The agent's tick: telemetry and kernel log in, one node verdict out, never an exception."""

from __future__ import annotations

from pathlib import Path

from trainguard.actions import Advice
from trainguard.agent import Agent
from trainguard.clock import VirtualClock
from trainguard.records import Gpu, Health, Sample
from trainguard.telemetry.sim import SimNode, write_xid_line


def sim(tmp_path: Path, n_gpus: int = 8) -> tuple[SimNode, VirtualClock, Path]:
    clock, kmsg = VirtualClock(), tmp_path / "kmsg.log"
    return SimNode(n_gpus=n_gpus, seed=1, clock=clock, kmsg_path=kmsg), clock, kmsg


def test_healthy_node_is_ok_with_one_verdict_per_gpu(tmp_path):
    fleet, clock, kmsg = sim(tmp_path)
    agent = Agent(fleet, kernel_log=kmsg, clock=clock)
    v = agent.tick()
    assert v.health is Health.OK and len(v.gpus) == 8 and len(agent.samples) == 8
    assert [g.gpu for g in v.gpus] == fleet.gpus()


def test_xid_79_fails_the_gpu_from_both_telemetry_and_kernel_log(tmp_path):
    fleet, clock, kmsg = sim(tmp_path)
    agent = Agent(fleet, kernel_log=kmsg, clock=clock)
    agent.tick()
    fleet.at(5).xid(79, gpu=3)
    clock.advance(6)
    v = agent.tick()
    g3 = v.gpus[3]
    assert (v.health, g3.health, g3.action) == (Health.FAILED, Health.FAILED, Advice.REBOOT_NODE)
    assert {f.rule for f in g3.findings} == {"gpu_lost", "xid"}
    assert [e.xid for e in agent.events if e.xid is not None] == [79]
    assert all(g.health is Health.OK for g in v.gpus if g.gpu.index != 3)


def test_kernel_log_alone_fails_the_gpu_its_pci_names(tmp_path):
    fleet, clock, _ = sim(tmp_path)
    log = tmp_path / "kern.log"
    log.write_text("")
    agent = Agent(fleet, kernel_log=log, clock=clock)
    agent.tick()
    write_xid_line(log, fleet.gpus()[5].pci or "", 48, "An uncorrectable double bit error (DBE)", uptime=3.0)
    clock.advance(1)
    v = agent.tick()
    assert v.gpus[5].health is Health.FAILED and "Xid 48" in v.gpus[5].reasons[0]


def test_rates_are_measured_across_ticks(tmp_path):
    fleet, clock, kmsg = sim(tmp_path)
    agent = Agent(fleet, kernel_log=kmsg, clock=clock)
    agent.tick()
    fleet.now().pcie_replay_storm(gpu=2)
    clock.advance(2)
    v = agent.tick()
    assert [f.rule for f in v.gpus[2].findings] == ["pcie_replay"]


def test_without_kernel_log_only_telemetry_counts(tmp_path):
    fleet, clock, _ = sim(tmp_path)
    agent = Agent(fleet, clock=clock)
    fleet.now().straggler(gpu=1)
    clock.advance(1)
    assert agent.tick().gpus[1].health is Health.DEGRADED and agent.events == []


class Broken:
    """A backend whose driver died after the first reading."""

    def __init__(self) -> None:
        self.calls = 0

    def gpus(self) -> list[Gpu]:
        return [Gpu(0), Gpu(1)]

    def sample(self) -> list[Sample]:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("driver went away")
        return [Sample(Gpu(0), 0.0, temperature_c=40.0), Sample(Gpu(1), 0.0, temperature_c=41.0)]

    def close(self) -> None:
        pass


def test_a_backend_that_raises_makes_every_gpu_unknown_not_healthy():
    agent = Agent(Broken(), clock=VirtualClock())
    assert agent.tick().health is Health.OK
    v = agent.tick()
    assert v.health is Health.UNKNOWN and [g.health for g in v.gpus] == [Health.UNKNOWN] * 2
    assert "driver went away" in v.gpus[0].reasons[0]


def test_a_backend_that_never_answered_leaves_the_node_unknown():
    b = Broken()
    b.calls = 5
    v = Agent(b, clock=VirtualClock()).tick()
    assert v.health is Health.UNKNOWN and "driver went away" in v.findings[0].reason


def test_after_a_known_gpu_reset_the_old_xids_no_longer_fail_it(tmp_path):
    fleet, clock, kmsg = sim(tmp_path)
    agent = Agent(fleet, kernel_log=kmsg, clock=clock)
    fleet.now().dbe(gpu=2)
    clock.advance(1)
    assert agent.tick().gpus[2].health is Health.FAILED
    fleet.now().reset_gpu(gpu=2)
    agent.gpu_was_reset(2)
    clock.advance(1)
    assert agent.tick().gpus[2].health is Health.OK
