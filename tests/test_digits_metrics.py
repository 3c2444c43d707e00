"""examples/train_digits.py --metrics: one line per applied step with that step's own loss."""

from __future__ import annotations

import functools
import itertools
import json
import math
import sys

import pytest

pytest.importorskip("sklearn")


def _run(monkeypatch, *args: str) -> None:
    from trainguard.demo import train_digits
    from trainguard.torch import Guard

    monkeypatch.setattr(sys, "argv", ["train_digits.py", *args])
    # The lazy check of a multi-rank job on one process: losses are read 8 at a time, a step late.
    monkeypatch.setattr(train_digits, "Guard", functools.partial(Guard, check_every=8, check_lag=1))
    train_digits.main()


@pytest.mark.slow
def test_metrics_hold_each_steps_own_loss_also_after_a_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("TRAINGUARD_RUN_DIR", raising=False)
    metrics = tmp_path / "metrics.jsonl"
    common = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "10"]
    common += ["--metrics", str(metrics), "--batch-size", "8"]
    _run(monkeypatch, "--steps", "10", *common)
    _run(monkeypatch, "--steps", "20", *common)  # resumes from the checkpoint of step 10
    assert "resumed from step 10" in capsys.readouterr().out
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(20))
    losses = [m["loss"] for m in lines]
    assert all(isinstance(x, float) and math.isfinite(x) for x in losses)  # no null after the resume
    # Each step's own loss: consecutive steps on different batches never repeat a value.
    assert all(a != b for a, b in itertools.pairwise(losses))
