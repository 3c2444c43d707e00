"""The level-2 tests, one function each: measure on every device (``measure.py``), then judge
(``judge.py``) and record. Imports torch (through measure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.diagnose import judge, measure
from trainguard.diagnose.device import Device
from trainguard.diagnose.expected import floor_of, peak_of
from trainguard.diagnose.result import TestResult

if TYPE_CHECKING:
    from trainguard.diagnose.runner import _Run

ROUNDS = 3  # round-robin passes over the devices for the timed figures

__all__ = ["compute", "interconnect", "memory_bandwidth", "memory_pattern", "sdc", "thermal_power"]


def _alone(run: _Run) -> bool:
    """A single CPU device: nothing to compare with but the machine itself."""
    return len(run.devices) == 1 and run.devices[0].kind == "cpu"


def compute(run: _Run) -> None:
    b = run.budget
    window = b.compute_s / ROUNDS
    alone = _alone(run)

    def one(d: Device) -> dict[str, float]:
        figures = {dt: measure.matmul_tflops(d, b.matmul_n, dt, window) for dt in b.dtypes}
        if alone:  # the machine's own figure, in the same thread and moment
            figures["plain"] = measure.plain_matmul_tflops(
                d.torch_device, b.matmul_n, b.dtypes[0], window, d.clock
            )
        return figures

    rounds, decided = run.per_device("compute", one, ROUNDS)
    values = {g: {k: max(r[k] for r in rs) for k in rs[0]} for g, rs in rounds.items()}
    reference = values[run.devices[0].index].get("plain") if alone and values else None
    for k, dtype in enumerate(b.dtypes):
        name = "compute" if k == 0 else f"compute_{dtype}"
        figures = {g: v[dtype] for g, v in values.items()}
        peaks = {d.index: peak_of(d.kind, d.name, dtype) for d in run.devices}
        detail = {g: f"{b.matmul_n}x{b.matmul_n} {dtype}" for g in figures}
        per_round = {g: [r[dtype] for r in rs] for g, rs in rounds.items()}
        results = judge.judge_against_peers(
            "compute",
            figures,
            "TFLOPS",
            peaks,
            floor_of(dtype),
            reference if k == 0 else None,
            detail,
            per_round,
        )
        results = {
            g: TestResult(name, r.verdict, r.value, r.expected, r.unit, r.reason) for g, r in results.items()
        }
        for g in results:  # one measurement timed every dtype
            run.seconds[(name, g)] = run.seconds.get(("compute", g), 0.0)
        run.record({**results, **({g: _renamed(t, name) for g, t in decided.items()})})


def _renamed(t: TestResult, name: str) -> TestResult:
    return TestResult(name, t.verdict, t.value, t.expected, t.unit, t.reason)


def sdc(run: _Run) -> None:
    b = run.budget
    runs, decided = run.per_device("sdc", lambda d: measure.sdc_digests(d, b.sdc_n, b.sdc_rounds))
    digests = {g: v[0] for g, v in runs.items()}
    torch_version = run.target.software.torch
    keys = {d.index: f"{d.name} | torch {torch_version} | {b.sdc_n}x{b.sdc_n} fp32" for d in run.devices}
    run.golden_out.update(judge.sdc_reference(digests, keys))
    run.record({**judge.judge_sdc(digests, keys, run.golden), **decided})


def memory_bandwidth(run: _Run) -> None:
    b = run.budget
    window = b.bandwidth_s / ROUNDS
    alone = _alone(run)

    def one(d: Device) -> tuple[float, float, float]:
        copy, write = measure.copy_bandwidth(d, b.copy_bytes, window)
        plain = measure.plain_copy_gbps(d.torch_device, b.copy_bytes, window / 2, d.clock) if alone else 0.0
        return copy, write, plain

    rounds, decided = run.per_device("memory_bandwidth", one, ROUNDS)
    values = {g: tuple(max(r[k] for r in rs) for k in range(3)) for g, rs in rounds.items()}
    reference = values[run.devices[0].index][2] if alone and values else None
    copy = {g: v[0] for g, v in values.items()}
    size = f"{b.copy_bytes / 2**20:g} MiB" if b.copy_bytes >= 2**20 else f"{b.copy_bytes / 2**10:g} KiB"
    detail = {g: f"copy of {size}; write {v[1]:.4g} GB/s" for g, v in values.items()}
    peaks = {d.index: peak_of(d.kind, d.name, "memory") for d in run.devices}
    per_round = {g: [r[0] for r in rs] for g, rs in rounds.items()}
    results = judge.judge_against_peers(
        "memory_bandwidth", copy, "GB/s", peaks, floor_of("memory"), reference, detail, per_round
    )
    run.record({**results, **decided})


def memory_pattern(run: _Run) -> None:
    b = run.budget

    def one(d: Device) -> tuple[int, int, int]:
        nbytes = max(2**20, min(int(d.memory_free() * b.pattern_fraction), b.pattern_max_bytes))
        bad, patterns = measure.pattern_test(d, nbytes)
        return bad, nbytes, patterns

    values, decided = run.per_device("memory_pattern", one)
    run.record({**{g: judge.judge_pattern(*v[0]) for g, v in values.items()}, **decided})


def interconnect(run: _Run) -> None:
    from trainguard.diagnose.interconnect import measure_interconnect

    b = run.budget
    live = [d for d in run.devices if d.index not in run.wedged]
    if len(live) < 2:
        why = "needs at least 2 devices" + (" (the CPU is one)" if _alone(run) else "")
        run.record({d.index: TestResult.skip("interconnect", why) for d in run.devices})
        run.progress("interconnect", None, "skip")
        return
    value, decided = run.group(
        "interconnect",
        lambda: measure_interconnect(live, b.allreduce_bytes, b.allreduce_iters, b.timeout_s),
        live,
    )
    if value is not None:
        per_gpu, ring = value
        decided = judge.judge_interconnect(per_gpu, ring, len(live))
    skipped = {
        d.index: TestResult.skip("interconnect", "GPU wedged earlier") for d in run.devices if d not in live
    }
    run.record({**decided, **skipped})


def thermal_power(run: _Run) -> None:
    b = run.budget
    live = [d for d in run.devices if d.index not in run.wedged and d.reading() is not None]
    no_telemetry = {
        d.index: TestResult.skip(
            "thermal_power",
            "no GPU telemetry on this device" if d.index not in run.wedged else "GPU wedged earlier",
        )
        for d in run.devices
        if d not in live
    }
    if not live:
        run.record(no_telemetry)
        run.progress("thermal_power", None, "skip")
        return
    traces, decided = run.group(
        "thermal_power", lambda: measure.stress_all(live, b.matmul_n, b.stress_s, b.sample_every_s), live
    )
    if traces is not None:
        decided = {g: judge.judge_thermal(judge.ThermalTrace(tuple(t))) for g, t in traces.items()}
    run.record({**decided, **no_telemetry})
