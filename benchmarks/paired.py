"""Statistics of interleaved A/B benchmark rounds, and the targets a benchmark checks.

Each round runs trainguard (A) and the baseline (B) back to back on the same work, the order
reversed every other round (A B, B A, ...), so slow drifts of a shared machine's load hit both
sides alike. A round gives one paired figure (a ratio A/B or a difference A - B); the rounds are
independent, so their spread is the noise of this machine at this time.

    from paired import interleave, ratio_ci, missed
    a, b = interleave(3, run_ours, run_theirs)     # lists of 3 figures each
    r = ratio_ci(a, b)                             # geometric mean of a_i / b_i and its 95% CI

Kept stdlib-only so every benchmark (and tests/test_bench_paired.py) can import it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from targets import Target, misses

T = TypeVar("T")

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; above 30 the normal 1.96
# is within 4% and on the conservative side of nothing we report.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
        2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t95 needs at least 1 degree of freedom, got {df}")
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure from ``repeats`` rounds and its 95% confidence interval (None with 1 round)."""

    value: float
    ci95: tuple[float, float] | None
    repeats: int

    def resolved_above(self, x: float) -> bool:
        """The whole interval lies above ``x`` (the data decide the sign of value - x)."""
        return self.ci95 is not None and self.ci95[0] > x

    def as_json(self, key: str, digits: int = 4) -> dict[str, Any]:
        """``{key: value, key_ci95: [lo, hi] or None, key_repeats: n}``."""
        ci = None if self.ci95 is None else [round(self.ci95[0], digits), round(self.ci95[1], digits)]
        return {key: round(self.value, digits), f"{key}_ci95": ci, f"{key}_repeats": self.repeats}


def mean_ci(values: Sequence[float]) -> Estimate:
    """The mean and its t-interval (rounds independent, their mean roughly normal)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    m = statistics.fmean(values)
    if n == 1:
        return Estimate(m, None, 1)
    half = t95(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Estimate(m, (m - half, m + half), n)


def diff_ci(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Mean of the paired differences a_i - b_i and its 95% t-interval."""
    _same_length(a, b)
    return mean_ci([x - y for x, y in zip(a, b, strict=True)])


def ratio_ci(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Geometric mean of the paired ratios a_i / b_i and its 95% interval (a t-interval on the
    log ratios, mapped back): ratios multiply, so their logs are what averages fairly."""
    _same_length(a, b)
    if any(x <= 0 for x in (*a, *b)):
        raise ValueError("ratio_ci needs positive figures on both sides")
    logs = mean_ci([math.log(x / y) for x, y in zip(a, b, strict=True)])
    ci = None if logs.ci95 is None else (math.exp(logs.ci95[0]), math.exp(logs.ci95[1]))
    return Estimate(math.exp(logs.value), ci, logs.repeats)


def median_ci(values: Sequence[float]) -> Estimate:
    """The median with a distribution-free interval of at least 95%: the order statistics x(k)
    and x(n+1-k) for the largest k with P(Bin(n, 1/2) < k) <= 2.5%. None below 6 rounds."""
    n, k = len(values), 0
    if n == 0:
        raise ValueError("median_ci needs at least one value")
    while sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 0.025:
        k += 1
    ranked = sorted(values)
    ci = (ranked[k - 1], ranked[n - k]) if k else None
    return Estimate(statistics.median(values), ci, n)


def interleave(rounds: int, a: Callable[[int], T], b: Callable[[int], T]) -> tuple[list[T], list[T]]:
    """Run ``a(i)`` and ``b(i)`` for each round i, A B in even rounds and B A in odd ones."""
    xs: list[T] = []
    ys: list[T] = []
    for i in range(rounds):
        if i % 2 == 0:
            xs.append(a(i))
            ys.append(b(i))
        else:
            ys.append(b(i))
            xs.append(a(i))
    return xs, ys


def rotate(rounds: int, *arms: Callable[[int], T]) -> list[list[T]]:
    """Each arm's figures of ``rounds`` rounds; round i runs the arms in their order rotated by i
    (A B C, B C A, C A B, ...), so each arm runs first, middle and last alike. With two arms it is
    ``interleave``'s A B, B A."""
    out: list[list[T]] = [[] for _ in arms]
    for i in range(rounds):
        for k in range(len(arms)):
            j = (i + k) % len(arms)
            out[j].append(arms[j](i))
    return out


def missed(out: Mapping[str, Any], targets: Mapping[str, tuple[str, float] | Target]) -> list[str]:
    """The targets ``out`` misses (``{key: (op, bound)}`` or ``{key: Target}``, checked by
    ``targets.Target``); a key that is absent or None misses its target (the figure could not be
    measured)."""
    return misses([_target(key, t) for key, t in targets.items()], out)


def targets_json(targets: Mapping[str, tuple[str, float] | Target]) -> dict[str, str]:
    out = {}
    for key, t in targets.items():
        target = _target(key, t)
        on = "" if target.on == "value" else f" (on the 95% CI's {target.on.removeprefix('ci_')} end)"
        out[key] = f"{target.op} {target.value:g}{on}"
    return out


def _target(key: str, t: tuple[str, float] | Target) -> Target:
    return t if isinstance(t, Target) else Target(key, t[0], t[1])


def _same_length(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b) or not a:
        raise ValueError(f"paired figures need equal, non-empty lists (got {len(a)} and {len(b)})")
