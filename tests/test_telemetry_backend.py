"""Opening backends by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainguard.clock import VirtualClock
from trainguard.errors import ConfigError
from trainguard.telemetry import BACKENDS, TelemetryBackend, open_backend


def test_open_backend_knows_the_three_backends_and_rejects_others():
    assert BACKENDS == ("nvml", "sim", "smi-xml")
    sim = open_backend("sim", n_gpus=3, clock=VirtualClock())
    assert isinstance(sim, TelemetryBackend) and len(sim.sample()) == 3
    with pytest.raises(ConfigError, match="nvml, sim, smi-xml"):
        open_backend("dcgm")


def test_importing_telemetry_and_the_simulator_pulls_no_pynvml():
    code = (
        "import sys, trainguard.telemetry, trainguard.telemetry.sim, trainguard.telemetry.smi_xml, trainguard.clock;"
        "print([m for m in ('pynvml', 'numpy', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "module",
    [
        "trainguard.clock",
        "trainguard.telemetry",
        "trainguard.telemetry.sim",
        "trainguard.telemetry.sim.node",
        "trainguard.telemetry.sim.faults",
        "trainguard.telemetry.sim.kmsg",
        "trainguard.telemetry.sim.scenarios",
    ],
)
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
