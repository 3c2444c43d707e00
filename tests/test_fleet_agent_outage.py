# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""The real node agent on a fleet store: PostgreSQL stops mid-run, the agent keeps sampling and
spools (degraded, spool depth on /metrics), the server returns, every incident arrives once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_service import sim_config
from pgserver import PgServer, postgres  # noqa: F401 - fixtures
from trainguard.agent import AgentDaemon
from trainguard.incidents import IncidentStore
from trainguard.records import Health

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def spool_gauge(daemon: AgentDaemon) -> float:
    from trainguard.agent.prometheus import MetricsView

    for line in MetricsView(daemon).render().decode().splitlines():
        if line.startswith("trainguard_store_spool_depth "):
            return float(line.split()[1])
    raise AssertionError("no trainguard_store_spool_depth on /metrics")


def test_the_agent_spools_while_postgres_is_down_and_every_incident_arrives_once(
    postgres: PgServer, tmp_path: Path
) -> None:
    url = postgres.url(postgres.create_db())
    daemon = AgentDaemon(sim_config(tmp_path, db=url))
    try:
        daemon.sim.now().xid(79, gpu=1)
        assert daemon.step().health is Health.OK  # written at once
        postgres.stop()  # mid-run
        daemon.sim.now().xid(79, gpu=3)
        daemon.sim.now().xid(79, gpu=5)
        snap = daemon.step()
        assert snap.verdict is not None and snap.verdict.health is Health.FAILED  # still judging
        assert snap.health is Health.DEGRADED and any("spooled" in p for p in snap.problems), snap.problems
        assert daemon.spool_depth >= 2 and spool_gauge(daemon) == daemon.spool_depth
        assert daemon.pending == 0  # in the spool on disk, not in memory
        postgres.start()
        # A later tick (after the store's back-off: at most 10 s) replays the spool, then writes.
        deadline = time.monotonic() + 120
        while daemon.spool_depth and time.monotonic() < deadline:
            time.sleep(0.5)
            snap = daemon.step()
        assert daemon.spool_depth == 0 and spool_gauge(daemon) == 0.0 and snap.health is Health.OK
    finally:
        daemon.close()
    with IncidentStore(url) as store:
        gpus = [r["gpu"] for r in store.read("SELECT gpu FROM incidents WHERE host = 'node-a' ORDER BY id")]
        assert sorted(gpus) == [1, 3, 5]  # each once
        verdicts = store.read("SELECT gpu, health FROM verdicts WHERE host = 'node-a' ORDER BY id")
        assert (3, "failed") in [(v["gpu"], v["health"]) for v in verdicts]
        assert store.read("SELECT health FROM nodes WHERE host = 'node-a'") == [{"health": "failed"}]
