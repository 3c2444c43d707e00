"""A Keras job killed with SIGKILL and started again ends with the weights of an uninterrupted one,
bitwise (examples/train_keras.py on CPU, real TensorFlow and Keras 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_parts import require_module
from trainguard.checkpoint import list_checkpoints

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_keras.py"
ARGS = ["--deterministic", "--steps", "135", "--verbose", "0", "--checkpoint-every", "20"]


def run(ckpt: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(ckpt), *ARGS],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def final_state(ckpt: Path) -> dict[str, object]:
    import numpy as np

    newest = list_checkpoints(ckpt)[-1]
    with np.load(newest.path / "state.npz") as npz:
        return {"step": newest.step, **{k: npz[k] for k in npz.files}}


@pytest.mark.slow
def test_a_killed_keras_job_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    np = require_module("numpy", install="make install")
    require_module(
        "tensorflow", install="make install (tensorflow-cpu 2.21; users: pip install 'trainguard[tf]')"
    )
    reference = run(tmp_path / "whole")
    _, err = reference.communicate(timeout=600)
    assert reference.returncode == 0, err.decode()[-2000:]

    # The job hangs at step 67 (a chaos fault, recorded before it takes effect), then dies of SIGKILL.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "chaos.json").write_text(json.dumps({"faults": [{"kind": "hang", "rank": 0, "step": 67}]}))
    env = {"TRAINGUARD_RUN_DIR": str(run_dir)}
    victim = run(tmp_path / "ckpt", env)
    try:
        while not (run_dir / "chaos-fired").is_dir() and victim.poll() is None:
            time.sleep(0.2)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    assert [c.step for c in list_checkpoints(tmp_path / "ckpt")][-1] == 60

    resumed = run(tmp_path / "ckpt", env)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err.decode()[-2000:]
    whole, again = final_state(tmp_path / "whole"), final_state(tmp_path / "ckpt")
    assert whole["step"] == again["step"] == 135
    assert sorted(whole) == sorted(again)
    assert [k for k in whole if not np.array_equal(whole[k], again[k])] == []
