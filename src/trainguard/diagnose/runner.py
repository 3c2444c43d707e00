"""Runs the levels on a ``Target``: measure every device under the watchdog, then judge.

    level 1  software and settings (level1.py)                           seconds
    level 2  + compute, sdc, memory_bandwidth, memory_pattern,            about a minute per GPU
             interconnect, thermal_power (measure.py, interconnect.py)
    level 3  level 2 with the long budget: longer stress, more SDC        about ten minutes
             rounds, the pattern test over most of the memory

A device that does not finish a test within ``Budget.timeout_s`` is failed as wedged and its
remaining tests are skipped with that reason; the run goes on with the others.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from trainguard.diagnose import level1
from trainguard.diagnose.device import Budget, Device, budget_for
from trainguard.diagnose.result import GpuReport, Report, TestResult
from trainguard.diagnose.target import Target
from trainguard.diagnose.watchdog import Watchdog, watch
from trainguard.errors import ConfigError

__all__ = ["LEVEL2_TESTS", "TESTS", "Progress", "run_diagnostics"]

T = TypeVar("T")

LEVEL2_TESTS = ("compute", "sdc", "memory_bandwidth", "memory_pattern", "interconnect", "thermal_power")

TESTS: dict[str, tuple[int, str]] = {
    "torch": (1, "torch is installed and recent enough (>= 2.4)"),
    "driver": (1, "NVIDIA driver and NVML versions"),
    "cuda_compat": (1, "torch's CUDA runtime is supported by the driver"),
    "gpu_count": (1, "the expected number of GPUs is present (--expect-gpus)"),
    "nccl": (1, "NCCL is visible to torch"),
    "gpu_answers": (1, "the GPU answers NVML"),
    "persistence_mode": (1, "persistence mode enabled"),
    "ecc_mode": (1, "ECC enabled"),
    "mig_mode": (1, "MIG disabled"),
    "pcie_link": (1, "PCIe link generation and width at their maximum"),
    "memory_errors": (1, "no pending row remap or page retirement, no retired-page limit, no DBE"),
    "recovery_action": (1, "the driver's recovery action is none"),
    "compute": (
        2,
        "sustained matrix-multiply TFLOPS vs peers and the model's peak (more dtypes: compute_<dtype>)",
    ),
    "sdc": (2, "seeded products and reductions, repeated; bitwise equal across rounds and GPUs"),
    "memory_bandwidth": (2, "device copy bandwidth (and write bandwidth) vs peers and the model's peak"),
    "memory_pattern": (2, "walking ones/zeros and random patterns written and read back"),
    "interconnect": (2, "all-reduce bus bandwidth (nccl-tests busbw), pairwise to name a slow link"),
    "thermal_power": (2, "throttling, power brake or slowdown temperature during a stress"),
}


@dataclass(frozen=True, slots=True)
class Progress:
    """One step of a run, for a live display: ``result`` is None when the step starts."""

    test: str
    gpu: int | None
    done: int
    total: int
    note: str = ""


class _Run:
    def __init__(
        self, target: Target, budget: Budget, on_progress: Callable[[Progress], object] | None
    ) -> None:
        self.target, self.budget, self.on_progress = target, budget, on_progress
        self.devices = target.devices
        self.wedged: dict[int, str] = {}
        self.dogs = {d.index: Watchdog(f"gpu{d.index}") for d in self.devices}  # one worker per device
        self.results: dict[int, list[TestResult]] = {d.index: [] for d in self.devices}
        self.done, self.total = 0, 0
        self.seconds: dict[tuple[str, int | None], float] = {}  # (test, GPU or None for a group)
        self.golden: dict[str, str] = {}  # SDC checksums recorded by an earlier run, by workload
        self.golden_out: dict[str, str] = {}  # this run's majority checksums, by workload

    def progress(self, test: str, gpu: int | None, note: str = "", step: bool = True) -> None:
        self.done += step
        if self.on_progress is not None:
            self.on_progress(Progress(test, gpu, self.done, self.total, note))

    def per_device(
        self, name: str, measure: Callable[[Device], T], rounds: int = 1
    ) -> tuple[dict[int, list[T]], dict[int, TestResult]]:
        """Measure each device under the watchdog, ``rounds`` times round-robin (so a host that
        gets busier for a while slows every device's figures alike): (figures, decided tests)."""
        values: dict[int, list[T]] = {}
        decided: dict[int, TestResult] = {}
        for k in range(rounds):
            last = k == rounds - 1
            for dev in self.devices:
                if dev.index in decided:
                    continue
                if dev.index in self.wedged:
                    decided[dev.index] = TestResult.skip(
                        name, f"GPU wedged earlier ({self.wedged[dev.index]})"
                    )
                    self.progress(name, dev.index, "skip")
                    continue
                self.progress(name, dev.index, "running", step=False)

                def job(dev: Device = dev) -> T:
                    with dev.busy():
                        return measure(dev)

                t0 = time.monotonic()
                outcome = self.dogs[dev.index].run(job, self.budget.timeout_s)
                self.seconds[(name, dev.index)] = (
                    self.seconds.get((name, dev.index), 0.0) + time.monotonic() - t0
                )
                if outcome.timed_out:
                    self.wedged[dev.index] = f"{name} did not finish"
                    decided[dev.index] = TestResult.fail(
                        name,
                        f"did not finish within {self.budget.timeout_s:.0f} s: the GPU is wedged or hung",
                    )
                elif outcome.error is not None:
                    decided[dev.index] = TestResult.fail(
                        name, f"{type(outcome.error).__name__}: {outcome.error}"
                    )
                else:
                    values.setdefault(dev.index, []).append(outcome.value)  # type: ignore[arg-type]
                if last or dev.index in decided:
                    self.progress(name, dev.index, f"{self.seconds[(name, dev.index)]:.1f} s")
        return {g: v for g, v in values.items() if g not in decided}, decided

    def record(self, results: dict[int, TestResult]) -> None:
        for gpu, r in results.items():
            took = self.seconds.get((r.name, gpu), self.seconds.get((r.name, None), 0.0))
            self.results[gpu].append(dataclasses.replace(r, seconds=took))

    def group(
        self, name: str, measure: Callable[[], T], devices: Sequence[Device]
    ) -> tuple[T | None, dict[int, TestResult]]:
        """One measurement over several devices at once under one watchdog."""
        self.progress(name, None, "running", step=False)
        t0 = time.monotonic()
        outcome = watch(measure, self.budget.timeout_s, name)
        self.seconds[(name, None)] = time.monotonic() - t0
        self.progress(name, None, f"{self.seconds[(name, None)]:.1f} s")
        if outcome.timed_out:
            why = f"did not finish within {self.budget.timeout_s:.0f} s (a hung collective or a wedged GPU)"
            for d in devices:
                self.wedged[d.index] = f"{name} did not finish"
            return None, {d.index: TestResult.fail(name, why) for d in devices}
        if outcome.error is not None:
            why = f"{type(outcome.error).__name__}: {outcome.error}"
            return None, {d.index: TestResult.fail(name, why) for d in devices}
        return outcome.value, {}


def run_diagnostics(
    target: Target,
    level: int = 2,
    *,
    tests: Iterable[str] | None = None,
    budget: Budget | None = None,
    expect_gpus: int | None = None,
    on_progress: Callable[[Progress], object] | None = None,
    extra: dict[str, Any] | None = None,
    golden: dict[str, str] | None = None,
) -> Report:
    """Run ``level`` (1, 2 or 3; each includes the ones below) or only ``tests`` on ``target``.

    ``golden`` holds the SDC checksums of a first run (a report's ``extra["sdc_golden"]``): with
    it, even a single GPU is checked against a known-good result."""
    if level not in (1, 2, 3):
        raise ConfigError(f"--level is 1, 2 or 3, not {level}")
    wanted = set(tests) if tests is not None else {n for n, (lv, _) in TESTS.items() if lv <= level}
    unknown = wanted - set(TESTS)
    if unknown:
        raise ConfigError(f"unknown test(s) {sorted(unknown)}: see trainguard diagnose --list-tests")
    started = time.monotonic()
    budget = budget or budget_for(level, target.kind)
    run = _Run(target, budget, on_progress)
    run.golden = dict(golden or {})
    l2 = [n for n in LEVEL2_TESTS if n in wanted]
    run.total = sum(1 if n in ("interconnect", "thermal_power") else len(run.devices) for n in l2)

    node = [
        t for t in level1.node_checks(target.software, target.gpus_found, expect_gpus) if t.name in wanted
    ]
    for dev in run.devices:
        checks = level1.gpu_checks(target.reading(dev.index), target.modes(dev.index))
        run.results[dev.index] += [t for t in checks if t.name in wanted]
    from trainguard.diagnose import level2  # imports torch: only when device tests run

    for name in l2:
        getattr(level2, name)(run)
    gpus = tuple(GpuReport(d.index, d.name, tuple(run.results[d.index])) for d in run.devices)
    extra = {**(extra or {}), **({"wedged": dict(run.wedged)} if run.wedged else {})}
    if run.golden_out:
        extra["sdc_golden"] = run.golden_out
    return Report(level, target.kind, gpus, tuple(node), time.monotonic() - started, extra=extra)
