"""What a diagnostic run returns: one ``TestResult`` per test and GPU, folded into a node verdict.

Every test reports what it measured, what it compared that with, the unit and a verdict; a test
that could not run says why (``skip``). The node verdict is the worst verdict of the tests that
ran; when none ran the run could not diagnose anything (exit 3)::

    >>> r = Report(level=1, backend="cpu", gpus=(GpuReport(0, "cpu", (TestResult.ok("torch", "2.4", ">= 2.4"),)),))
    >>> r.verdict.value, r.exit_code
    ('pass', 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trainguard.records import Health

__all__ = ["GpuReport", "Report", "TestResult", "Verdict", "worst_verdict"]

Value = float | int | str | None


class Verdict(str, Enum):
    """A test's outcome. ``skip`` is "could not run here" (the reason says why), never a pass."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"

    @property
    def health(self) -> Health:
        return _HEALTH[self]

    @property
    def exit_code(self) -> int:
        """0 pass, 1 warn, 2 fail, 3 could not run."""
        return _EXIT[self]


_HEALTH = {Verdict.PASS: Health.OK, Verdict.WARN: Health.DEGRADED, Verdict.FAIL: Health.FAILED}
_HEALTH[Verdict.SKIP] = Health.UNKNOWN
_EXIT = {Verdict.PASS: 0, Verdict.WARN: 1, Verdict.FAIL: 2, Verdict.SKIP: 3}
_RANK = {Verdict.SKIP: 0, Verdict.PASS: 1, Verdict.WARN: 2, Verdict.FAIL: 3}


def worst_verdict(verdicts: list[Verdict] | tuple[Verdict, ...]) -> Verdict:
    """The worst verdict among those that ran (fail > warn > pass); SKIP when none ran."""
    return max(verdicts, key=_RANK.__getitem__, default=Verdict.SKIP)


@dataclass(frozen=True, slots=True)
class TestResult:
    """One test on one GPU (or on the node, for software checks)."""

    name: str
    verdict: Verdict
    value: Value = None  # what was measured
    expected: Value = None  # what it was compared with (a figure, or a condition like ">= 12.1")
    unit: str = ""
    reason: str = ""  # why the verdict, in words (for skip: why it could not run)
    seconds: float = 0.0  # how long the test took

    __test__ = False  # not a pytest class

    @classmethod
    def ok(
        cls, name: str, value: Value = None, expected: Value = None, unit: str = "", reason: str = ""
    ) -> TestResult:
        return cls(name, Verdict.PASS, value, expected, unit, reason)

    @classmethod
    def skip(cls, name: str, reason: str) -> TestResult:
        return cls(name, Verdict.SKIP, reason=reason)

    @classmethod
    def fail(
        cls, name: str, reason: str, value: Value = None, expected: Value = None, unit: str = ""
    ) -> TestResult:
        return cls(name, Verdict.FAIL, value, expected, unit, reason)

    def to_dict(self) -> dict[str, Any]:
        value = round(self.value, 4) if isinstance(self.value, float) else self.value
        expected = round(self.expected, 4) if isinstance(self.expected, float) else self.expected
        return {
            "name": self.name,
            "value": value,
            "expected": expected,
            "unit": self.unit,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class GpuReport:
    index: int
    name: str
    tests: tuple[TestResult, ...] = ()

    @property
    def verdict(self) -> Verdict:
        return worst_verdict([t.verdict for t in self.tests])

    def test(self, name: str) -> TestResult | None:
        return next((t for t in self.tests if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "verdict": self.verdict.value,
            "tests": [t.to_dict() for t in self.tests],
        }


@dataclass(frozen=True, slots=True)
class Report:
    """A whole run: node-wide software checks, then every GPU's tests."""

    level: int
    backend: str
    gpus: tuple[GpuReport, ...] = ()
    node: tuple[TestResult, ...] = ()  # checks of the node itself (versions, GPU count, NCCL)
    seconds: float = 0.0
    error: str | None = None  # why the run could not start (then verdict is skip, exit 3)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the scenario name

    @property
    def verdict(self) -> Verdict:
        if self.error is not None:
            return Verdict.SKIP
        return worst_verdict([t.verdict for t in self.node] + [g.verdict for g in self.gpus])

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def health(self) -> Health:
        return self.verdict.health

    def gpu(self, index: int) -> GpuReport | None:
        return next((g for g in self.gpus if g.index == index), None)

    def gpu_health(self, index: int) -> Health:
        """One GPU's health, counting the node checks it depends on (a broken driver fails them all)."""
        g = self.gpu(index)
        if g is None or self.error is not None:
            return Health.UNKNOWN
        return worst_verdict([t.verdict for t in self.node] + [g.verdict]).health

    def failures(self) -> list[tuple[int | None, TestResult]]:
        """(GPU or None for the node, test) of every failed or warning test, worst first."""
        found = [(None, t) for t in self.node] + [(g.index, t) for g in self.gpus for t in g.tests]
        bad = [(i, t) for i, t in found if t.verdict in (Verdict.FAIL, Verdict.WARN)]
        return sorted(bad, key=lambda it: -_RANK[it[1].verdict])

    def summary(self) -> str:
        """One line for an incident or a log: ``GPU 2 compute fail: 48% of peers; ...``."""
        if self.error is not None:
            return f"could not run: {self.error}"
        bad = self.failures()
        if not bad:
            ran = sum(1 for g in self.gpus for t in g.tests if t.verdict is not Verdict.SKIP)
            return f"{self.verdict.value}: {ran} tests on {len(self.gpus)} GPU(s)"
        return "; ".join(
            f"{'node' if i is None else f'GPU {i}'} {t.name} {t.verdict.value}: {t.reason}" for i, t in bad
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "level": self.level,
            "backend": self.backend,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "summary": self.summary(),
            "node": {"tests": [t.to_dict() for t in self.node]},
            "gpus": [g.to_dict() for g in self.gpus],
            **self.extra,
        }
