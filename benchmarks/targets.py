"""Each benchmark's targets, checked where its figures are computed, so `make bench` fails on a miss.

    from targets import Target, finish

    TARGETS = (Target("rps", ">=", 1000), Target("p99_ms", "<=", 50))
    ...
    return finish("bench_agent", TARGETS, out, json_mode=args.json)

``finish`` prints one line per target (to stderr in --json mode, so stdout stays one JSON object)
and returns the exit code: 1 when a target is missed or a figure it needs was not measured, else 0.
A target marked ``optional`` is skipped when its figure is absent (a mode that does not measure it).
A target ``on="ci_low"`` (or ``"ci_high"``) is judged on an end of the figure's 95% interval
(``<key>_ci95``, written by ``paired.Estimate.as_json``), not on its point value: ``Target("ratio",
">=", 1.05, on="ci_low")`` is met only when the data put the whole interval at or above 1.05.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = ["Target", "finish", "misses"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}


_ENDS = {"value": -1, "ci_low": 0, "ci_high": 1}


@dataclass(frozen=True, slots=True)
class Target:
    key: str  # the figure's key in the benchmark's result
    op: str  # one of <= < >= > ==
    value: float
    optional: bool = False  # absent figure: not measured in this mode, not a miss
    on: str = "value"  # what is judged: the point value, or "ci_low" / "ci_high" of <key>_ci95

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(
                f"target {self.key}: unknown comparison {self.op!r} (use one of {', '.join(_OPS)})"
            )
        if self.on not in _ENDS:
            raise ValueError(f"target {self.key}: unknown on={self.on!r} (use one of {', '.join(_ENDS)})")

    def check(self, figures: Mapping[str, Any]) -> tuple[bool | None, str]:
        """(met: True/False, None when skipped; the line that says so)."""
        judged = self.key if self.on == "value" else f"{self.key} CI's {self.on.removeprefix('ci_')} end"
        want = f"{judged} {self.op} {self.value:g}"
        if self.key not in figures and self.optional:
            return None, f"target {want}: not measured in this mode"
        got = figures.get(self.key)
        if self.on != "value":
            ci = figures.get(f"{self.key}_ci95")
            got = ci[_ENDS[self.on]] if isinstance(ci, (list, tuple)) and len(ci) == 2 else None
        if not isinstance(got, (int, float)) or isinstance(got, bool) or math.isnan(got):
            return False, f"target {want}: MISSED (not measured: {got!r})"
        met = _OPS[self.op](float(got), self.value)
        return met, f"target {want}: {got:g} {'met' if met else 'MISSED'}"


def misses(targets: Iterable[Target], figures: Mapping[str, Any]) -> list[str]:
    """The lines of the targets ``figures`` miss."""
    return [line for t in targets for met, line in [t.check(figures)] if met is False]


def finish(
    name: str,
    targets: Iterable[Target],
    figures: Mapping[str, Any],
    *,
    json_mode: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Print each target's outcome; 1 if any is missed, else 0 (the benchmark's exit code)."""
    out = stream if stream is not None else (sys.stderr if json_mode else sys.stdout)
    missed = 0
    for target in targets:
        met, line = target.check(figures)
        missed += met is False
        print(f"{name}: {line}", file=out)
    if missed:
        print(f"{name}: {missed} target(s) missed", file=out)
    return 1 if missed else 0
