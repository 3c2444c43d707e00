"""Each benchmark's targets, checked where its figures are computed, so `make bench` fails on a miss.

    from targets import Target, finish

    TARGETS = (Target("rps", ">=", 1000), Target("p99_ms", "<=", 50))
    ...
    return finish("bench_agent", TARGETS, out, json_mode=args.json)

``finish`` prints one line per target (to stderr in --json mode, so stdout stays one JSON object)
and returns the exit code: 1 when a target is missed or a figure it needs was not measured, else 0.
A target marked ``optional`` is skipped when its figure is absent (a mode that does not measure it).
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


@dataclass(frozen=True, slots=True)
class Target:
    key: str  # the figure's key in the benchmark's result
    op: str  # one of <= < >= > ==
    value: float
    optional: bool = False  # absent figure: not measured in this mode, not a miss

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(
                f"target {self.key}: unknown comparison {self.op!r} (use one of {', '.join(_OPS)})"
            )

    def check(self, figures: Mapping[str, Any]) -> tuple[bool | None, str]:
        """(met: True/False, None when skipped; the line that says so)."""
        want = f"{self.key} {self.op} {self.value:g}"
        if self.key not in figures and self.optional:
            return None, f"target {want}: not measured in this mode"
        got = figures.get(self.key)
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
