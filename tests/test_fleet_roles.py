# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""Least privilege in the fleet's PostgreSQL store (issue 34), against a real server: a node's
writer role writes its own host's rows through the store as an agent does, and cannot write,
change or delete another host's rows, change the schema, or read the role mapping; the schema
changes only as the role that owns it (`trainguard fleet migrate`)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from pgserver import PgServer, postgres  # noqa: F401 - fixtures
from trainguard.actions import Advice
from trainguard.cli import main
from trainguard.errors import ConfigError, StoreError
from trainguard.incidents import Incident, IncidentStore, RootCause
from trainguard.incidents.fleet import FleetWriter
from trainguard.incidents.identity import NodeIdentity
from trainguard.incidents.roles import scram_verifier
from trainguard.incidents.schema import SCHEMA_VERSION
from trainguard.records import Gpu, GpuVerdict, Health, NodeVerdict

pytestmark = pytest.mark.integration


def incident(host: str, n: int = 1) -> Incident:
    return Incident(
        job=f"node:{host}", time=1000.0 + n, root_cause=RootCause.FAULTY_GPU, action="drain",
        summary=f"GPU 3 of {host} fell off the bus", gpu=3, node=host, detected_by="agent",
    )  # fmt: skip


class Fleet:
    """A database owned by a migration role (LOGIN CREATEROLE, not a superuser), and URLs."""

    def __init__(self, pg: PgServer) -> None:
        import psycopg

        self.pg, self.db = pg, "f_" + uuid.uuid4().hex[:10]
        self.owner_pw = "owner-" + uuid.uuid4().hex
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE tg_owner_{self.db} LOGIN CREATEROLE PASSWORD '{self.owner_pw}'")
            c.execute(f"CREATE DATABASE {self.db} OWNER tg_owner_{self.db}")

    def url(self, role: str, password: str) -> str:
        return f"postgresql://{role}:{password}@127.0.0.1:{self.pg.port}/{self.db}"

    @property
    def owner(self) -> str:
        return self.url(f"tg_owner_{self.db}", self.owner_pw)

    def cli(self, monkeypatch: pytest.MonkeyPatch, url: str, *argv: str) -> int:
        monkeypatch.setenv("TRAINGUARD_DB", url)  # the password never on the command line
        return main(["fleet", *argv])

    def sql(self, url: str, statement: str) -> Any:
        import psycopg

        with psycopg.connect(url, autocommit=True) as c:
            cur = c.execute(statement)
            return cur.rowcount if cur.description is None else cur.fetchall()


def make_fleet(pg: PgServer, tmp_path: Path) -> dict[str, Any]:
    """The owner's URL and two nodes' writer URLs, made through the CLI as an operator would."""
    f = Fleet(pg)
    with pytest.MonkeyPatch.context() as mp:
        assert f.cli(mp, f.owner, "migrate") == 0
        assert f.cli(mp, f.owner, "roles", "setup") == 0
        assert f.cli(mp, f.owner, "roles", "setup") == 0  # again (as `migrate` does): the same
        urls: dict[str, Any] = {"owner": f.owner, "_fleet": f}
        for host in ("node-a", "node-b"):
            pw = tmp_path / f"{host}.pw"
            pw.write_text(f"{host}-password-{uuid.uuid4().hex}\n")
            pw.chmod(0o600)
            assert f.cli(mp, f.owner, "roles", "add", host, "--password-file", str(pw)) == 0
            urls[host] = f.url(f"tg_{host}", pw.read_text().strip())
    return urls


