# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""One store, two backends: the same repository code against SQLite and a real PostgreSQL server.

Schema migrations (an older store migrates forward, a newer one is refused), node identity on
every row, idempotent writes, credentials that never show, and the spool: a writer whose
database goes away keeps every incident and replays it once, in order, when it returns.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from pgserver import PASSWORD, PgServer, pg_url, postgres  # noqa: F401 - fixtures
from trainguard.errors import ConfigError, StoreError, StoreUnavailable
from trainguard.incidents import Incident, IncidentStore, Interval, IntervalKind, RootCause
from trainguard.incidents.backend import check_cli_target, mask_url
from trainguard.incidents.fleet import FleetWriter
from trainguard.incidents.identity import NodeIdentity
from trainguard.incidents.schema import MIGRATIONS, SCHEMA_VERSION, render
from trainguard.incidents.spool import Spool

NODE = NodeIdentity("gpu-017", rack="r03", group="h100-a", gpu_uuids=tuple(f"GPU-{i:04d}" for i in range(8)))


def incident(n: int, job: str = "job-a", gpu: int | None = 3) -> Incident:
    return Incident(
        job=job, time=1000.0 + n, root_cause=RootCause.FAULTY_GPU, action="restart_excluding_gpu",
        summary=f"incident {n}: GPU {gpu} fell off the bus (Xid 79)", gpu=gpu, rank=gpu, attempt=0,
        detected_by="kernel_log", evidence=("NVRM: Xid (PCI:0000:3b:00): 79",),
    )  # fmt: skip


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "tg.db")
    return str(request.getfixturevalue("pg_url"))


def test_the_store_round_trips_incidents_jobs_and_goodput(target: str) -> None:
    with IncidentStore(target, identity=NODE) as store:
        store.start_job("job-a", started=900.0, command="train.py", world_size=8)
        added = store.add(incident(1))
        assert added.id is not None and store.get(added.id) == added
        updated = store.update(added.id, time_lost_s=42.5, resolved=True, resolution="restarted")
        assert store.get(added.id) == updated
        store.add_intervals(
            [
                Interval("job-a", IntervalKind.PRODUCTIVE, 900, 1001),
                Interval("job-a", IntervalKind.DOWNTIME, 1001, 1010),
            ]
        )
        store.add_progress("job-a", time=950.5, step=100, loss=0.25)
        store.end_job("job-a", ended=1010.0, status="succeeded")
        summary = store.goodput("job-a")
        assert summary.wall_s == 110.0 and summary.productive_s == 101.0
        assert store.get_job("job-a").status == "succeeded"  # type: ignore[union-attr]
        assert store.progress("job-a")[0].loss == 0.25
        assert store.incidents(job="job-a", since=1000.5) == [updated]


def test_every_row_carries_the_writers_node_identity(target: str) -> None:
    with IncidentStore(target, identity=NODE) as store:
        store.add(incident(1, gpu=5))
        store.start_job("job-a", started=1.0)
        store.add_intervals([Interval("job-a", IntervalKind.PRODUCTIVE, 1, 2)])
        rows = store.read("SELECT host, rack, node_group, gpu_uuid, node FROM incidents")
        assert rows == [
            {"host": "gpu-017", "rack": "r03", "node_group": "h100-a", "gpu_uuid": "GPU-0005", "node": None}
        ]
        assert store.read("SELECT host, rack FROM intervals") == [{"host": "gpu-017", "rack": "r03"}]
        assert store.read("SELECT host, node_group FROM jobs") == [
            {"host": "gpu-017", "node_group": "h100-a"}
        ]


def test_a_retried_write_is_not_a_duplicate(target: str) -> None:
    with IncidentStore(target, identity=NODE) as store:
        first = store.add(incident(1))
        again = store.add(incident(1))
        assert again.id == first.id
        ivs = [Interval("job-a", IntervalKind.PRODUCTIVE, 0, 10, attempt=0)]
        store.add_intervals(ivs)
        store.add_intervals(ivs)
        store.add_progress("job-a", 5.0, 50)
        store.add_progress("job-a", 5.0, 50)
        writer = FleetWriter(store, NODE)
        writer.breaker("gpu_reset", "open", gpu=3, time=7.0)
        writer.breaker("gpu_reset", "open", gpu=3, time=7.0)
        counts = {
            t: store.read(f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]
            for t in ("incidents", "intervals", "progress", "breaker_events", "gpu_failures")
        }
        assert counts == {
            "incidents": 1,
            "intervals": 1,
            "progress": 1,
            "breaker_events": 1,
            "gpu_failures": 1,
        }
        assert store.read("SELECT incidents FROM gpu_failures")[0]["incidents"] == 1  # counted once


