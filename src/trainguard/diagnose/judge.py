"""Level-2 judgement: pure functions from measured figures to verdicts (torch-free).

A GPU is compared with its peers (the median of the *other* GPUs of the node: one slow GPU fails,
whatever the table says) and, on CUDA, with the table of its model (``expected.py``). On the CPU
device there are no peers and no table: the machine is compared with itself.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from trainguard.diagnose.expected import PEAK_FLOOR
from trainguard.diagnose.result import TestResult, Verdict, worst_verdict
from trainguard.records import Sample, Throttle

__all__ = [
    "PEER_FLOOR",
    "ThermalTrace",
    "judge_against_peers",
    "judge_interconnect",
    "judge_pattern",
    "judge_sdc",
    "judge_thermal",
    "sdc_reference",
]

# measured / median of the other GPUs below which a test warns or fails.
PEER_FLOOR: dict[str, tuple[float, float]] = {
    "compute": (0.8, 0.6),
    "memory_bandwidth": (0.75, 0.5),
    "interconnect": (0.75, 0.5),
}


def _grade(ratio: float, floors: tuple[float, float]) -> Verdict:
    warn, fail = floors
    return Verdict.FAIL if ratio < fail else Verdict.WARN if ratio < warn else Verdict.PASS


def judge_against_peers(
    name: str,
    values: dict[int, float],
    unit: str,
    peak: dict[int, float | None] | None = None,
    peak_floor: tuple[float, float] = PEAK_FLOOR["fp32"],
    own_reference: float | None = None,
    detail: dict[int, str] | None = None,
    rounds: dict[int, list[float]] | None = None,
) -> dict[int, TestResult]:
    """Each GPU's figure against the median of the others, the model's peak (when known) and,
    with a single device, ``own_reference`` (the same figure from a plain loop on this machine).

    ``rounds``: each GPU's figure in every round-robin pass. Then the ratio to the peers is the
    median over the rounds of the GPU's figure over its peers' in the same round: devices are
    measured one after another, and a host that is busier for a while (another process thrashing
    the caches a simulated GPU computes in) slows the devices measured then, which a comparison
    of best figures taken at different moments would blame on one GPU."""
    out: dict[int, TestResult] = {}
    for gpu, value in values.items():
        others = [v for g, v in values.items() if g != gpu]
        verdicts, reasons, expected = [Verdict.PASS], [], None
        if others:
            ratio = _peer_ratio(gpu, rounds) if rounds else None
            if ratio is None:
                ref = statistics.median(others)
                ratio = value / ref if ref > 0 else 1.0
            else:
                ref = value / ratio if ratio > 0 else statistics.median(others)
            verdicts.append(_grade(ratio, PEER_FLOOR[name]))
            reasons.append(f"{ratio:.0%} of peers ({ref:.4g} {unit})")
            expected = ref
        top = (peak or {}).get(gpu)
        if top:
            verdicts.append(_grade(value / top, peak_floor))
            reasons.append(f"{value / top:.0%} of the model's peak {top:.4g} {unit}")
            expected = expected if expected is not None else top
        if not others and not top and own_reference:
            ratio = value / own_reference
            verdicts.append(_grade(ratio, (0.5, 0.25)))
            reasons.append(f"{ratio:.0%} of a plain loop on this machine ({own_reference:.4g} {unit})")
            expected = own_reference
        if len(verdicts) == 1:
            reasons.append("no peers or model figure to compare with")
        if detail and gpu in detail:
            reasons.append(detail[gpu])
        out[gpu] = TestResult(name, worst_verdict(verdicts), value, expected, unit, "; ".join(reasons))
    return out


def _peer_ratio(gpu: int, rounds: dict[int, list[float]]) -> float | None:
    """The median over the rounds of ``gpu``'s figure / the median of its peers' in that round
    (None: the rounds do not line up)."""
    n = len(rounds.get(gpu, []))
    if n == 0 or len(rounds) < 2 or any(len(v) != n for v in rounds.values()):
        return None
    ratios = []
    for k in range(n):
        ref = statistics.median(v[k] for g, v in rounds.items() if g != gpu)
        ratios.append(rounds[gpu][k] / ref if ref > 0 else 1.0)
    return statistics.median(ratios)


def sdc_reference(digests: dict[int, list[str]], keys: dict[int, str]) -> dict[str, str]:
    """The majority result per workload key (GPU model, torch, size) over every round of every GPU."""
    votes: dict[str, Counter[str]] = {}
    for gpu, rounds in digests.items():
        votes.setdefault(keys[gpu], Counter()).update(rounds)
    return {key: c.most_common(1)[0][0] for key, c in votes.items()}


def judge_sdc(
    digests: dict[int, list[str]], keys: dict[int, str], golden: dict[str, str] | None = None
) -> dict[int, TestResult]:
    """Every round of every GPU against the golden checksum of its workload key (``keys``: GPU
    model, torch version and size), which a first run recorded (``golden``), else against the
    majority result of the node's GPUs of that key. Any mismatch fails the GPU it came from."""
    majority = sdc_reference(digests, keys)
    out: dict[int, TestResult] = {}
    for gpu, rounds in digests.items():
        recorded = (golden or {}).get(keys[gpu])
        reference = recorded or majority[keys[gpu]]
        differ = sum(1 for d in rounds if d != reference)
        if differ == 0:
            against = "the golden checksum" if recorded else "the node"
            out[gpu] = TestResult.ok(
                "sdc", 0, 0, "rounds differing", f"{len(rounds)} rounds bit-identical to {against}"
            )
            continue
        if recorded:
            why = f"{differ} of {len(rounds)} rounds differ from the golden checksum of the first run"
        else:
            peers = sum(1 for g in digests if keys[g] == keys[gpu]) - 1
            why = f"{differ} of {len(rounds)} rounds differ from the result of {peers} peer GPU(s)"
        if len(set(rounds)) > 1:
            why += f"; its own rounds disagree ({len(set(rounds))} distinct results)"
        out[gpu] = TestResult.fail("sdc", why, differ, 0, "rounds differing")
    return out


