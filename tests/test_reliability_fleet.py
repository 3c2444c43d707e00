"""Fleet analytics over the incident store: MTBF, lemons, trend; `report --fleet`;
`reliability fit --store`."""

from __future__ import annotations

import json
import random

import pytest

from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, RootCause
from trainguard.incidents.goodput import JobInfo
from trainguard.reliability.fleet import fleet_report, laplace_trend, poisson_sf

HOUR = 3600.0


def _fleet(lemon_share: float, seed: int = 1, rising: bool = False) -> tuple[list[Incident], list[JobInfo]]:
    rng = random.Random(seed)
    jobs = [
        JobInfo(job=f"j{k}", started=k * 100 * HOUR, ended=(k + 1) * 100 * HOUR, world_size=64)
        for k in range(4)
    ]
    incidents = []
    for job in jobs:
        assert job.started is not None and job.ended is not None
        t = job.started
        while True:
            t += rng.expovariate(1 / (4 * HOUR))
            if t >= job.ended:
                break
            if rising and rng.random() > t / (400 * HOUR):
                continue  # thinning: the rate grows linearly with time
            node, gpu = f"n{rng.randrange(8)}", rng.randrange(8)
            if rng.random() < lemon_share:
                node, gpu = "n3", 5
            incidents.append(
                Incident(job=job.job, time=t, root_cause=RootCause.FAULTY_GPU, node=node, gpu=gpu)
            )
    return incidents, jobs


def test_a_gpu_that_fails_far_more_often_than_the_fleet_is_a_lemon():
    r = fleet_report(*_fleet(lemon_share=0.2))
    assert r["lemon_gpus"] == ["n3/gpu5"]
    assert r["gpus"][0]["unit"] == "n3/gpu5"
    assert r["observed_hours"] == pytest.approx(400.0)
    assert r["mtbf_hours"] == pytest.approx(400.0 / r["incidents"], rel=1e-3)


def test_a_fleet_without_a_lemon_flags_none():
    # 64 GPUs sharing ~100 incidents: someone gets 5 by chance, which is not a lemon.
    assert fleet_report(*_fleet(lemon_share=0.0))["lemon_gpus"] == []


def test_a_rising_failure_rate_is_a_rising_trend():
    assert fleet_report(*_fleet(0.0, rising=True))["trend"]["verdict"] == "rising"
    assert fleet_report(*_fleet(0.0))["trend"]["verdict"] == "flat"


def test_laplace_trend_of_evenly_spread_events_is_zero():
    assert laplace_trend([1, 2, 3, 4, 5, 6, 7, 8, 9], 0, 10) == pytest.approx(0.0)
    assert laplace_trend([1, 2], 0, 10) is None


def test_poisson_tail_matches_hand_values():
    assert poisson_sf(0, 2.0) == 1.0
    assert poisson_sf(1, 2.0) == pytest.approx(1 - 0.1353352832, abs=1e-9)
    assert poisson_sf(3, 1.0) == pytest.approx(1 - 2.5 * 0.3678794412, abs=1e-9)


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "tg.db"
    incidents, jobs = _fleet(lemon_share=0.2)
    with IncidentStore(path) as store:
        for j in jobs:
            assert j.started is not None and j.ended is not None
            store.start_job(j.job, started=j.started, world_size=j.world_size)
            store.end_job(j.job, ended=j.ended, status="succeeded")
        for inc in incidents:
            store.add(inc)
    return path


def test_report_fleet_renders_tables_and_a_plot(store_path, tmp_path, capsys):
    plot = tmp_path / "fleet.png"
    assert main(["report", "--fleet", "--db", str(store_path), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "n3/gpu5" in out and "LEMON" in out and "trend:" in out
    assert plot.stat().st_size > 10_000
    assert main(["report", "--fleet", "--db", str(store_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lemon_gpus"] == ["n3/gpu5"]


def test_report_without_a_job_or_fleet_is_a_usage_error(store_path, capsys):
    assert main(["report", "--db", str(store_path)]) == 2
    assert "--fleet" in capsys.readouterr().err


def test_fit_store_measures_time_between_interruptions(store_path, capsys):
    pytest.importorskip("lifelines")
    assert main(["reliability", "fit", "--store", str(store_path), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["batches"]["all"]
    # Exponential gaps of mean 4 h: a Weibull shape near 1 and an MTTF near 4 h.
    assert fit["mttf_hours_exponential"] == pytest.approx(4.0, rel=0.25)
    assert fit["weibull_shape"] == pytest.approx(1.0, abs=0.25)
    assert fit["causes"] == {"faulty_gpu": fit["failures"]}
