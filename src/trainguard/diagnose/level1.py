"""Level 1: the software and settings checks (seconds). Pure judgement over what was read.

Node checks: torch, driver, CUDA compatibility (torch's CUDA runtime against the newest CUDA the
driver supports), the GPU count, NCCL. GPU checks, from one NVML reading and the GPU's modes:
the GPU answers, persistence mode, ECC on, MIG off, PCIe link at its maximum, no pending row remap
or retired-page limit, the driver's recovery action is none.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.diagnose.result import TestResult, Verdict
from trainguard.records import DriverInfo, GpuModes, RecoveryAction, Sample

__all__ = ["GPU_CHECKS", "NODE_CHECKS", "Software", "gpu_checks", "node_checks"]

NODE_CHECKS = ("torch", "driver", "cuda_compat", "gpu_count", "nccl")
GPU_CHECKS = (
    "gpu_answers",
    "persistence_mode",
    "ecc_mode",
    "mig_mode",
    "pcie_link",
    "memory_errors",
    "recovery_action",
)
RETIRED_PAGE_LIMIT = 64  # pages a pre-Ampere GPU may retire before it must be replaced
_TORCH_MIN = (2, 4)


@dataclass(frozen=True, slots=True)
class Software:
    """What this process sees of the software stack (``runner.read_software`` fills it)."""

    kind: str  # "cuda", "cpu" or "sim"
    torch: str | None = None  # "2.13.0+cu124"
    torch_cuda: str | None = None  # CUDA runtime torch was built with, "12.4"; None on CPU builds
    nccl: str | None = None  # "2.21.5" when torch has NCCL
    cuda_devices: int = 0  # GPUs torch sees
    driver: DriverInfo | None = None  # None: no NVIDIA driver (or NVML) here


def _version(text: str | None) -> tuple[int, ...]:
    parts = []
    for p in (text or "").split("+")[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def node_checks(sw: Software, gpus_found: int, expect_gpus: int | None) -> list[TestResult]:
    out = [_torch(sw)]
    drv = sw.driver
    if drv is None or drv.driver is None:
        why = "no NVIDIA driver on this machine (CPU device)" if sw.kind == "cpu" else "NVML did not answer"
        out += [TestResult.skip("driver", why), TestResult.skip("cuda_compat", why)]
    else:
        out.append(TestResult.ok("driver", drv.driver, None, "", f"NVML {drv.nvml or '?'}"))
        out.append(_cuda_compat(sw.torch_cuda, drv.cuda, sw.kind))
    out.append(_gpu_count(sw, gpus_found, expect_gpus))
    out.append(_nccl(sw))
    return out


def _torch(sw: Software) -> TestResult:
    if sw.torch is None:
        return TestResult.fail(
            "torch", "torch is not installed: pip install 'trainguard[torch]'", None, ">= 2.4"
        )
    if _version(sw.torch)[:2] < _TORCH_MIN:
        return TestResult.fail("torch", f"torch {sw.torch} is older than 2.4", sw.torch, ">= 2.4")
    return TestResult.ok("torch", sw.torch, ">= 2.4")


def _cuda_compat(runtime: str | None, driver_cuda: str | None, kind: str) -> TestResult:
    name = "cuda_compat"
    if kind == "sim":
        return TestResult.ok(name, driver_cuda, None, "", "simulated node: the driver's CUDA only")
    if runtime is None:
        return TestResult.fail(
            name, "torch is a CPU build on a machine with an NVIDIA driver", None, driver_cuda
        )
    if driver_cuda is None:
        return TestResult.skip(name, "the driver did not say which CUDA it supports")
    rt, drv = _version(runtime)[:2], _version(driver_cuda)[:2]
    if rt[:1] > drv[:1]:
        reason = f"torch needs CUDA {runtime}, the driver supports up to {driver_cuda}: upgrade the driver"
        return TestResult.fail(name, reason, runtime, f"<= {driver_cuda}")
    if rt > drv:
        reason = f"CUDA {runtime} on a {driver_cuda} driver runs by minor-version compatibility (no PTX JIT)"
        return TestResult(name, Verdict.WARN, runtime, f"<= {driver_cuda}", "", reason)
    return TestResult.ok(
        name, runtime, f"<= {driver_cuda}", "", "torch's CUDA runtime is supported by the driver"
    )


def _gpu_count(sw: Software, found: int, expect: int | None) -> TestResult:
    if sw.kind == "cpu" and not expect:
        return TestResult.skip("gpu_count", "no GPU here: the tests run on the CPU device")
    if expect is not None and found < expect:
        return TestResult.fail(
            "gpu_count", f"{found} GPU(s) present, {expect} expected", found, expect, "GPUs"
        )
    if sw.kind == "cuda" and sw.cuda_devices < found:
        reason = f"torch sees {sw.cuda_devices} of the {found} GPUs NVML lists (CUDA_VISIBLE_DEVICES?)"
        return TestResult("gpu_count", Verdict.WARN, sw.cuda_devices, found, "GPUs", reason)
    return TestResult.ok("gpu_count", found, expect if expect is not None else found, "GPUs")


def _nccl(sw: Software) -> TestResult:
    if sw.kind != "cuda":
        return TestResult.skip("nccl", f"no CUDA on the {sw.kind} device: collectives use gloo")
    if sw.nccl is None:
        return TestResult.fail("nccl", "torch has no NCCL: multi-GPU training cannot run", None, "available")
    return TestResult.ok("nccl", sw.nccl, "available")


def gpu_checks(s: Sample | None, modes: GpuModes | None) -> list[TestResult]:
    """The per-GPU settings checks; without telemetry (the CPU device) they are skipped."""
    if s is None:
        return [TestResult.skip(n, "no GPU telemetry on this device") for n in GPU_CHECKS]
    if s.lost:
        return [TestResult.fail("gpu_answers", s.error or "the GPU does not answer", "lost", "answers")] + [
            TestResult.skip(n, "the GPU does not answer") for n in GPU_CHECKS[1:]
        ]
    m = modes or GpuModes()
    return [
        TestResult.ok("gpu_answers", "answers", "answers"),
        _mode(
            "persistence_mode", m.persistence, True, "enable it: nvidia-smi -pm 1 (or nvidia-persistenced)"
        ),
        _ecc(m),
        _mode("mig_mode", m.mig, False, "MIG splits the GPU: disable it for training (nvidia-smi -mig 0)"),
        _pcie(s),
        _memory_errors(s),
        _recovery(s.recovery_action),
    ]


def _mode(name: str, value: bool | None, want: bool, advice: str) -> TestResult:
    words = {True: "enabled", False: "disabled"}
    if value is None:
        return TestResult.skip(name, "not reported by this GPU/driver")
    if value is want:
        return TestResult.ok(name, words[value], words[want])
    return TestResult(name, Verdict.WARN, words[value], words[want], "", advice)


def _ecc(m: GpuModes) -> TestResult:
    if m.ecc is False:
        advice = "ECC is off: memory errors go unnoticed (nvidia-smi -e 1, then reboot)"
        if m.ecc_pending:
            advice = "ECC is off until the pending enable takes effect at the next reboot"
        return TestResult.fail("ecc_mode", advice, "disabled", "enabled")
    return _mode("ecc_mode", m.ecc, True, "")


def _pcie(s: Sample) -> TestResult:
    name = "pcie_link"
    if None in (s.pcie_width, s.pcie_width_max, s.pcie_gen, s.pcie_gen_max):
        return TestResult.skip(name, "PCIe link not reported")
    value, expected = f"Gen{s.pcie_gen} x{s.pcie_width}", f"Gen{s.pcie_gen_max} x{s.pcie_width_max}"
    assert s.pcie_width is not None and s.pcie_width_max is not None
    assert s.pcie_gen is not None and s.pcie_gen_max is not None
    if s.pcie_width < s.pcie_width_max:
        return TestResult(
            name, Verdict.WARN, value, expected, "", f"link trained at x{s.pcie_width} of x{s.pcie_width_max}"
        )
    busy = (s.util_gpu_pct or 0) > 5
    if s.pcie_gen < s.pcie_gen_max and busy:
        return TestResult(
            name,
            Verdict.WARN,
            value,
            expected,
            "",
            f"Gen{s.pcie_gen} under load, Gen{s.pcie_gen_max} possible",
        )
    reason = "idle link in a power-saving generation" if s.pcie_gen < s.pcie_gen_max else ""
    return TestResult.ok(name, value, expected, "", reason)


def _memory_errors(s: Sample) -> TestResult:
    name = "memory_errors"
    problems = []
    if s.remap_failure:
        problems.append("a row could not be remapped (replace the GPU)")
    if s.remap_pending:
        problems.append("a row remap is pending (reset the GPU)")
    if s.retired_pending:
        problems.append("a page retirement is pending (reset the GPU)")
    retired = (s.retired_sbe or 0) + (s.retired_dbe or 0)
    if retired >= RETIRED_PAGE_LIMIT:
        problems.append(f"{retired} retired pages (limit {RETIRED_PAGE_LIMIT})")
    if s.ecc_dbe_volatile:
        problems.append(f"{s.ecc_dbe_volatile} uncorrectable ECC error(s) since the last reset")
    if problems:
        return TestResult.fail(name, "; ".join(problems), len(problems), 0, "problems")
    return TestResult.ok(name, 0, 0, "problems")


def _recovery(action: RecoveryAction | None) -> TestResult:
    if action is None:
        return TestResult.skip("recovery_action", "not reported by this driver (before R565)")
    if action is RecoveryAction.NONE:
        return TestResult.ok("recovery_action", "none", "none")
    return TestResult.fail("recovery_action", f"the driver asks for {action.value}", action.value, "none")
