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
        [
            sys.executable,
            str(BENCH),
            "--kills",
            "10",
            "--corruptions",
            "10",
            "--async-kills",
            "1",
            "--power-loss-saves",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(out.stdout)
    assert result["kills"] == 11  # 10 savers, 1 background writer
    assert result["valid_resumes"] == 11, result["problems"]
    assert result["async_errors_raised"] == 1
    assert all(c["detected"] == c["tried"] == 10 for c in result["corruptions"].values())
    assert result["power_loss_bad_resumes"] == 0 and result["bad_resumes"] == 0
    assert out.returncode == 0
