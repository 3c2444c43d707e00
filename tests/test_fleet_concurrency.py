# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""N agents and N supervisors on N simulated nodes write one PostgreSQL store at once:
nothing lost, nothing duplicated (every write is also retried), each node's order kept."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from pgserver import pg_url, postgres  # noqa: F401 - fixtures
from trainguard.incidents import Incident, IncidentStore, IntervalKind, RootCause
from trainguard.incidents.fleet import NODE, FleetWriter
from trainguard.incidents.identity import NodeIdentity

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NODES = 6
WRITES = 40  # per writer


def identity(n: int) -> NodeIdentity:
    return NodeIdentity(
        f"sim-{n:03d}", rack=f"r{n % 3}", group="g", gpu_uuids=tuple(f"GPU-{n}-{g}" for g in range(8))
    )


def agent(url: str, n: int, spool: str) -> None:
    """The agent of node n: verdict changes and the incidents it detects, each write sent twice."""
    node = identity(n)
    with IncidentStore(url, identity=node, spool=spool) as store:
        writer = FleetWriter(store, node, heartbeat_s=1e9)
        for k in range(WRITES):
            health = ("failed", "exclude_gpu", f"xid {k}") if k % 2 else ("ok", "none", f"ok {k}")
            writer.record({k % 8: health, NODE: health}, 1000.0 + k, health)
            inc = Incident(f"node-{n}", 1000.0 + k, RootCause.FAULTY_GPU, "exclude_gpu", f"agent {k}", gpu=k % 8,
                           detected_by="kernel_log")  # fmt: skip
            store.add(inc)
            store.add(inc)  # a retry after a lost acknowledgement
        assert store.spool_depth == 0


def supervisor(url: str, n: int, run_dir: str) -> None:
    """The supervisor of node n's job: incidents (updated later), the goodput ledger, attempts."""
    os.environ["TRAINGUARD_HOSTNAME"] = identity(n).host
    from trainguard.supervisor.record import JobRecorder

    rec = JobRecorder(f"job-{n}", Path(run_dir), url)
    rec.start_job(500.0, "train.py", 8)
    for k in range(WRITES):
        inc = rec.add(
            Incident(f"job-{n}", 2000.0 + k, RootCause.SOFTWARE_BUG, "restart", f"supervisor {k}", rank=k)
        )
        rec.update(inc, time_lost_s=float(k))
        rec.interval(IntervalKind.PRODUCTIVE, 2000.0 + k, 2000.5 + k, attempt=k)
    rec.finish(500.0, 2000.0 + WRITES, "succeeded")
    rec.finish(500.0, 2000.0 + WRITES, "succeeded")  # written twice: still one ledger
    rec.close()


def test_concurrent_agents_and_supervisors_lose_nothing_and_duplicate_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    IncidentStore(pg_url).close()  # migrated once; the writers race on everything else
    ctx = multiprocessing.get_context("fork")
    procs = []
    for n in range(NODES):
        run_dir = tmp_path / f"run-{n}"
        run_dir.mkdir()
        procs.append(ctx.Process(target=agent, args=(pg_url, n, str(tmp_path / f"spool-{n}.jsonl"))))
        procs.append(ctx.Process(target=supervisor, args=(pg_url, n, str(run_dir))))
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * len(procs)

    with IncidentStore(pg_url) as store:
        for n in range(NODES):
            host = identity(n).host
            agent_rows = store.read(
                "SELECT summary, gpu_uuid FROM incidents WHERE host = ? AND detected_by = 'kernel_log' ORDER BY id",
                (host,),
            )
            assert [r["summary"] for r in agent_rows] == [
                f"agent {k}" for k in range(WRITES)
            ]  # once, in order
            assert agent_rows[3]["gpu_uuid"] == f"GPU-{n}-3"
            sup = store.read(
                "SELECT summary, time_lost_s FROM incidents WHERE job = ? ORDER BY id", (f"job-{n}",)
            )
            assert [(r["summary"], r["time_lost_s"]) for r in sup] == [
                (f"supervisor {k}", float(k)) for k in range(WRITES)
            ]
            verdicts = store.read(
                "SELECT time FROM verdicts WHERE host = ? AND gpu = -1 ORDER BY id", (host,)
            )
            assert [r["time"] for r in verdicts] == [1000.0 + k for k in range(WRITES)]
            assert len(store.intervals(f"job-{n}")) == WRITES
            attempts = store.read(
                "SELECT COUNT(*) AS n FROM attempts WHERE job = ? AND host = ?", (f"job-{n}", host)
            )
            assert attempts == [{"n": WRITES}]
        nodes = store.read("SELECT host, health, last_seen FROM nodes ORDER BY host")
        assert [(r["host"], r["health"], r["last_seen"]) for r in nodes] == [
            (identity(n).host, "failed", 1000.0 + WRITES - 1) for n in range(NODES)
        ]
        totals = store.read("SELECT COUNT(*) AS n, COUNT(DISTINCT key) AS k FROM incidents")[0]
        assert totals == {"n": 2 * NODES * WRITES, "k": 2 * NODES * WRITES}
        counters = store.read("SELECT SUM(incidents) AS n FROM gpu_failures")[0]["n"]
        assert counters == NODES * WRITES  # hardware incidents counted once each (not the software bugs)
