"""`trainguard incidents list|show|stats`: output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, RootCause


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "tg.db"
    with IncidentStore(path) as store:
        store.start_job("a", started=1_700_000_000.0)
        store.end_job("a", ended=1_700_001_000.0, status="succeeded")
        store.add(
            Incident(
                job="a",
                time=1_700_000_100.0,
                root_cause=RootCause.GPU_HBM_MEMORY,
                action="exclude_gpu",
                summary="Xid 95 on GPU 2",
                gpu=2,
                node="n1",
                time_lost_s=30.0,
                category="gpu_memory_ecc",
                evidence=["NVRM: Xid (PCI:0000:3b:00): 95, pid=7, name=python, Uncontained", {"xid": 95}],
            )
        )
        store.add(
            Incident(
                job="a",
                time=1_700_000_500.0,
                root_cause=RootCause.SOFTWARE_BUG,
                action="restart",
                summary="KeyError: 'labels'",
                rank=1,
                time_lost_s=12.0,
            )
        )
        store.add(
            Incident(job="b", time=50.0, root_cause=RootCause.HOST, action="restart", summary="OOM killer")
        )
    return path


def test_list_shows_one_row_per_incident_with_cause_and_action(db, capsys):
    assert main(["incidents", "list", "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["id", "detected"]
    rows = out[1:]
    assert len(rows) == 3
    assert "gpu_hbm_memory" in rows[1] and "exclude_gpu" in rows[1] and "gpu 2" in rows[1]
    assert "2023-11-14 22:15:00" in rows[1]
    assert rows[0].startswith("3") and "t=50.0s" in rows[0]


def test_list_json_filters_by_job(db, capsys):
    assert main(["incidents", "list", "--job", "a", "--json", "--db", str(db)]) == 0
    items = json.loads(capsys.readouterr().out)
    assert [i["root_cause"] for i in items] == ["gpu_hbm_memory", "software_bug"]
    assert items[0]["evidence"][1] == {"xid": 95}


def test_show_prints_the_evidence(db, capsys):
    assert main(["incidents", "show", "1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("incident 1: gpu_hbm_memory")
    assert "Xid (PCI:0000:3b:00): 95" in out and "evidence (2)" in out


def test_show_of_a_missing_id_exits_1(db, capsys):
    assert main(["incidents", "show", "99", "--db", str(db)]) == 1
    assert "no incident 99" in capsys.readouterr().err


def test_stats_counts_by_root_cause_and_reports_mtbf(db, capsys):
    assert main(["incidents", "stats", "--job", "a", "--json", "--db", str(db)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["count"] == 2 and stats["by_root_cause"] == {"gpu_hbm_memory": 1, "software_bug": 1}
    assert stats["mtbf_s"] == pytest.approx(500.0) and stats["time_lost_s"] == 42.0
    assert main(["incidents", "stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "incidents: 3" in out and "by root cause" in out and "host" in out


def test_a_missing_store_exits_2_naming_the_file_and_is_not_created(tmp_path, capsys):
    missing = tmp_path / "none.db"
    assert main(["incidents", "list", "--db", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "trainguard run" in err
    assert not missing.exists()


def test_the_store_defaults_to_trainguard_db_from_the_environment(db, tmp_path):
    env = {"TRAINGUARD_DB": str(db), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "incidents", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 3
    env.pop("TRAINGUARD_DB")
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "incidents", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 2 and "trainguard.db" in out.stderr


def test_incidents_without_a_subcommand_is_a_usage_error(capsys):
    assert main(["incidents"]) == 2


def test_since_accepts_unix_seconds_iso_times_and_durations_ago():
    from trainguard.cli.incidents import parse_since

    assert parse_since("1700000000") == 1_700_000_000.0
    assert parse_since("2023-11-14T22:13:20") == 1_700_000_000.0
    assert parse_since("2023-11-14T23:13:20+01:00") == 1_700_000_000.0
    assert parse_since("6h", now=100_000.0) == 100_000.0 - 6 * 3600
    assert parse_since("90m", now=10_000.0) == 10_000.0 - 5400


def test_list_since_filters_and_a_bad_since_is_a_usage_error(db, capsys):
    assert main(["incidents", "list", "--since", "2023-11-14T22:20:00", "--json", "--db", str(db)]) == 0
    assert [i["summary"] for i in json.loads(capsys.readouterr().out)] == ["KeyError: 'labels'"]
    with pytest.raises(SystemExit) as exc:
        main(["incidents", "list", "--since", "yesterday-ish", "--db", str(db)])
    assert exc.value.code == 2
