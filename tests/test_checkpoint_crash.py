"""Crash consistency in small: SIGKILLed savers always leave a valid newest checkpoint behind, every
corruption of a stored file (flipped bit, zeroed page, swapped blocks, truncation) is detected, and
no power-loss crash state of a recorded save resumes from a bad checkpoint (the benchmark runs 100
kills; the death of the background writer is tested in test_checkpoint_torch)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_crash_consistency.py"


@pytest.mark.slow
def test_sigkilled_saves_always_resume_from_a_valid_checkpoint_and_flips_are_detected():
    out = subprocess.run(
        [sys.executable, str(BENCH), "--kills", "10", "--corruptions", "10", "--async-kills", "0", "--power-loss-saves", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(out.stdout)
    assert result["kills"] == 10
    assert result["valid_resumes"] == 10, result["problems"]
    for kind, counts in result["corruptions"].items():
        assert counts["tried"] == 10 and counts["detected"] == 10, kind
    assert {"flip", "truncate"} <= set(result["corruptions"])
    assert result["corruption_bad_resumes"] == 0 and result["power_loss_bad_resumes"] == 0
    if shutil.which("strace"):  # the power-loss crash states need a recorded save
        assert result["power_loss_states"] > 0
    assert out.returncode == 0, out.stderr[-2000:]
