"""The device seam's edges: NVML settings readings (on a fake NVML), the docstring examples, and
the CUDA path (marked ``gpu``: on a machine without one the same code runs on the CPU device)."""

from __future__ import annotations

import doctest
import importlib

import pytest

from real_parts import require_module
from test_telemetry_nvml import FakeGpu, FakeNvml
from trainguard.records import DriverInfo, GpuModes
from trainguard.telemetry.nvml import NvmlBackend, pynvml

require_module("pynvml", install="pip install 'trainguard[nvml]' (make install does)")


def test_nvml_reads_persistence_ecc_mig_and_the_driver(monkeypatch):
    fake = FakeNvml([FakeGpu(0), FakeGpu(1)])
    fake.install(monkeypatch)
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetPersistenceMode", lambda h: 1 if h.index == 0 else 0, raising=False
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetEccMode", lambda h: (1, 1), raising=False)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMigMode", lambda h: (0, 0), raising=False)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: b"550.90.07", raising=False)
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", lambda: 12040, raising=False)
    monkeypatch.setattr(pynvml, "nvmlSystemGetNVMLVersion", lambda: "12.550.90.07", raising=False)
    with NvmlBackend() as nvml:
        assert nvml.modes(0) == GpuModes(persistence=True, ecc=True, ecc_pending=True, mig=False)
        assert nvml.modes(1).persistence is False
        assert nvml.driver_info() == DriverInfo("550.90.07", "12.4", "12.550.90.07")


def test_nvml_settings_a_driver_lacks_are_unknown_not_healthy(monkeypatch):
    fake = FakeNvml([FakeGpu(0)])
    fake.install(monkeypatch)
    for name in ("nvmlDeviceGetPersistenceMode", "nvmlDeviceGetEccMode", "nvmlDeviceGetMigMode"):
        monkeypatch.delattr(pynvml, name, raising=False)
    with NvmlBackend() as nvml:
        assert nvml.modes(0) == GpuModes()


@pytest.mark.parametrize(
    "module",
    [
        "trainguard.diagnose",
        "trainguard.diagnose.result",
        "trainguard.diagnose.expected",
        "trainguard.diagnose.watchdog",
        "trainguard.diagnose.torch_device",
        "trainguard.diagnose.sim_device",
        "trainguard.diagnose.gate",
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