@pytest.fixture(scope="module")
def fleet(postgres: PgServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_fleet(postgres, tmp_path_factory.mktemp("roles"))


def verdict(health: Health) -> NodeVerdict:
    action = Advice.NONE if health is Health.OK else Advice.DRAIN
    gpu = GpuVerdict(Gpu(index=3, uuid="GPU-3", name="H100"), health, action)
    return NodeVerdict(health, action, (gpu,))


def test_a_nodes_role_writes_its_own_rows_as_an_agent_does(fleet: dict[str, Any]) -> None:
    me = NodeIdentity("node-a", rack="r1", group="h100")
    with IncidentStore(fleet["node-a"], identity=me) as store:
        rec = store.add(incident("node-a"))
        store.update(rec.id, resolved=True, resolution="drained")
        store.start_job("job-1", started=900.0, command="train.py", world_size=8)
        store.end_job("job-1", ended=990.0, status="succeeded")
        writer = FleetWriter(store, me)
        writer.observe(verdict(Health.FAILED), 1000.0)
        writer.action("drain", outcome="done", time=1000.0)
        writer.breaker("fleet", "open", reason="2 nodes in 600 s", time=1000.0)
        assert store.get(rec.id).resolution == "drained"  # type: ignore[union-attr]
        assert store.get_job("job-1").status == "succeeded"  # type: ignore[union-attr]
    f = fleet["_fleet"]
    rows = f.sql(fleet["owner"], "SELECT host, health FROM nodes WHERE host = 'node-a'")
    assert rows == [("node-a", "failed")]


def test_a_nodes_role_cannot_write_another_hosts_rows(fleet: dict[str, Any]) -> None:
    f = fleet["_fleet"]
    with IncidentStore(fleet["node-b"], identity=NodeIdentity("node-b")) as store:
        theirs = store.add(incident("node-b"))
        FleetWriter(store, NodeIdentity("node-b")).observe(verdict(Health.OK), 1000.0)
    forged = NodeIdentity("node-b")  # node-a's role claiming node-b's identity
    with IncidentStore(fleet["node-a"], identity=forged) as store:
        with pytest.raises(StoreError, match="row-level security"):
            store.add(incident("node-b", n=2))
        with pytest.raises(StoreError, match="row-level security"):
            FleetWriter(store, forged).observe(verdict(Health.FAILED), 1001.0)
        assert theirs.id in [i.id for i in store.incidents()]  # it reads the whole fleet
    a = fleet["node-a"]
    assert f.sql(a, "UPDATE nodes SET health = 'failed' WHERE host = 'node-b'") == 0
    assert f.sql(a, "UPDATE incidents SET host = 'node-a' WHERE host = 'node-b'") == 0
    assert f.sql(a, "DELETE FROM incidents WHERE host = 'node-b'") == 0
    assert f.sql(fleet["owner"], "SELECT host, health FROM nodes WHERE host = 'node-b'") == [("node-b", "ok")]
    assert f.sql(fleet["owner"], "SELECT id FROM incidents WHERE host = 'node-b'") == [(theirs.id,)]


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE incidents ADD COLUMN note TEXT",
        "DROP TABLE series",
        "TRUNCATE incidents",
        "CREATE TABLE mine (x INT)",
        "ALTER TABLE incidents DISABLE ROW LEVEL SECURITY",
        "DROP POLICY trainguard_own_host ON incidents",
        "UPDATE trainguard_schema SET version = 99",
        "INSERT INTO trainguard_writers (role_name, host) VALUES ('tg_node-a2', 'node-a')",
        "SELECT * FROM trainguard_writers",
    ],
)
def test_a_nodes_role_cannot_change_the_schema_or_its_mapping(fleet: dict[str, Any], statement: str) -> None:
    import psycopg

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        fleet["_fleet"].sql(fleet["node-a"], statement)


def test_schema_changes_wait_for_the_migration_role(
    postgres: PgServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store one version behind: a writer cannot migrate it and says who can; the owner's
    `fleet migrate` does, and the new table gets the policies."""
    fleet = make_fleet(postgres, tmp_path)
    f = fleet["_fleet"]
    f.sql(fleet["owner"], "DROP TABLE series")
    f.sql(fleet["owner"], f"UPDATE trainguard_schema SET version = {SCHEMA_VERSION - 1}")
    with pytest.raises(StoreError, match="trainguard fleet migrate"):
        IncidentStore(fleet["node-a"], identity=NodeIdentity("node-a"))
    assert f.cli(monkeypatch, fleet["owner"], "migrate") == 0
    with IncidentStore(fleet["node-a"], identity=NodeIdentity("node-a")) as store:
        assert store.backend.schema_version  # opens without migrating
    a = fleet["node-a"]
    f.sql(a, "INSERT INTO series (host, gpu, t, step_s, n, data) VALUES ('node-a', 0, 1, 60, 1, '{}')")
    import psycopg

    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        f.sql(a, "INSERT INTO series (host, gpu, t, step_s, n, data) VALUES ('node-b', 0, 1, 60, 1, '{}')")


def test_roles_are_refused_on_a_sqlite_store_and_need_a_private_password_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINGUARD_DB", str(tmp_path / "tg.db"))
    IncidentStore(tmp_path / "tg.db").close()
    assert main(["fleet", "roles", "setup"]) == 2
    assert "PostgreSQL's" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="printable ASCII"):
        scram_verifier("pässword")
