# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""Remediation joined to the fleet store: every action and breaker event is a row with the node's
identity, on SQLite and a real PostgreSQL; `trainguard fleet breaker` shows what the breakers held
across the fleet, and `trainguard fleet breaker reset` (or the API with the admin token) is a
``reset`` event naming who reset it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_service import TOKEN, Running, sim_config, write_token
from pgserver import PgServer, pg_url, postgres  # noqa: F401 - fixtures
from trainguard.actions import Advice
from trainguard.agent.assemble import remediation_of
from trainguard.cli import main
from trainguard.incidents import IncidentStore
from trainguard.incidents import fleet_read as fr
from trainguard.incidents.fleet import FleetWriter
from trainguard.incidents.identity import NodeIdentity
from trainguard.records import Finding, Health
from trainguard.remediate import BreakerFile, Policy, Remediator
from trainguard.remediate.policy import BreakerLimits
from trainguard.remediate.providers.sim import SimScheduler

XID79 = Finding("xid", Health.FAILED, Advice.REBOOT_NODE, "Xid 79: GPU has fallen off the bus.", gpu=1)
LOST = Finding("gpu_lost", Health.FAILED, Advice.REBOOT_NODE, "GPU stopped answering", gpu=1)  # NVML's view
NAMES = [f"node{i:02d}" for i in range(16)]
BAD = NAMES[::3][:6]  # six nodes fail; the breaker lets three go
ADMIN = "admin-token-0123456789abcdef"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "tg.db")
    return str(request.getfixturevalue("pg_url"))


def identity(name: str) -> NodeIdentity:
    i = int(name[4:])
    return NodeIdentity(name, rack=f"r{i // 8}", group="h100", gpu_uuids=("GPU-a", f"GPU-{name}"))


def remediate(store: IncidentStore, tmp_path: Path, policy: Policy, nodes: list[str], **kw: object) -> list:
    """Each failing node's agent acts on its Xid 79, one shared breaker file, one fleet store."""
    sched = SimScheduler(NAMES)
    records = []
    for n, name in enumerate(nodes):
        r = Remediator(
            policy, name, store, state_dir=tmp_path / name, breaker_path=tmp_path / "shared" / "breaker.json",
            providers={"node": sched}, clock=lambda n=n: 1000.0 + n, fleet=FleetWriter(store, identity(name)), **kw,
        )  # fmt: skip
        records += r.act([XID79, LOST])
    return records


def limits(k: int) -> BreakerLimits:
    return BreakerLimits(max_nodes=k, max_fraction=1.0, fleet_size=len(NAMES))


