"""The SQLite incident store: round trip, schema, errors, concurrent writers, crash safety."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from trainguard.actions import Advice
from trainguard.errors import StoreError
from trainguard.incidents import Incident, IncidentStore, Interval, IntervalKind, RootCause, default_db_path
from trainguard.incidents.schema import SCHEMA_VERSION
from trainguard.records import Category


def make(job: str = "job-a", t: float = 100.0, **kw) -> Incident:
    base = {
        "root_cause": RootCause.FAULTY_GPU,
        "action": Advice.RESTART_APP,
        "summary": "GPU 3 fell off the bus",
        "started": t - 5,
        "category": Category.GPU_HARDWARE,
        "evidence": [
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.",
            {"xid": 79},
        ],
        "gpu": 3,
        "node": "node-1",
        "rank": 3,
        "attempt": 0,
        "detected_by": "kernel_log",
        "detection_delay_s": 0.5,
    }
    base.update(kw)
    return Incident(job=job, time=t, **base)


def test_an_incident_round_trips_through_the_store(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        added = store.add(make())
        assert added.id is not None
        got = store.get(added.id)
    assert got == added
    assert got.root_cause is RootCause.FAULTY_GPU
    assert got.action == "restart_app" and got.category == "gpu_hardware"
    assert got.evidence[1] == {"xid": 79}


def test_update_changes_only_the_named_fields(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        inc = store.add(make())
        updated = store.update(inc.id, time_lost_s=42.0, resolved=True, resolution="restarted on 7 GPUs")
        assert store.get(inc.id) == updated
        assert updated.time_lost_s == 42.0 and updated.resolved and updated.summary == inc.summary
        with pytest.raises(StoreError, match="no incident 999"):
            store.update(999, resolved=True)
        with pytest.raises(StoreError, match="bogus"):
            store.update(inc.id, bogus=1)


def test_list_filters_by_job_and_time_and_limit_keeps_the_newest(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        for i in range(5):
            store.add(make("a", 100.0 + i))
        store.add(make("b", 50.0))
        assert [i.time for i in store.incidents(job="a")] == [100, 101, 102, 103, 104]
        assert [i.time for i in store.incidents(job="a", since=103)] == [103, 104]
        assert [i.time for i in store.incidents(limit=2)] == [103, 104]
        assert store.incidents()[0].job == "b"


def test_stats_count_causes_and_mtbf_over_the_jobs_wall_time(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        store.start_job("a", started=0.0, world_size=8)
        store.end_job("a", ended=1000.0, status="succeeded")
        store.add(make("a", 100.0, time_lost_s=10.0))
        store.add(make("a", 300.0, time_lost_s=20.0))
        store.add(make("a", 500.0, root_cause=RootCause.SOFTWARE_BUG, action="restart", time_lost_s=5.0))
        stats = store.stats(job="a")
    assert stats.count == 3
    assert stats.by_root_cause == {"faulty_gpu": 2, "software_bug": 1}
    assert stats.by_action == {"restart_app": 2, "restart": 1}
    assert stats.time_lost_s == 35.0
    assert stats.mtbf_s == pytest.approx(1000.0 / 3)


def test_jobs_intervals_progress_and_goodput_are_stored(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        store.start_job("a", started=0.0, name="llm", command="python train.py", world_size=4)
        store.add_intervals(
            [
                Interval("a", IntervalKind.INIT, 0, 10),
                Interval("a", IntervalKind.PRODUCTIVE, 10, 90),
                Interval("a", IntervalKind.LOST, 70, 90, detail="steps 700-900 redone"),
                Interval("a", IntervalKind.RESTART, 90, 100, attempt=1),
            ]
        )
        for s in range(0, 100, 10):
            store.add_progress("a", time=10.0 + s * 0.8, step=s, loss=1.0 / (s + 1))
        store.end_job("a", ended=100.0, status="succeeded")
        job = store.get_job("a")
        assert job is not None and job.world_size == 4 and job.status == "succeeded" and job.command
        assert len(store.intervals("a")) == 4 and store.intervals("a")[2].detail == "steps 700-900 redone"
        assert [p.step for p in store.progress("a")][:3] == [0, 10, 20]
        summary = store.goodput("a")
    assert summary.wall_s == 100.0 and summary.productive_s == 60.0 and summary.lost_s == 20.0
    assert summary.ettr == pytest.approx(0.6)


def test_the_store_uses_wal_and_records_its_schema_version(tmp_path):
    path = tmp_path / "tg.db"
    IncidentStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_a_store_from_a_newer_trainguard_is_refused_by_name(tmp_path):
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match=r"future\.db.*newer"):
        IncidentStore(path)


def test_a_file_that_is_not_a_database_is_a_store_error_naming_it(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("this is not sqlite\n" * 100)
    with pytest.raises(StoreError, match=r"notes\.txt"):
        IncidentStore(path)


def test_a_missing_store_is_not_created_when_asked_not_to(tmp_path):
    path = tmp_path / "missing.db"
    with pytest.raises(StoreError, match=r"missing\.db.*trainguard run"):
        IncidentStore(path, create=False)
    assert not path.exists()


def test_default_db_path_follows_the_environment():
    assert str(default_db_path({"TRAINGUARD_DB": "/x/y.db"})) == "/x/y.db"
    assert str(default_db_path({})) == "trainguard.db"


def test_threads_of_one_process_can_share_a_store(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:

        def work(n: int) -> None:
            for i in range(25):
                store.add(make(f"t{n}", float(i)))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.stats().count == 100


WRITER = textwrap.dedent(
    """
    import sys
    from trainguard.incidents import Incident, IncidentStore, RootCause
    path, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = IncidentStore(path)
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for i in range(n):
        inc = store.add(Incident(job=job, time=float(i), root_cause=RootCause.GPU_HBM_MEMORY,
                                 summary="x" * 200, evidence=[f"line {i}"] * 5))
        store.add_progress(job, time=float(i), step=i)
        print(inc.id, flush=True)
    """
)


def _writer(path, job: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), job, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_two_processes_writing_at_once_lose_no_incident(tmp_path):
    path = tmp_path / "tg.db"
    procs = [_writer(path, f"job{k}", 200) for k in range(2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    ids: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        ids += [int(x) for x in out.split()]
    assert len(ids) == 400 and len(set(ids)) == 400
    with IncidentStore(path) as store:
        assert len(store.incidents(job="job0")) == 200 and len(store.incidents(job="job1")) == 200
        assert len(store.progress("job0")) == 200


def test_a_writer_killed_mid_write_loses_no_committed_incident(tmp_path):
    path = tmp_path / "tg.db"
    proc = _writer(path, "victim", 100_000)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()
    committed: list[int] = []
    deadline = time.monotonic() + 60
    while len(committed) < 60 and time.monotonic() < deadline:
        committed.append(int(proc.stdout.readline()))
    os.kill(proc.pid, signal.SIGKILL)  # mid-write: it was writing as fast as it could
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert len(committed) == 60
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with IncidentStore(path) as store:
        stored = {i.id for i in store.incidents(job="victim")}
        assert set(committed) <= stored
        store.add(make("after-crash"))  # and the store still takes writes
        assert store.incidents(job="after-crash")


def test_a_forked_child_opens_its_own_connection(tmp_path):
    # SQLite connections must not cross fork(): the child must not reuse the parent's.
    with IncidentStore(tmp_path / "tg.db") as store:
        store.add(make("parent", 1.0))
        parent_conn = store._conn()
        pid = os.fork()
        if pid == 0:
            try:
                fresh = store._conn() is not parent_conn
                store.add(make("child", 2.0))
                os._exit(0 if fresh else 3)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        store.add(make("parent", 3.0))
        assert [i.job for i in store.incidents()] == ["parent", "child", "parent"]
