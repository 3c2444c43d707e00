# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""`trainguard fleet status|nodes|lemons|mtbf|incidents|breaker`, `report --fleet` and
`reliability fit --store` read one store: the same answers from SQLite and from PostgreSQL."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pgserver import PASSWORD, pg_url, postgres  # noqa: F401 - fixtures
from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, RootCause
from trainguard.incidents.fleet import NODE, FleetWriter
from trainguard.incidents.identity import NodeIdentity

OK = ("ok", "none", "")


def node(i: int) -> NodeIdentity:
    return NodeIdentity(
        f"node-{i:02d}",
        rack=f"r{i // 2}",
        group="a100" if i < 4 else "h100",
        gpu_uuids=tuple(f"GPU-{i}-{g}" for g in range(8)),
    )


def fill(store: IncidentStore, now: float) -> None:
    """Six nodes; node-01 GPU 5 is a lemon, node-04 failed now, one software bug, a breaker held."""
    for i in range(6):
        n = node(i)
        w = FleetWriter(store, n)
        health = ("failed", "exclude_gpu", "Xid 79 on GPU 2") if i == 4 else OK
        w.record({NODE: health, 2: health}, now - 60, health)
    lemon = node(1)
    for k in range(4):
        store.add(
            Incident(
                "job-1", now - 3600 * (k + 1), RootCause.GPU_HBM_MEMORY, "exclude_gpu", f"DBE {k}", gpu=5
            ),
            lemon,
        )
    store.add(Incident("job-1", now - 100, RootCause.FAULTY_GPU, "exclude_gpu", "Xid 79", gpu=2), node(4))
    store.add(
        Incident("job-2", now - 50, RootCause.SOFTWARE_BUG, "stop", "ValueError in train.py", rank=0), node(3)
    )
    FleetWriter(store, node(4)).breaker(
        "gpu_reset", "open", reason="2 resets within 1 h", gpu=2, time=now - 90
    )
    FleetWriter(store, node(2)).breaker("node_drain", "open", time=now - 500)
    FleetWriter(store, node(2)).breaker("node_drain", "closed", time=now - 400)
    store.start_job("job-1", started=now - 5 * 3600, world_size=16)
    store.end_job("job-1", ended=now, status="succeeded")


@pytest.fixture
def now() -> float:
    """The store's rows are this far in the past when the test starts (not when it was collected:
    a long suite runs this module's tests half an hour after importing it)."""
    return time.time()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_args(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, now: float
) -> list[str]:
    if request.param == "sqlite":
        target = str(tmp_path / "tg.db")
        args = ["--db", target]
    else:
        target = request.getfixturevalue("pg_url")
        monkeypatch.setenv("TRAINGUARD_DB", target)  # the password comes from the environment
        args = []
    with IncidentStore(target) as store:
        fill(store, now)
    return args


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fleet_status_counts_nodes_by_verdict_group_and_rack(db_args: list[str], capsys) -> None:
    status = run_json(capsys, "fleet", "status", *db_args)
    assert status["nodes"] == 6 and status["by_health"] == {"ok": 5, "degraded": 0, "failed": 1, "unknown": 0}
    assert status["incidents_24h"] == 6
    by = {(g["group"], g["rack"]): (g["nodes"], g["failed"]) for g in status["groups"]}
    assert by == {("a100", "r0"): (2, 0), ("a100", "r1"): (2, 0), ("h100", "r2"): (2, 1)}
    assert run_json(capsys, "fleet", "status", "--group", "h100", *db_args)["nodes"] == 2
    assert main(["fleet", "status", *db_args]) == 0
    assert "6 node(s): 5 ok, 0 degraded, 1 failed" in capsys.readouterr().out


def test_fleet_nodes_filter_by_group_and_verdict(db_args: list[str], capsys) -> None:
    failed = run_json(capsys, "fleet", "nodes", "--health", "failed", *db_args)
    assert [(n["host"], n["reason"], n["gpu_uuids"][2]) for n in failed] == [
        ("node-04", "Xid 79 on GPU 2", "GPU-4-2")
    ]
    assert [n["host"] for n in run_json(capsys, "fleet", "nodes", "--group", "a100", *db_args)] == [
        "node-00", "node-01", "node-02", "node-03",
    ]  # fmt: skip


