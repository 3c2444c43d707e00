"""Crash consistency in small: SIGKILLed savers always leave a valid newest checkpoint behind, and
every flipped bit or truncation of a stored file is detected (the benchmark runs 200 kills;
the death of the background writer is tested in test_checkpoint_torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_crash_consistency.py"


@pytest.mark.slow
def test_sigkilled_saves_always_resume_from_a_valid_checkpoint_and_flips_are_detected():
    out = subprocess.run(
        [sys.executable, str(BENCH), "--kills", "10", "--flips", "40", "--async-kills", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(out.stdout)
    assert result["kills"] == 10
    assert result["valid_resumes"] == 10, result["problems"]
    assert result["flips"] == 40 and result["flips_detected"] == 40
    assert result["truncations_detected"] == result["truncations"] == 10
    assert out.returncode == 0