def test_every_action_and_breaker_event_is_a_fleet_row_and_a_person_resets_it(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with IncidentStore(target, identity=NodeIdentity("login-1")) as store:
        records = remediate(store, tmp_path, Policy(enforce=True, breaker=limits(3)), BAD)
        assert [r.resolution.split(":")[0] for r in records] == ["done"] * 3 + ["held"] * 3
        acts = store.read(
            "SELECT host, rack, node_group, gpu, gpu_uuid, action, target, outcome, source, incident_key "
            "FROM remediation_actions ORDER BY time"
        )
        assert [(a["host"], a["outcome"]) for a in acts] == [
            (n, o) for n, o in zip(BAD, ["done"] * 3 + ["held"] * 3, strict=True)
        ]
        assert all(a["rack"] and a["node_group"] == "h100" and a["gpu"] == 1 for a in acts)
        assert [a["gpu_uuid"] for a in acts] == [f"GPU-{n}" for n in BAD]
        assert [a["source"] for a in acts] == [f"trainguard-agent@{n}" for n in BAD]
        # each action names its incident record (same key), and the incident holds the result
        joined = store.read(
            "SELECT i.resolution, a.outcome FROM incidents i JOIN remediation_actions a ON a.incident_key = i.key"
        )
        assert len(joined) == 6 and all(j["resolution"].startswith(j["outcome"]) for j in joined)
        events = store.read("SELECT host, breaker, state, reason FROM breaker_events ORDER BY time, id")
        assert [(e["host"], e["breaker"], e["state"]) for e in events] == [
            (BAD[3], "fleet", "open"), (BAD[3], "fleet", "held"), (BAD[4], "fleet", "held"), (BAD[5], "fleet", "held"),
        ]  # fmt: skip
        assert "limit 3" in events[0]["reason"] and events[2]["reason"].startswith(
            f"held reboot_node {BAD[4]} GPU 1"
        )
        view = fr.breakers(store)
        assert [(b["breaker"], b["host"], b["state"]) for b in view["held"]] == [("fleet", BAD[5], "held")]
        assert [a["host"] for a in view["held_actions"]] == BAD[3:][::-1]

    # a person on a login node resets it: the breaker file closes, the store says who and when
    monkeypatch.setenv("TRAINGUARD_DB", target)
    monkeypatch.setenv("TRAINGUARD_HOSTNAME", "login-1")
    monkeypatch.setenv("SUDO_USER", "alice")
    assert main(["fleet", "breaker", "status", "--state-dir", str(tmp_path / "shared"), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["held"] == 3
    assert main(["fleet", "breaker", "reset", "--state-dir", str(tmp_path / "shared"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fleet_events"] == ["fleet"] and out["by"].startswith("alice@") and out["incident"] is not None
    assert BreakerFile(tmp_path / "shared" / "breaker.json").load().tripped is None
    assert main(["fleet", "breaker", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["held"] == []  # closed for the whole fleet, though the agents of other hosts opened it
    (latest,) = [c for c in view["current"] if c["breaker"] == "fleet"]
    assert (latest["state"], latest["host"], latest["source"]) == ("reset", "login-1", out["by"])
    assert (
        latest["time"] == pytest.approx(out["time"])
        and "(was: 3 node(s) already actioned" in latest["reason"]
    )
    assert main(["fleet", "breaker"]) == 0
    text = capsys.readouterr().out
    assert "reset by alice@" in text and "actions held:" in text and BAD[5] in text


def test_dry_run_and_failed_actions_are_rows_too(target: str, tmp_path: Path) -> None:
    with IncidentStore(target) as store:
        remediate(store, tmp_path / "dry", Policy(breaker=limits(0)), BAD[:1])  # dry run: would be held
        r = Remediator(Policy(enforce=True), "node05", store, state_dir=tmp_path / "n5",
                       fleet=FleetWriter(store, identity("node05")))  # no provider: fails  # fmt: skip
        r.act([XID79, LOST])
        rows = store.read("SELECT host, outcome, detail FROM remediation_actions ORDER BY time, id")
        assert [(x["host"], x["outcome"]) for x in rows] == [(BAD[0], "dry_run"), ("node05", "failed")]
        assert "the breaker would hold it" in rows[0]["detail"]
        assert "no node provider configured" in rows[1]["detail"]
        assert store.read("SELECT breaker FROM breaker_events") == []  # a dry run changes no breaker


def test_a_fleet_scoped_reset_closes_every_host_and_a_node_breaker_stays_per_host(target: str) -> None:
    with IncidentStore(target) as store:
        a, b = FleetWriter(store, identity("node01")), FleetWriter(store, identity("node02"))
        a.breaker("fleet", "open", reason="limit", time=1.0)
        a.breaker("job:llm", "open", reason="spares", time=1.0)
        a.breaker("node_drain", "open", reason="x", time=1.0)
        b.breaker("fleet", "reset", reason="by bob", time=2.0)
        b.breaker("node_drain", "closed", time=2.0)  # another host's own breaker
        held = [(h["breaker"], h["host"]) for h in fr.breakers(store)["held"]]
        assert sorted(held) == [("job:llm", "node01"), ("node_drain", "node01")]


@pytest.mark.integration
def test_actions_and_breaker_events_spool_while_postgres_is_away_and_arrive_once(
    postgres: PgServer, tmp_path: Path
) -> None:
    url = postgres.url(postgres.create_db())
    IncidentStore(url).close()  # migrated while the server is up
    postgres.stop()
    try:
        store = IncidentStore(url, timeout_s=1, spool=tmp_path / "spool.jsonl")
        records = remediate(store, tmp_path, Policy(enforce=True, breaker=limits(1)), BAD[:3])
        assert [r.id for r in records] == [None] * 3 and store.spool_depth > 0
    finally:
        postgres.start()
    store._retry_at = 0.0  # past the back-off
    assert store.flush_spool() and store.spool_depth == 0
    assert [(a["host"], a["outcome"]) for a in store.read("SELECT host, outcome FROM remediation_actions ORDER BY id")] == [
        (BAD[0], "done"), (BAD[1], "held"), (BAD[2], "held"),
    ]  # fmt: skip
    assert [e["state"] for e in store.read("SELECT state FROM breaker_events ORDER BY id")] == [
        "open",
        "held",
        "held",
    ]
    done = store.read("SELECT resolution, resolved FROM incidents WHERE node = ?", [BAD[0]])
    assert done[0]["resolution"].startswith("done") and done[0]["resolved"]  # the spooled update arrived
    store.close()


def test_the_api_reset_needs_the_admin_token_and_is_a_reset_event(target: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[remediation]\nenforce = true\n[remediation.breaker]\nmax_nodes = 0\n")
    admin = write_token(tmp_path / "admin", ADMIN)
    cfg = sim_config(tmp_path, policy=str(policy), admin_token_file=str(admin), db=target)
    with Running(cfg) as agent:
        agent.daemon.step()
        agent.daemon.sim.now().xid(79, gpu=2)
        agent.daemon.step()
        remediation_of(agent.daemon).flush()  # type: ignore[union-attr]
        store = agent.daemon.store()
        assert [a["outcome"] for a in store.read("SELECT outcome FROM remediation_actions")] == ["held"]
        assert agent.get("/api/v1/breaker/reset", token=TOKEN, method="POST")[0] == 403  # the read token
        states = [e["state"] for e in store.read("SELECT state FROM breaker_events ORDER BY id")]
        assert states == ["open", "held"]
        code, _, body = agent.get("/api/v1/breaker/reset", token=ADMIN, method="POST")
        assert code == 200 and json.loads(body)["fleet_events"] == ["fleet"]
        (reset,) = store.read("SELECT host, state, source FROM breaker_events WHERE state = 'reset'")
        assert reset["host"] == "node-a" and reset["source"].startswith("admin token from 127.0.0.1")
        assert fr.breakers(store)["held"] == []


@pytest.mark.parametrize("verb", [[], ["status"], ["reset"]], ids=lambda v: " ".join(v) or "view")
def test_every_fleet_breaker_verb_has_help_and_json(
    verb: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["fleet", "breaker", *verb, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and ("--job" in out) == (verb == ["reset"])
