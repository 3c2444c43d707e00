# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""The telemetry series: one point per GPU and step, bounded in memory, written to the store
(SQLite and PostgreSQL) with retention, read back for a model to train on."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pytest

from pgserver import PgServer, pg_url, postgres  # noqa: F401 - fixtures
from trainguard.incidents import IncidentStore
from trainguard.incidents.identity import NodeIdentity
from trainguard.records import Event, EventKind, Gpu, RecoveryAction, Sample, Throttle
from trainguard.telemetry.series import FIELDS, NODE, Series, SeriesPoint

GPU0, GPU1 = Gpu(0, uuid="GPU-0", pci="0000:1b:00"), Gpu(1, uuid="GPU-1", pci="0000:3b:00")


def xid(code: int, pci: str | None) -> Event:
    return Event(EventKind.XID, f"NVRM: Xid (PCI:{pci}): {code}, ...", xid=code, pci=pci)


def by_pci(ev: Event) -> int | None:
    return {GPU0.pci: 0, GPU1.pci: 1}.get(ev.pci)


def test_a_step_folds_gauges_by_mean_and_max_and_counters_by_last_value() -> None:
    series = Series(step_s=10.0, depth=4)
    for t, temp, sbe in ((0.0, 60.0, 1), (4.0, 70.0, 3), (8.0, float("nan"), 2), (10.0, 50.0, 9)):
        series.add(t, [Sample(GPU0, t, temperature_c=temp, ecc_sbe_volatile=sbe, remap_pending=t > 5)], [])
    (p,) = series.points(0)
    assert (p.t, p.n, p.uuid) == (0.0, 3, "GPU-0")
    assert p["temperature_c"] == 65.0 and p["temperature_c_max"] == 70.0  # the NaN reading is skipped
    assert p["ecc_sbe_volatile"] == 2.0 and p["remap_pending"] == 1.0  # the last, not the mean
    assert p["power_w"] is None  # never read: None, not 0
    assert series.points(0)[0] is series.take_closed()[0]


def test_throttle_reasons_lost_readings_and_the_drivers_recovery_action() -> None:
    series = Series(step_s=60.0)
    hot = frozenset({Throttle.HW_THERMAL})
    series.add(0.0, [Sample(GPU0, 0.0, throttle=hot)], [])
    series.add(1.0, [Sample(GPU0, 1.0, throttle=frozenset())], [])
    series.add(2.0, [Sample(GPU0, 2.0, throttle=hot, recovery_action=RecoveryAction.NODE_REBOOT)], [])
    series.add(3.0, [Sample(GPU0, 3.0, lost=True, error="GPU is lost")], [])
    series.add(60.0, [], [])
    (p,) = series.points(0)
    assert p["throttle_hw_thermal"] == 0.5 and p["throttle_sw_power_cap"] == 0.0  # 2 of 4 readings
    assert p["lost"] == 1.0 and p["recovery_action"] == 2.0  # NVML's code of "node reboot"


def test_kernel_log_events_count_on_their_gpu_and_the_rest_on_the_node() -> None:
    series = Series(step_s=60.0)
    sxid = Event(EventKind.SXID, "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028", xid=12028)
    series.add(
        5.0, [Sample(GPU0, 5.0), Sample(GPU1, 5.0)], [xid(79, GPU1.pci), xid(79, GPU1.pci), sxid], by_pci
    )
    series.add(6.0, [], [xid(13, GPU1.pci)], by_pci)
    series.add(61.0, [], [])
    points = {p.gpu: p for p in series.take_closed()}
    assert sorted(points) == [NODE, 0, 1]
    assert (points[1]["events"], points[1]["xids"], points[1]["xid_79"], points[1]["xid_13"]) == (
        3.0,
        3.0,
        2.0,
        1.0,
    )
    assert points[0]["xids"] == 0.0 and points[0]["xid_79"] == 0.0
    assert (points[NODE].n, points[NODE]["events"], points[NODE]["xids"]) == (
        0,
        1.0,
        0.0,
    )  # an SXid is no Xid


def test_memory_is_bounded_by_depth_and_unread_points_are_dropped_and_counted() -> None:
    series = Series(step_s=1.0, depth=3)
    for t in range(10):
        series.add(float(t), [Sample(GPU0, float(t), temperature_c=float(t))], [])
    assert [p.t for p in series.points(0)] == [6.0, 7.0, 8.0]
    assert [p.t for p in series.take_closed()] == [6.0, 7.0, 8.0] and series.dropped == 6
    assert series.take_closed() == []


def test_every_number_a_sample_has_is_in_the_series() -> None:
    numbers = {f.name for f in fields(Sample)} - {"gpu", "time", "error", "throttle"}
    assert numbers <= set(FIELDS)
    assert {f"throttle_{t.value}" for t in Throttle} <= set(FIELDS)