def judge_pattern(bad_bytes: int, total_bytes: int, patterns: int) -> TestResult:
    where = f"{total_bytes / 2**20:.0f} MiB x {patterns} patterns"
    if bad_bytes:
        return TestResult.fail(
            "memory_pattern", f"{bad_bytes} byte(s) read back wrong over {where}", bad_bytes, 0, "bad bytes"
        )
    return TestResult.ok("memory_pattern", 0, 0, "bad bytes", f"{where} read back intact")


def judge_interconnect(per_gpu: dict[int, float], ring_busbw: float | None, n: int) -> dict[int, TestResult]:
    """Each GPU's best pairwise bus bandwidth against its peers; the all-GPU ring's figure is context."""
    ring = f"all-reduce over {n} GPUs: {ring_busbw:.3g} GB/s busbw" if ring_busbw else ""
    detail = dict.fromkeys(per_gpu, ring) if ring else None
    results = judge_against_peers("interconnect", per_gpu, "GB/s", detail=detail)
    for gpu, r in results.items():
        if r.verdict is Verdict.FAIL:
            results[gpu] = TestResult(
                r.name, r.verdict, r.value, r.expected, r.unit, f"GPU {gpu}'s link: {r.reason}"
            )
    return results


@dataclass(frozen=True, slots=True)
class ThermalTrace:
    """Readings of one GPU taken while it was under load, with seconds since the load began."""

    readings: tuple[tuple[float, Sample | None], ...]


_HARD = {Throttle.HW_THERMAL, Throttle.HW_SLOWDOWN, Throttle.HW_POWER_BRAKE}


def judge_thermal(trace: ThermalTrace) -> TestResult:
    """Fail on a hardware throttle, a power brake or reaching the slowdown temperature under load
    (with the time it set in); warn on a software thermal slowdown. Power capping is normal."""
    name = "thermal_power"
    seen = [(t, s) for t, s in trace.readings if s is not None and not s.lost]
    if not seen:
        return TestResult.skip(name, "no telemetry under load")
    temps = [s.temperature_c for _, s in seen if s.temperature_c is not None]
    peak = max(temps) if temps else None
    slowdown = next((s.temp_slowdown_c for _, s in seen if s.temp_slowdown_c), None)
    power = max((s.power_w for _, s in seen if s.power_w is not None), default=None)
    limit = next((s.power_limit_w for _, s in seen if s.power_limit_w), None)
    context = f"{len(seen)} readings over {seen[-1][0]:.1f} s" + (
        f", power up to {power:.0f} of {limit:.0f} W" if power is not None and limit else ""
    )
    expected = f"< {slowdown:.0f}" if slowdown else None
    for t, s in seen:
        hard = sorted(r.value for r in (s.throttle or ()) if r in _HARD)
        hot = slowdown is not None and s.temperature_c is not None and s.temperature_c >= slowdown
        if hard or hot:
            what = ", ".join(hard) if hard else "slowdown temperature"
            why = f"{what} after {t:.1f} s under load ({s.temperature_c:.0f} C); {context}"
            return TestResult.fail(name, why, peak, expected, "C")
    soft = next((t for t, s in seen if Throttle.SW_THERMAL in (s.throttle or ())), None)
    if soft is not None:
        return TestResult(
            name, Verdict.WARN, peak, expected, "C", f"sw_thermal after {soft:.1f} s under load; {context}"
        )
    return TestResult.ok(name, peak, expected, "C", f"no throttling; {context}")
