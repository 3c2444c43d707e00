"""The telemetry series the running agent keeps: each closed step in its store (SQLite and
PostgreSQL), old points deleted, points kept through a store that fails, none when turned off."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent_service import sim_config
from pgserver import PgServer, pg_url, postgres  # noqa: F401 - fixtures
from trainguard.agent import AgentDaemon
from trainguard.clock import VirtualClock
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import ConfigError
from trainguard.incidents import IncidentStore
from trainguard.records import Health


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "tg.db")
    return str(request.getfixturevalue("pg_url"))


def test_the_agent_writes_each_closed_step_of_every_gpu_to_its_store(tmp_path: Path, db: str) -> None:
    clock = VirtualClock(1000.0)
    daemon = AgentDaemon(sim_config(tmp_path, db=db, gpus=2, series_step_s=10.0), clock=clock)
    try:
        for _ in range(4):  # t = 1000, 1004, 1008: one step; 1012 closes it
            daemon.step()
            clock.advance(4.0)
        daemon.sim.now().xid(79, gpu=1)
        daemon.step()  # t = 1016
        clock.advance(4.0)
        daemon.step()  # t = 1020 closes the second step
        points = daemon.store().series("node-a")
    finally:
        daemon.close()
    assert [(p.gpu, p.t, p.n) for p in points] == [
        (0, 1000.0, 3),
        (0, 1010.0, 2),
        (1, 1000.0, 3),
        (1, 1010.0, 2),
    ]
    first = points[0]
    assert first.uuid is not None and 20.0 < (first["temperature_c"] or 0) < 100.0 and first["power_w"]
    gpu1 = points[-1]
    assert gpu1["xids"] == 1.0 and gpu1["xid_79"] == 1.0 and gpu1["lost"] == 1.0  # it fell off the bus


def test_points_older_than_the_retention_leave_the_store(tmp_path: Path) -> None:
    clock = VirtualClock(0.0)
    config = sim_config(tmp_path, gpus=1, series_step_s=60.0, series_keep_days=1 / 24)  # one hour
    daemon = AgentDaemon(config, clock=clock)
    try:
        for _ in range(90):  # three hours, a tick every two minutes: each closes a step
            daemon.step()
            clock.advance(120.0)
        times = [p.t for p in daemon.store().series("node-a")]
    finally:
        daemon.close()
    assert len(times) > 25 and min(times) >= 3600.0  # pruned at t = 7320 s: before 3720 s went
    assert max(times) == 3 * 3600.0 - 240.0  # the step of the last tick but one


def test_series_points_wait_through_a_store_that_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "no"
    blocker.write_text("a file where the store's directory should be")
    clock = VirtualClock(0.0)
    daemon = AgentDaemon(
        sim_config(tmp_path, gpus=1, db=str(blocker / "x.db"), series_step_s=10.0), clock=clock
    )
    try:
        for _ in range(3):
            snap = daemon.step()
            clock.advance(10.0)
        assert snap.health is Health.DEGRADED and daemon.series_record.pending == 2
        assert daemon.tally.copy().errors["series"] == 2
        blocker.unlink()
        blocker.mkdir()
        daemon.step()
        assert daemon.series_record.pending == 0
        assert [p.t for p in daemon.store().series("node-a")] == [0.0, 10.0, 20.0]
    finally:
        daemon.close()


def test_no_series_points_keep_no_series_and_zero_days_store_none(tmp_path: Path) -> None:
    clock = VirtualClock(0.0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    off = AgentDaemon(sim_config(tmp_path / "a", gpus=1, series_points=0, series_step_s=1.0), clock=clock)
    memory = AgentDaemon(
        sim_config(tmp_path / "b", gpus=1, series_keep_days=0, series_step_s=1.0), clock=clock
    )
    try:
        for _ in range(3):
            off.step(), memory.step()
            clock.advance(1.0)
        assert off.series is None and off.agent.series is None
        assert memory.series is not None and len(memory.series.points(0)) == 2
        assert memory.store().series() == [] and IncidentStore(tmp_path / "a" / "tg.db").series() == []
    finally:
        off.close()
        memory.close()


def test_series_settings_that_cannot_work_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="series_step_s"):
        sim_config(tmp_path, series_step_s=0.0)
    with pytest.raises(ConfigError, match="series_points"):
        sim_config(tmp_path, series_points=-1)


def test_a_reload_changes_the_retention_and_names_the_series_step_as_needing_a_restart(
    tmp_path: Path,
) -> None:
    config = sim_config(tmp_path)
    daemon = AgentDaemon(config)
    try:
        changed = dataclasses.replace(config, series_step_s=30.0, series_keep_days=2.0)
        assert daemon.reload(changed, Thresholds()) == ["series_step_s"]
        assert daemon.series_record.keep_s == 2 * 86400.0
    finally:
        daemon.close()
