"""`trainguard plan --from-job`: the planner takes a recorded job's measured costs."""

from __future__ import annotations

import json

import pytest

from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, RootCause
from trainguard.incidents.goodput import Interval, IntervalKind
from trainguard.reliability.planner import job_costs


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "tg.db"
    K = IntervalKind
    with IncidentStore(path) as store:
        store.start_job("j", started=0.0, world_size=16)
        store.add_intervals(
            [
                Interval("j", K.INIT, 0, 50, attempt=0),
                Interval("j", K.PRODUCTIVE, 50, 3000, attempt=0),
                Interval("j", K.CHECKPOINT, 1000, 1012, attempt=0),
                Interval("j", K.CHECKPOINT, 2000, 2008, attempt=0),
                Interval("j", K.LOST, 2500, 3000, attempt=0),
                Interval("j", K.DETECTION, 3000, 3010, attempt=0),
                Interval("j", K.RESTART, 3010, 3070, attempt=1),
                Interval("j", K.INIT, 3070, 3100, attempt=1),
                Interval("j", K.PRODUCTIVE, 3100, 6000, attempt=1),
                Interval("j", K.CHECKPOINT, 4000, 4010, attempt=1),
                Interval("j", K.CHECKPOINT, 5000, 5010, attempt=1),
            ]
        )
        store.add(Incident(job="j", time=3010.0, root_cause=RootCause.FAULTY_GPU, gpu=1))
        store.end_job("j", ended=6000.0, status="succeeded")
    return path


def test_job_costs_are_the_measured_checkpoint_stall_and_recovery(store_path):
    with IncidentStore(store_path, create=False) as store:
        costs = job_costs(store, "j")
    assert costs.world_size == 16
    assert costs.checkpoints == 4
    assert costs.write_s == pytest.approx(10.0)  # (12 + 8 + 10 + 10) / 4
    assert costs.interruptions == 1
    assert costs.restart_s == pytest.approx(100.0)  # detection 10 + restart 60 + re-init 30
    assert costs.interval_s is not None and costs.interval_s > 0


def test_plan_from_job_uses_the_measured_costs_and_flags_override_them(store_path, capsys):
    assert main(["plan", "--from-job", "j", "--db", str(store_path), "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["gpus"] == 16
    assert p["checkpoint_write_seconds"] == pytest.approx(10.0)
    assert p["restart_minutes"] == pytest.approx(100.0 / 60)
    assert p["cost_source"].startswith("job j: measured")
    assert main(["plan", "--from-job", "j", "--db", str(store_path), "--restart-minutes", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["restart_minutes"] == 5.0


def test_plan_from_an_unknown_job_says_so(store_path, capsys):
    assert main(["plan", "--from-job", "nope", "--db", str(store_path)]) == 2
    assert "no job 'nope'" in capsys.readouterr().err


def test_plan_without_a_size_is_a_usage_error(capsys):
    assert main(["plan"]) == 2
    assert "--gpus N or --nodes N" in capsys.readouterr().err