def test_verdicts_are_written_when_they_change_not_every_tick(target: str) -> None:
    with IncidentStore(target, identity=NODE) as store:
        w = FleetWriter(store, NODE, heartbeat_s=1e9)
        ok = ("ok", "none", "")
        assert w.record({-1: ok, 0: ok, 1: ok}, 10.0, ok) == 3
        assert w.record({-1: ok, 0: ok, 1: ok}, 11.0, ok) == 0
        bad = ("failed", "exclude_gpu", "Xid 79")
        assert w.record({-1: bad, 0: ok, 1: bad}, 12.0, bad) == 2
        rows = store.read("SELECT gpu, time, health FROM verdicts ORDER BY id")
        assert [(r["gpu"], r["health"]) for r in rows] == [
            (-1, "ok"),
            (0, "ok"),
            (1, "ok"),
            (-1, "failed"),
            (1, "failed"),
        ]
        node = store.read("SELECT health, since, last_seen, gpu_uuids FROM nodes")[0]
        assert node["health"] == "failed" and node["since"] == 12.0 and "GPU-0001" in node["gpu_uuids"]


def _v1_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    for statement in render(MIGRATIONS[0], "sqlite"):
        conn.execute(statement)
    conn.execute(
        "INSERT INTO incidents (job, time, root_cause, action) VALUES ('old-job', 5.0, 'faulty_gpu', 'restart')"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def test_a_store_of_an_older_version_migrates_forward_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _v1_sqlite(path)
    with IncidentStore(path, identity=NODE) as store:
        assert [i.job for i in store.incidents()] == ["old-job"]
        store.add(incident(1))  # the new columns are there
        assert len(store.incidents()) == 2
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.integration
def test_a_postgres_store_at_version_1_migrates_forward(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in render(MIGRATIONS[0], "postgresql"):
            conn.execute(statement)
        conn.execute("CREATE TABLE trainguard_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO trainguard_schema VALUES (1)")
        conn.execute(
            "INSERT INTO incidents (job, time, root_cause, action) VALUES ('old', 5.0, 'host', 'none')"
        )
    with IncidentStore(pg_url, identity=NODE) as store:
        store.add(incident(1))
        assert [i.job for i in store.incidents()] == ["old", "job-a"]
        assert store.read("SELECT version FROM trainguard_schema") == [{"version": SCHEMA_VERSION}]


@pytest.mark.integration
def test_a_postgres_store_from_a_newer_trainguard_is_refused_by_name(pg_url: str) -> None:
    IncidentStore(pg_url).close()
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE trainguard_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match=r"127\.0\.0\.1.*newer than this trainguard") as err:
        IncidentStore(pg_url)
    assert PASSWORD not in str(err.value)


@pytest.mark.integration
def test_agents_opening_a_fresh_postgres_store_at_once_migrate_it_once(pg_url: str) -> None:
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            IncidentStore(pg_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    with IncidentStore(pg_url) as store:
        assert store.read("SELECT COUNT(*) AS n FROM trainguard_schema") == [{"n": 1}]


# -- credentials -----------------------------------------------------------------------------


def test_a_password_on_the_command_line_is_refused_and_never_echoed() -> None:
    with pytest.raises(ConfigError, match="TRAINGUARD_DB") as err:
        check_cli_target("postgresql://tg:hunter2@db.example/fleet")
    assert "hunter2" not in str(err.value)
    check_cli_target("postgresql://tg@db.example/fleet")  # no password: fine
    check_cli_target("runs/trainguard.db")
    assert mask_url("postgresql://db/x?password=hunter2&sslmode=require") == (
        "postgresql://db/x?password=***&sslmode=require"
    )


@pytest.mark.integration
def test_the_password_comes_from_a_passfile(postgres: PgServer, tmp_path: Path, monkeypatch) -> None:
    db = postgres.create_db()
    bare = postgres.url(db, password=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    with pytest.raises(StoreUnavailable, match="password") as err:
        IncidentStore(bare)
    assert PASSWORD not in str(err.value)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{postgres.port}:{db}:trainguard:{PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with IncidentStore(bare) as store:
        assert store.add(incident(1)).id == 1


@pytest.mark.integration
def test_a_wrong_password_error_masks_the_password(postgres: PgServer) -> None:
    url = postgres.url(postgres.create_db()).replace(PASSWORD, "wrong-secret-42")
    with pytest.raises(StoreUnavailable) as err:
        IncidentStore(url)
    assert "wrong-secret-42" not in str(err.value) and "***" in str(err.value)


# -- the spool ---------------------------------------------------------------------------------


def test_a_full_spool_drops_the_oldest_verdicts_and_never_an_incident(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl", max_entries=20)
    for n in range(30):
        spool.append({"op": "incident" if n % 3 == 0 else "verdicts", "n": n})
    kept = [e["n"] for e in Spool(tmp_path / "spool.jsonl").head(100)]  # as a restarted writer reads it
    assert [n for n in range(30) if n % 3 == 0] == [n for n in kept if n % 3 == 0]  # every incident
    assert len(kept) <= 20 and spool.dropped == 30 - len(kept)
    assert kept == sorted(kept) and kept[-1] == 29  # the newest verdicts stay, in order


def test_a_store_that_cannot_be_reached_spools_and_replays_in_order(tmp_path: Path) -> None:
    db = tmp_path / "tg.db"
    blocker = sqlite3.connect(db, timeout=0.1, isolation_level=None)
    IncidentStore(db).close()
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the lock past our timeout
    store = IncidentStore(db, identity=NODE, timeout_s=0.2, spool=tmp_path / "spool.jsonl")
    for n in range(5):
        assert store.add(incident(n)).id is None  # spooled
    key = store.key_of(incident(2))
    store.update_by_key(key, resolved=True, resolution="replaced")
    assert store.spool_depth == 6
    blocker.execute("ROLLBACK")
    store._retry_at = 0.0  # past the back-off
    assert store.add(incident(5)).id == 6  # replays the spool first, then writes
    assert store.spool_depth == 0
    got = store.incidents()
    assert [i.summary.split(":")[0] for i in got] == [f"incident {n}" for n in range(6)]
    assert [i.id for i in got] == [1, 2, 3, 4, 5, 6] and got[2].resolved
    store.close()


@pytest.mark.integration
def test_every_incident_arrives_once_across_a_postgres_outage(postgres: PgServer, tmp_path: Path) -> None:
    url = postgres.url(postgres.create_db())
    store = IncidentStore(url, identity=NODE, timeout_s=2, spool=tmp_path / "spool.jsonl")
    writer = FleetWriter(store, NODE, heartbeat_s=1e9)
    written: list[int] = []
    spooled = threading.Event()
    stop = threading.Event()

    def run() -> None:  # a node that keeps recording while the database goes away and returns
        n = 0
        while not stop.is_set() or store.spool_depth:
            if not stop.is_set():
                store.add(incident(n))
                written.append(n)
                health = "failed" if n % 2 else "ok"
                writer.record({3: (health, "none", f"tick {n}")}, 2000.0 + n, (health, "none", ""))
                n += 1
            else:
                store.flush_spool()
            if store.spool_depth >= 10:
                spooled.set()
            time.sleep(0.01)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        time.sleep(0.3)
        postgres.stop()  # mid-run
        assert spooled.wait(timeout=120), "no write was spooled while the server was down"
        postgres.start()
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(timeout=180)
    assert not thread.is_alive()
    assert store.spool_depth == 0
    summaries = [r["summary"] for r in store.read("SELECT summary FROM incidents ORDER BY id")]
    assert summaries == [incident(n).summary for n in written]  # each once, in order
    reasons = [r["reason"] for r in store.read("SELECT reason FROM verdicts ORDER BY id")]
    assert reasons == [f"tick {n}" for n in written]
    assert not (tmp_path / "spool.jsonl").exists()
    store.close()


@pytest.mark.integration
def test_a_writer_started_while_postgres_is_down_spools_from_the_start(tmp_path: Path) -> None:
    # Nothing listens on this port: the store still opens, and says why it spools.
    url = "postgresql://trainguard:pw@127.0.0.1:9/nowhere"
    store = IncidentStore(url, identity=NODE, timeout_s=1, spool=tmp_path / "spool.jsonl")
    store.add(incident(1))
    assert store.spool_depth == 1 and not store.flush_spool()
    store.close()
    assert "incident 1" in (tmp_path / "spool.jsonl").read_text()


def test_psycopg_is_imported_by_one_module_only() -> None:
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "trainguard"
    importers = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "psycopg" or n.startswith("psycopg.") for n in names):
                importers.append(str(path.relative_to(src)))
    assert sorted(set(importers)) == ["incidents/postgres.py"]


def test_a_postgresql_that_cannot_start_fails_under_ci_and_skips_elsewhere(monkeypatch) -> None:
    import pgserver

    monkeypatch.delenv("TRAINGUARD_REQUIRE_REAL", raising=False)  # `make test-all` sets it
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install postgresql"):
        pgserver.unavailable("initdb not found")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="initdb not found"):
        pgserver.unavailable("initdb not found")
