"""Named fault scenarios: the built-ins of ``trainguard check --scenario NAME`` and the demo.

Each scenario scripts faults on a node and states the node verdict trainguard must reach::

    >>> from trainguard.clock import VirtualClock
    >>> sim = SimNode(clock=VirtualClock())
    >>> scenario = run_scenario("xid79", sim)    # scripts it, advances the clock to its end
    >>> scenario.expected
    <Health.FAILED: 'failed'>
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard.clock import VirtualClock
from trainguard.errors import ConfigError
from trainguard.records import Health, NodeVerdict, RecoveryAction, Throttle
from trainguard.telemetry.sim.node import SimNode

__all__ = ["DIAGNOSE_SCENARIOS", "SCENARIOS", "DiagnoseScenario", "Scenario", "run_scenario"]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    expected: Health  # the node verdict at the end of the scenario
    duration_s: float
    script: Callable[[SimNode], object]
    faulty_gpus: tuple[int, ...] = ()  # GPUs the faults hit (each needs >= 8 GPUs in the node)
    per_gpu: dict[int, Health] = field(default_factory=dict)  # a faulty GPU's verdict, if not `expected`

    def expected_gpus(self, n_gpus: int) -> dict[int, Health]:
        """The verdict each GPU of an ``n_gpus`` sim must end in: a faulty GPU its own (or the
        scenario's), every other GPU ok."""
        return {
            g: self.per_gpu.get(g, self.expected) if g in self.faulty_gpus else Health.OK
            for g in range(n_gpus)
        }

    def mismatches(self, verdict: NodeVerdict) -> list[str]:
        """Where the agent's verdict differs from the expected one, in words (empty: it matches):
        the node, a faulty GPU missed or judged too mildly, a healthy GPU flagged."""
        out = (
            []
            if verdict.health is self.expected
            else [f"node {verdict.health.value}, expected {self.expected.value}"]
        )
        seen = {g.gpu.index: g.health for g in verdict.gpus}
        n_gpus = max([*seen, *self.faulty_gpus], default=-1) + 1
        for g, want in self.expected_gpus(n_gpus).items():
            if seen.get(g, Health.UNKNOWN) is not want:
                out.append(f"GPU {g} {seen.get(g, Health.UNKNOWN).value}, expected {want.value}")
        return out


def _tour(f: SimNode) -> None:
    f.at(5).app_xid_burst(gpu=2)
    f.at(10).thermal_runaway(gpu=1, rate_c_per_s=2.0)
    f.at(15).pcie_replay_storm(gpu=5).pcie_downtrain(gpu=5)
    f.at(20).straggler(gpu=3)
    f.at(25).nvlink_crc_storm(gpu=7)
    f.at(30).power_brake(gpu=0)
    f.at(38).dbe(gpu=6)
    f.at(39).recovery_action(gpu=6, action=RecoveryAction.GPU_RESET)
    f.at(45).uncontained(gpu=6)
    f.at(52).xid(79, gpu=4)


_ALL = [
    Scenario("healthy", "8 busy GPUs, nothing wrong", Health.OK, 30, lambda f: None),
    Scenario(
        "xid79",
        "GPU 3 falls off the bus (Xid 79) at t=10s",
        Health.FAILED,
        20,
        lambda f: f.at(10).xid(79, gpu=3),
        (3,),
    ),
    Scenario(
        "dbe",
        "GPU 2: double-bit ECC error (Xid 48) with a row remap pending a reset",
        Health.FAILED,
        20,
        lambda f: f.at(10).dbe(gpu=2),
        (2,),
    ),
    Scenario(
        "row-remap-failure",
        "GPU 6: a row could not be remapped (Xid 64)",
        Health.FAILED,
        20,
        lambda f: f.at(10).row_remap_failure(gpu=6),
        (6,),
    ),
    Scenario(
        "uncontained-xid95",
        "GPU 1: uncontained memory error (Xid 95)",
        Health.FAILED,
        20,
        lambda f: f.at(10).uncontained(gpu=1),
        (1,),
    ),
    Scenario(
        "xid154-reset",
        "GPU 4: the driver asks for a GPU reset (Xid 154, recovery action)",
        Health.FAILED,
        20,
        lambda f: f.at(10).recovery_action(gpu=4),
        (4,),
    ),
    Scenario(
        "thermal",
        "GPU 1 loses cooling: past the slowdown threshold, HW thermal slowdown",
        Health.DEGRADED,
        40,
        lambda f: f.at(5).thermal_runaway(gpu=1, rate_c_per_s=2.0),
        (1,),
    ),
    Scenario(
        "power-brake",
        "GPU 0: external power brake asserted, clocks cut",
        Health.DEGRADED,
        30,
        lambda f: f.at(10).power_brake(gpu=0),
        (0,),
    ),
    Scenario(
        "pcie-replay",
        "GPU 5: PCIe replay storm, then the link downtrains to x8",
        Health.DEGRADED,
        30,
        lambda f: f.at(5).pcie_replay_storm(gpu=5).after(5).pcie_downtrain(gpu=5),
        (5,),
    ),
    Scenario(
        "nvlink-crc",
        "GPU 7: NVLink CRC error storm",
        Health.DEGRADED,
        30,
        lambda f: f.at(5).nvlink_crc_storm(gpu=7),
        (7,),
    ),
    Scenario(
        "straggler",
        "GPU 3: SM clock stuck at half speed under full load",
        Health.DEGRADED,
        30,
        lambda f: f.at(5).straggler(gpu=3),
        (3,),
    ),
    # Fail-slow GPUs: slower than their peers, with the clocks and throttle reasons telemetry shows,
    # while no health rule fires (software limits are normal operation); a balancing job moves
    # their shares (docs/balance.md).
    Scenario(
        "uneven-gpus",
        "GPU 1 power-capped to 50% of its clock, GPU 2 held at 75% by SW thermal slowdown",
        Health.OK,
        20,
        lambda f: (
            f.at(5).throttled(gpu=1, fraction=0.5).throttled(gpu=2, fraction=0.75, reason=Throttle.SW_THERMAL)
        ),
        (1, 2),
    ),
    Scenario(
        "slow-then-recover",
        "GPU 2 power-capped to 50% of its clock at t=5s for 20 s, then back to full speed",
        Health.OK,
        30,
        lambda f: f.at(5).throttled(gpu=2, fraction=0.5, duration_s=20),
    ),
    Scenario(
        "app-xid13",
        "GPU 2: Xid 13/31/13 from one process, then a sympathetic Xid 45",
        Health.DEGRADED,
        30,
        lambda f: f.at(10).app_xid_burst(gpu=2),
        (2,),
    ),
    # Defects with no telemetry symptom: the node reads healthy; only `trainguard diagnose` (the
    # DIAGNOSE_SCENARIOS of the same name) finds the GPU, from the work it does.
    Scenario(
        "silent-slow-gpu",
        "GPU 4 computes at half rate with normal clocks (only diagnose finds it)",
        Health.OK,
        20,
        lambda f: f.at(5).slow_products(gpu=4),
    ),
    Scenario(
        "detoured-link",
        "GPU 6's transfers detour through host memory, clean counters (only diagnose finds it)",
        Health.OK,
        20,
        lambda f: f.at(5).detoured_link(gpu=6),
    ),
    Scenario(
        "stuck-bits",
        "GPU 0 has memory bits stuck at 0 or 1, no ECC event (only diagnose finds it)",
        Health.OK,
        20,
        lambda f: f.at(5).stuck_bits(gpu=0),
    ),
    Scenario(
        "tour",
        "an 8-GPU node through many faults over 60 s (the live demo)",
        Health.FAILED,
        60,
        _tour,
        (0, 1, 2, 3, 4, 5, 6, 7),
        {g: Health.DEGRADED for g in (0, 1, 2, 3, 5, 7)},  # 4 and 6 fail
    ),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _ALL}


def run_scenario(
    name: str,
    sim: SimNode,
    *,
    step_s: float = 1.0,
    on_step: Callable[[float], object] | None = None,
) -> Scenario:
    """Script scenario ``name`` on ``sim`` and advance its VirtualClock to ``duration_s``.

    ``on_step(elapsed)`` runs after each ``step_s`` (an agent tick, a demo frame).
    """
    scenario = SCENARIOS.get(name)
    if scenario is None:
        raise ConfigError(f"unknown scenario {name!r}: choose one of {', '.join(SCENARIOS)}")
    clock = sim.clock
    if not isinstance(clock, VirtualClock):
        raise ConfigError("run_scenario needs a node on a VirtualClock (SimNode(clock=VirtualClock()))")
    if max(scenario.faulty_gpus, default=-1) >= sim.n_gpus:
        raise ConfigError(
            f"scenario {name!r} needs {max(scenario.faulty_gpus) + 1} GPUs, sim has {sim.n_gpus}"
        )
    scenario.script(sim)
    end = sim.start_time + scenario.duration_s
    while clock.time() < end:
        clock.advance_to(min(clock.time() + step_s, end))
        sim.poll()
        if on_step is not None:
            on_step(sim.elapsed)
    return scenario


@dataclass(frozen=True, slots=True)
class DiagnoseScenario:
    """A fault for ``trainguard diagnose --backend sim --scenario NAME``: scripted at once on a
    sim on the real clock, it must make exactly the tests in ``fails`` fail, on those GPUs."""

    name: str
    description: str
    script: Callable[[SimNode], object]
    fails: tuple[tuple[str, int], ...] = ()  # (level-2 test, GPU)


_DIAGNOSE = [
    DiagnoseScenario("healthy", "8 healthy GPUs: every test passes", lambda f: None),
    DiagnoseScenario(
        "slow-gpu",
        "GPU 2 computes at half rate (SM clock stuck low, no throttle reason)",
        lambda f: f.now().straggler(gpu=2),
        (("compute", 2),),
    ),
    DiagnoseScenario(
        "sdc",
        "GPU 5 returns wrong bits in some matrix products, with no telemetry symptom",
        lambda f: f.now().wrong_products(gpu=5, rate=0.3),
        (("sdc", 5),),
    ),
    DiagnoseScenario(
        "bad-hbm",
        "GPU 1 corrupts some writes to its memory, with no ECC event",
        lambda f: f.now().hbm_corruption(gpu=1),
        (("memory_pattern", 1),),
    ),
    DiagnoseScenario(
        "slow-link",
        "GPU 3's link runs at a quarter of its bandwidth, with clean counters",
        lambda f: f.now().slow_link(gpu=3, fraction=0.25),
        (("interconnect", 3),),
    ),
    # The node of each of these reads healthy (`trainguard check --scenario NAME` passes).
    DiagnoseScenario(
        "silent-slow-gpu",
        "GPU 4 computes at half rate while its clocks, power and throttle reasons read normal",
        lambda f: f.now().slow_products(gpu=4, fraction=0.5),
        (("compute", 4),),
    ),
    DiagnoseScenario(
        "detoured-link",
        "GPU 6's transfers are copied through 4 host buffers on the way, with clean counters",
        lambda f: f.now().detoured_link(gpu=6, bounces=4),
        (("interconnect", 6),),
    ),
    DiagnoseScenario(
        "stuck-bits",
        "GPU 0 has 8 memory bits stuck at 0 or 1, with no ECC event",
        lambda f: f.now().stuck_bits(gpu=0, cells=8),
        (("memory_pattern", 0),),
    ),
    DiagnoseScenario(
        "hot-gpu",
        "GPU 6 passes its slowdown temperature after 2 s under load and throttles",
        lambda f: f.now().hot_under_load(gpu=6, after_s=2.0),
        (("thermal_power", 6),),
    ),
]

DIAGNOSE_SCENARIOS: dict[str, DiagnoseScenario] = {s.name: s for s in _DIAGNOSE}
