"""`make bench` fails when a benchmark misses a target: each benchmark checks its figures against
its targets (benchmarks/targets.py) and exits non-zero on a miss."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from targets import Target, finish, misses  # noqa: E402


def test_a_missed_target_fails_and_a_met_one_passes():
    targets = (Target("rps", ">=", 1000), Target("p99_ms", "<=", 50))
    out = io.StringIO()
    assert finish("b", targets, {"rps": 1200, "p99_ms": 12.0}, stream=out) == 0
    assert "target rps >= 1000: 1200 met" in out.getvalue()
    out = io.StringIO()
    assert finish("b", targets, {"rps": 999.9, "p99_ms": 12.0}, stream=out) == 1
    assert "target rps >= 1000: 999.9 MISSED" in out.getvalue() and "1 target(s) missed" in out.getvalue()


@pytest.mark.parametrize("figures", [{}, {"ratio": None}, {"ratio": float("nan")}, {"ratio": "fast"}])
def test_a_figure_that_was_not_measured_is_a_miss(figures):
    assert misses((Target("ratio", ">=", 1.05),), figures)


def test_an_optional_target_is_skipped_only_when_its_figure_is_absent():
    target = Target("sim8_level2_seconds", "<=", 60, optional=True)
    assert finish("b", (target,), {}, stream=io.StringIO()) == 0
    assert finish("b", (target,), {"sim8_level2_seconds": 75.0}, stream=io.StringIO()) == 1


def test_bad_comparisons_are_refused():
    with pytest.raises(ValueError, match="unknown comparison"):
        Target("x", "=>", 1)


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("bench_*.py")), ids=lambda p: p.name)
def test_every_benchmark_exits_with_its_targets_verdict(path):
    text = path.read_text()
    # Its exit code comes from its targets (bench_crash_consistency computes its own 0/1).
    assert "finish(" in text or re.search(r"return (0 if .* else 1|1 if .* else 0)", text), path.name
    assert "return 0\n" not in text.split("def main", 1)[1], (
        f"{path.name}'s main returns 0 whatever it measured"
    )


def test_make_bench_runs_every_benchmark_and_fails_on_any_miss():
    dry = subprocess.run(
        ["make", "-n", "bench"], cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    assert "|| exit 1" not in dry.stdout and "exit 1" in dry.stdout


def test_a_target_on_the_ci_low_end_is_missed_when_only_the_point_meets_it():
    # bench_ettr's case: point 1.069, 95% CI 1.004-1.139 against ">= 1.05"
    figures = {"ratio": 1.069, "ratio_ci95": [1.004, 1.139]}
    assert not misses((Target("ratio", ">=", 1.05),), figures)
    out = io.StringIO()
    assert finish("b", (Target("ratio", ">=", 1.05, on="ci_low"),), figures, stream=out) == 1
    assert "ratio CI's low end >= 1.05: 1.004 MISSED" in out.getvalue()
    assert not misses((Target("ratio", ">=", 1.05, on="ci_low"),), {"ratio": 1.2, "ratio_ci95": [1.06, 1.3]})


@pytest.mark.parametrize("ci", [None, [1.1], "wide"])
def test_a_target_on_a_ci_end_without_an_interval_is_a_miss(ci):
    assert misses((Target("ratio", ">=", 1.05, on="ci_low"),), {"ratio": 1.2, "ratio_ci95": ci})


def test_an_unknown_ci_end_is_refused():
    with pytest.raises(ValueError, match="unknown on="):
        Target("x", ">=", 1, on="ci_mid")
