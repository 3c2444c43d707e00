"""Crash consistency in small: SIGKILLed savers and a killed background writer always leave a valid
newest checkpoint behind, every corruption of a stored file (flipped bit, zeroed page, swapped
blocks, truncation) is detected, and no power-loss crash state of a save recorded under strace
resumes from a bad checkpoint (the benchmark runs 100 kills)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_parts import require_real

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_crash_consistency.py"


@pytest.mark.slow
def test_sigkilled_saves_always_resume_from_a_valid_checkpoint_and_flips_are_detected():
    require_real(
        "strace", install="apt-get install strace (make integration-deps); records the power-loss saves"
    )
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
    # Whether the writer dies before or after its save landed is up to the kill's random delay:
    # either way the resume is valid (asserted above); the error surfacing is in test_checkpoint_torch.
    assert result["async_errors_raised"] <= 1
    assert all(c["detected"] == c["tried"] == 10 for c in result["corruptions"].values())
    assert result["power_loss_states"] > 0, result["problems"]  # the power-loss check really ran
    assert result["power_loss_bad_resumes"] == 0 and result["bad_resumes"] == 0
    assert out.returncode == 0


def test_a_saver_killed_before_it_made_its_folder_leaves_a_fresh_start_not_a_crash(tmp_path, monkeypatch):
    # Beside two CPU hogs the benchmark's kill once came before the saver had created its folder,
    # and listing the folder for torn saves crashed the benchmark (a make test failed).
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import bench_crash_consistency as bench

    monkeypatch.setattr(bench, "_saver", lambda *args: time.sleep(60))  # killed before any save
    valid, torn, problems = bench.run_kills(tmp_path / "sync", 1, random.Random(0), 0.0)
    assert (valid, torn, problems) == (1, 0, [])  # resumed from step 0, as nothing was saved
