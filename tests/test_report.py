"""`trainguard report JOB`: the table, the JSON and the timeline plot, on a simulated job ledger."""

from __future__ import annotations

import json

import pytest

from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, Interval, IntervalKind, RootCause
from trainguard.incidents.plot import plot_timeline, timeline
from trainguard.incidents.report import job_report, render_report

K = IntervalKind
FAILURES = [  # (time, root cause, detected by, detection delay, action)
    (150.0, RootCause.FAULTY_GPU, "kernel_log", 1.0, "exclude_gpu"),
    (320.0, RootCause.NCCL_WATCHDOG_TIMEOUT, "heartbeat", 30.0, "restart"),
    (470.0, RootCause.SOFTWARE_BUG, "error_file", 0.2, "restart"),
]


def record_job(
    store: IncidentStore, job: str = "demo", end: float = 600.0, t0: float = 1_700_000_000.0
) -> None:
    """Write what a supervisor would for a 600 s job: 0.5 s steps, a checkpoint every 50 steps
    (2 s stall), three failures (restart 5 s, init 10 s), progress sampled every 10 steps."""
    step_s, ckpt_every, stall_s = 0.5, 50, 2.0
    store.start_job(job, started=t0, name="digits-ddp", command="python train.py", world_size=4)
    t, step, attempt, last_ckpt_t, last_ckpt_step = 0.0, 0, 0, 0.0, 0
    ivs: list[Interval] = [Interval(job, K.INIT, t0, t0 + 10)]
    t = 10.0
    failures = list(FAILURES)
    seg_start = t
    while t < end:
        if failures and t >= failures[0][0]:
            when, cause, by, delay, action = failures.pop(0)
            ivs.append(Interval(job, K.PRODUCTIVE, t0 + seg_start, t0 + when, attempt))
            ivs.append(
                Interval(job, K.LOST, t0 + last_ckpt_t, t0 + when, attempt, f"steps {last_ckpt_step}-{step}")
            )
            ivs.append(Interval(job, K.DETECTION, t0 + when, t0 + when + delay, attempt))
            lost = when - last_ckpt_t
            store.add(
                Incident(
                    job=job,
                    time=t0 + when + delay,
                    started=t0 + when,
                    root_cause=cause,
                    action=action,
                    summary=f"{cause.value} at step {step}",
                    detected_by=by,
                    detection_delay_s=delay,
                    time_lost_s=lost + delay + 15,
                    attempt=attempt,
                    rank=attempt,
                )
            )
            attempt += 1
            t = when + delay
            ivs.append(Interval(job, K.RESTART, t0 + t, t0 + t + 5, attempt))
            ivs.append(Interval(job, K.INIT, t0 + t + 5, t0 + t + 15, attempt))
            t += 15
            step, seg_start = last_ckpt_step, t
            continue
        t += step_s
        step += 1
        if step % 10 == 0:
            store.add_progress(job, t0 + t, step, loss=2.0 / (1 + step / 100), attempt=attempt)
        if step % ckpt_every == 0:
            ivs.append(Interval(job, K.CHECKPOINT, t0 + t, t0 + t + stall_s, attempt))
            t += stall_s
            last_ckpt_t, last_ckpt_step = t, step
    ivs.append(Interval(job, K.PRODUCTIVE, t0 + seg_start, t0 + end, attempt))
    store.add_intervals(ivs)
    store.end_job(job, ended=t0 + end, status="succeeded")


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "tg.db"
    with IncidentStore(path) as store:
        record_job(store)
    return path


def test_report_json_has_ettr_breakdown_and_every_incident(db, capsys):
    assert main(["report", "demo", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    g = report["goodput"]
    assert g["wall_s"] == pytest.approx(600.0)
    assert g["interruptions"] == 3 and g["attempts"] == 4
    assert 0.5 < g["ettr"] < 0.9
    parts = sum(
        g[k]
        for k in (
            "productive_s",
            "checkpoint_s",
            "init_s",
            "restart_s",
            "lost_s",
            "detection_s",
            "downtime_s",
            "unaccounted_s",
        )
    )
    assert parts == pytest.approx(600.0)
    assert g["detection_s"] == pytest.approx(31.2)
    assert [i["root_cause"] for i in report["incidents"]] == [
        "faulty_gpu",
        "nccl_watchdog_timeout",
        "software_bug",
    ]
    assert report["incidents"][0]["t_s"] == pytest.approx(151.0)


def test_report_table_names_ettr_and_each_incidents_cause_and_action(db, capsys):
    assert main(["report", "demo", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "ETTR" in out and "lost work" in out and "detection delay" in out
    for _, cause, by, _, action in FAILURES:
        row = next(line for line in out.splitlines() if cause.value in line)
        assert action in row and by in row


def test_report_plot_is_written_with_one_marker_per_failure(db, tmp_path, capsys):
    png = tmp_path / "timeline.png"
    assert main(["report", "demo", "--db", str(db), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    with IncidentStore(db) as store:
        data = timeline(job_report(store, "demo"))
    assert [m.label for m in data.failures] == [c.value for _, c, *_ in FAILURES]
    assert [round(m.x * 60) for m in data.failures] == [150, 320, 470]  # minutes since start
    assert data.unit == "min" and len(data.series) == 4
    assert {s.kind for s in data.spans} >= {"lost", "restart", "init", "detection", "checkpoint"}
    assert "ETTR" in data.title


def test_plot_timeline_returns_the_data_it_drew(db, tmp_path):
    with IncidentStore(db) as store:
        report = job_report(store, "demo")
    drawn = plot_timeline(report, tmp_path / "t.png")
    assert drawn == timeline(report) and (tmp_path / "t.png").exists()


def test_report_of_an_unknown_job_names_the_known_ones(db, capsys):
    assert main(["report", "nope", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "nope" in err and "demo" in err


def test_report_with_a_missing_db_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "nothing.db"
    assert main(["report", "demo", "--db", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "trainguard run" in err
    assert not missing.exists()


def test_report_text_of_a_job_without_incidents_says_none(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        store.start_job("quiet", started=0.0)
        store.add_interval(Interval("quiet", K.PRODUCTIVE, 0.0, 100.0))
        store.end_job("quiet", ended=100.0, status="succeeded")
        text = render_report(job_report(store, "quiet"))
    assert "ETTR           100.0%" in text and "incidents (0)" in text


def test_report_of_a_job_without_heartbeats_says_ettr_na_and_how_to_get_it(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        store.start_job("plain", started=0.0)
        store.add_interval(Interval("plain", K.UNMEASURED, 0.0, 50.0))
        store.end_job("plain", ended=50.0, status="succeeded")
        report = job_report(store, "plain")
    text = render_report(report)
    assert report["goodput"]["ettr"] is None
    assert "ETTR           n/a (no heartbeats" in text and "Guard" in text
    assert "attempts       1" in text
    assert "running, no steps reported" in text and "unaccounted" not in text