def test_a_point_reads_back_from_its_dict() -> None:
    series = Series(step_s=10.0, host="n1")
    series.add(0.0, [Sample(GPU1, 0.0, power_w=300.5, pcie_replay=7)], [xid(48, GPU1.pci)], by_pci)
    series.add(10.0, [], [])
    (p,) = series.take_closed()
    again = SeriesPoint.from_dict(
        p.host, p.gpu, p.t, p.step_s, p.n, {**p.as_dict(), "from_a_newer_agent": 1.0}, p.uuid
    )
    assert again == p


def test_a_series_refuses_a_step_or_depth_that_cannot_work() -> None:
    with pytest.raises(ValueError, match="step_s > 0"):
        Series(step_s=0.0)
    with pytest.raises(ValueError, match="depth >= 1"):
        Series(depth=0)


# -- in the store, both backends ---------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "tg.db")
    return str(request.getfixturevalue("pg_url"))


def closed(
    host: str, steps: int, gpus: tuple[Gpu, ...] = (GPU0, GPU1), step_s: float = 60.0
) -> list[SeriesPoint]:
    series = Series(step_s=step_s, host=host)
    for k in range(steps + 1):
        t = k * step_s
        series.add(t, [Sample(g, t, temperature_c=40.0 + k + g.index, energy_mj=1000 * k) for g in gpus], [])
    return series.take_closed()


def test_series_points_round_trip_through_the_store(target: str) -> None:
    points = closed("gpu-001", 3)
    with IncidentStore(target, identity=NodeIdentity("gpu-001", rack="r1", group="h100")) as store:
        store.add_series(points)
        back = store.series("gpu-001")
        assert back == sorted(points, key=lambda p: (p.gpu, p.t))
        assert [p["temperature_c"] for p in store.series("gpu-001", gpu=1)] == [41.0, 42.0, 43.0]
        row = store.read("SELECT rack, node_group, gpu_uuid FROM series WHERE gpu = 1 AND t = 0")[0]
        assert row == {"rack": "r1", "node_group": "h100", "gpu_uuid": "GPU-1"}


def test_a_point_written_twice_lands_once(target: str) -> None:
    points = closed("gpu-001", 2)
    with IncidentStore(target, identity=NodeIdentity("gpu-001")) as store:
        store.add_series(points)
        store.add_series(points)  # a retry, or a spool replayed twice
        assert len(store.series()) == len(points) == 4


def test_series_are_read_by_host_gpu_and_time(target: str) -> None:
    with IncidentStore(target, identity=NodeIdentity("gpu-001")) as store:
        store.add_series(closed("gpu-001", 4))
        store.add_series(closed("gpu-002", 4, gpus=(GPU0,)))
        assert {p.host for p in store.series()} == {"gpu-001", "gpu-002"}
        window = store.series("gpu-001", gpu=0, since=60.0, until=180.0)
        assert [p.t for p in window] == [60.0, 120.0]  # until is exclusive
        assert [p.host for p in store.series("gpu-002")] == ["gpu-002"] * 4


def test_retention_deletes_points_older_than_the_cut(target: str) -> None:
    with IncidentStore(target, identity=NodeIdentity("gpu-001")) as store:
        store.add_series(closed("gpu-001", 5))
        assert store.prune_series(before=120.0) == 4  # t = 0 and 60, two GPUs
        assert min(p.t for p in store.series()) == 120.0
        assert store.prune_series(before=120.0) == 0


@pytest.mark.integration
@pytest.mark.slow
def test_a_fleet_database_that_is_away_spools_series_and_drops_them_first(
    tmp_path: Path, postgres: PgServer
) -> None:
    url = postgres.url(postgres.create_db())
    store = IncidentStore(url, timeout_s=1, spool=tmp_path / "spool.jsonl", spool_max=3)
    try:
        postgres.stop()
        store.add_series(closed("gpu-001", 1))
        store.add_series(closed("gpu-001", 2))
        store.add_series(closed("gpu-001", 3))
        store.update_job("job-a", started=1.0)  # never dropped
        assert store.spool_depth <= 3 and store.spool_dropped >= 1
    finally:
        postgres.start()
    store._retry_at = 0.0  # past the back-off
    assert store.flush_spool()
    assert store.get_job("job-a") is not None and store.series()  # what was kept arrived
    store.close()


def test_a_temperature_mean_is_a_float_the_store_keeps_exactly(target: str) -> None:
    series = Series(step_s=10.0, host="n1")
    for t, temp in ((0.0, 61.0), (1.0, 62.0), (2.0, 62.0)):
        series.add(t, [Sample(GPU0, t, temperature_c=temp)], [])
    series.add(10.0, [], [])
    with IncidentStore(target, identity=NodeIdentity("n1")) as store:
        store.add_series(series.take_closed())
        assert math.isclose(
            store.series("n1")[0]["temperature_c"] or 0.0, 185.0 / 3, rel_tol=0, abs_tol=1e-12
        )
