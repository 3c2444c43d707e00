"""The simulated GPU node: a product feature (demo, scenarios, chaos drills, tests), not a mock.

``SimNode`` is a ``TelemetryBackend``; faults scripted on it (``sim.at(t).xid(79, gpu=3)``,
``sim.inject_now(faults.DoubleBitEcc(gpu=2))``) produce NVML-shaped readings and real-format
kernel-log lines. ``SCENARIOS`` are the named scripts with the verdict each must produce.

    >>> from trainguard.clock import VirtualClock
    >>> from trainguard.telemetry.sim import SimNode, run_scenario
    >>> sim = SimNode(clock=VirtualClock())
    >>> run_scenario("dbe", sim).expected.value
    'failed'
"""

from __future__ import annotations

from trainguard.telemetry.sim import faults
from trainguard.telemetry.sim.kmsg import dmesg_line, format_xid, write_xid_line, xid_messages
from trainguard.telemetry.sim.node import SimNode
from trainguard.telemetry.sim.profiles import PROFILES, GpuProfile, pci_address
from trainguard.telemetry.sim.scenarios import (
    DIAGNOSE_SCENARIOS,
    SCENARIOS,
    DiagnoseScenario,
    Scenario,
    run_scenario,
)
from trainguard.telemetry.sim.script import At

SimFleet = SimNode  # deprecated name (it always was one node): use SimNode

__all__ = [
    "DIAGNOSE_SCENARIOS",
    "PROFILES",
    "SCENARIOS",
    "At",
    "DiagnoseScenario",
    "GpuProfile",
    "Scenario",
    "SimFleet",
    "SimNode",
    "dmesg_line",
    "faults",
    "format_xid",
    "pci_address",
    "run_scenario",
    "write_xid_line",
    "xid_messages",
]
