"""The NVML call audit of the gpu tests (``test_gpu_paths.audit_nvml_calls``), fed the hand-written
NVML fake of ``test_telemetry_nvml``: clean, it finds nothing; with a call failing or never made,
it says which. Runs on the CPU (``make test``), so the audit that only a GPU run uses can fail."""

from __future__ import annotations

import pynvml
import pytest

from test_gpu_paths import audit_nvml_calls
from test_telemetry_nvml import FakeGpu, FakeNvml
from trainguard.telemetry.nvml import NvmlBackend


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml([FakeGpu(0), FakeGpu(1)])
    nvml.install(monkeypatch)
    # what the telemetry tests' fake leaves out: processes, modes, the driver
    for name, fn in {
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
        "nvmlDeviceGetPersistenceMode": lambda h: 1,
        "nvmlDeviceGetEccMode": lambda h: (1, 1),
        "nvmlDeviceGetMigMode": lambda h: (0, 0),
        "nvmlSystemGetDriverVersion": lambda: "570.124.06",
        "nvmlSystemGetCudaDriverVersion": lambda: 12080,
        "nvmlSystemGetNVMLVersion": lambda: "12.570.124.06",
    }.items():
        monkeypatch.setattr(pynvml, name, fn, raising=False)
    return nvml


def test_a_backend_that_makes_every_call_passes_the_audit(fake, monkeypatch):
    assert audit_nvml_calls(monkeypatch) == []


def test_a_call_that_fails_is_named(fake, monkeypatch):
    def broken(h):
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", broken)
    problems = audit_nvml_calls(monkeypatch)
    assert any("field errors" in p for p in problems), problems
    assert any("nvmlDeviceGetPowerUsage failed" in p for p in problems), problems
    assert any("never succeeded: ['nvmlDeviceGetPowerUsage']" in p for p in problems), problems


def test_a_call_never_made_is_named(fake, monkeypatch):
    monkeypatch.setattr(NvmlBackend, "_dcgm", lambda self, h, links: {})  # a reading dropped
    problems = audit_nvml_calls(monkeypatch)
    assert any("never made" in p and "nvmlDeviceGetEncoderUtilization" in p for p in problems), problems


def test_a_failing_process_list_is_named(fake, monkeypatch):
    def gone(h):
        raise pynvml.NVMLError_GpuIsLost()

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", gone)
    problems = audit_nvml_calls(monkeypatch)
    assert any("processes of GPU 0" in p for p in problems), problems