def test_fleet_lemons_rank_gpus_and_nodes_by_hardware_incidents(db_args: list[str], capsys) -> None:
    lemons = run_json(capsys, "fleet", "lemons", *db_args)
    top = lemons["gpus"][0]
    assert (top["host"], top["gpu"], top["gpu_uuid"], top["incidents"]) == ("node-01", 5, "GPU-1-5", 4)
    assert [i["summary"] for i in top["history"]] == ["DBE 0", "DBE 1", "DBE 2"]  # newest first
    assert [(n["host"], n["incidents"]) for n in lemons["nodes"]] == [
        ("node-01", 4),
        ("node-04", 1),
    ]  # no bug
    recent = run_json(capsys, "fleet", "lemons", "--since", "90m", *db_args)
    assert [(g["host"], g["incidents"]) for g in recent["gpus"]] == [
        ("node-04", 1),
        ("node-01", 1),
    ]  # latest first


def test_fleet_mtbf_by_root_cause_and_group(db_args: list[str], capsys, now: float) -> None:
    mtbf = run_json(capsys, "fleet", "mtbf", *db_args)
    causes = {e["root_cause"]: e["failures"] for e in mtbf["by_root_cause"]}
    assert causes == {"gpu_hbm_memory": 4, "faulty_gpu": 1, "software_bug": 1}
    groups = {e["group"]: (e["nodes"], e["failures"]) for e in mtbf["by_group"]}
    assert groups == {"a100": (4, 4), "h100": (2, 1)}
    a100 = next(e for e in mtbf["by_group"] if e["group"] == "a100")
    assert a100["mtbf_h"] == pytest.approx(4 * mtbf["span_h"] / 4)
    # From the first incident, 4 h before the rows' now, to the moment the command ran.
    assert 4.0 <= mtbf["span_h"] <= 4.0 + (time.time() - now) / 3600


def test_fleet_incidents_and_breakers_name_the_node(db_args: list[str], capsys) -> None:
    incs = run_json(capsys, "fleet", "incidents", "--host", "node-04", *db_args)
    assert [(i["host"], i["rack"], i["gpu_uuid"], i["root_cause"]) for i in incs] == [
        ("node-04", "r2", "GPU-4-2", "faulty_gpu")
    ]
    breakers = run_json(capsys, "fleet", "breaker", *db_args)
    assert [(b["breaker"], b["host"], b["gpu"], b["state"]) for b in breakers["held"]] == [
        ("gpu_reset", "node-04", 2, "open")
    ]  # node-02's drain breaker closed again
    assert len(breakers["events"]) == 3
    assert main(["fleet", "breaker", *db_args]) == 0
    assert "2 resets within 1 h" in capsys.readouterr().out


def test_report_fleet_reads_the_same_store(db_args: list[str], capsys) -> None:
    report = run_json(capsys, "report", "--fleet", *db_args)
    assert (report["incidents"], report["jobs"], report["observed_hours"]) == (6, 1, pytest.approx(5.0))


@pytest.mark.integration
def test_a_password_in_db_is_refused_without_showing_it(pg_url: str, capsys) -> None:
    assert main(["fleet", "status", "--db", pg_url]) == 2
    err = capsys.readouterr().err
    assert "TRAINGUARD_DB" in err and PASSWORD not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["fleet", "status"],
        ["incidents", "list"],
        ["agent", "--backend", "sim"],
        ["run", "--standalone", "--", "python", "-c", "pass"],
    ],
)
def test_no_command_takes_a_database_password_on_its_command_line(argv: list[str], capsys) -> None:
    url = "postgresql://tg:hunter2-secret@127.0.0.1:9/fleet"
    assert (
        main(
            [*argv[:2], "--db", url, *argv[2:]]
            if argv[0] in ("fleet", "incidents")
            else [argv[0], "--db", url, *argv[1:]]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "hunter2-secret" not in err and "TRAINGUARD_DB" in err
