"""`trainguard report` on a ``--replica-groups 2`` job: the ledgers are written by the real
recording code (each group's `JobRecorder`, as its loop writes it; the replica loop's heals and
the discarded steps the ranks wrote into the run directory), then read back as the whole job's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, IntervalKind, RootCause
from trainguard.incidents.groups_report import groups_result, k_of_n
from trainguard.incidents.report import job_report, render_report
from trainguard.rundir import append_discarded
from trainguard.supervisor.config import ExitCode, LaunchConfig, RecordConfig, SupervisorConfig
from trainguard.supervisor.record import JobRecorder
from trainguard.supervisor.replicas import ReplicaConfig, ReplicaResult, ReplicaSupervisor

K = IntervalKind
T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def record_replica_job(tmp_path: Path) -> tuple[Path, dict]:
    """A 100 s job of two groups: group 0 steps throughout and discards two steps (its peer died
    mid-all-reduce, then hung); group 1 dies at 40 s, is restarted at 45 s and heals from group 0
    by 55 s."""
    db = tmp_path / "tg.db"
    clock = Clock()
    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "train.py")),
        RecordConfig(job_id="llm", runs_root=tmp_path / "runs", db=db),
    )
    sup = ReplicaSupervisor(config, ReplicaConfig(groups=2), clock=clock)
    sup.started = T0
    sup.recorder.start_job(T0, "python train.py", 2)
    g0, g1 = sup.groups
    recorders = {g.index: JobRecorder(f"llm.{g.name}", sup.group_dir(g), db) for g in sup.groups}
    for r in recorders.values():
        r.start_job(T0, "python train.py", 1)
    # Group 0's loop: one attempt, productive from 5 s to the end.
    recorders[0].interval(K.INIT, T0, T0 + 5, 0)
    recorders[0].interval(K.PRODUCTIVE, T0 + 5, T0 + 100, 0)
    # Group 1's loop: productive to 40 s, the failure, a restart from a warm standby.
    r1 = recorders[1]
    r1.interval(K.INIT, T0, T0 + 5, 0)
    r1.interval(K.PRODUCTIVE, T0 + 5, T0 + 40, 0)
    r1.interval(K.DETECTION, T0 + 40, T0 + 41, 0)
    r1.interval(K.RESTART, T0 + 41, T0 + 45, 1)
    r1.interval(K.INIT, T0 + 45, T0 + 47, 1)
    r1.interval(K.PRODUCTIVE, T0 + 47, T0 + 100, 1)
    r1.add(
        Incident(
            job="llm.g1",
            time=T0 + 41,
            root_cause=RootCause.FAULTY_GPU,
            action="restart",
            summary="Xid 79",
            rank=0,
            gpu=1,
        )
    )
    # The ranks of group 0 wrote the two steps they discarded.
    for step, start in ((80, 40.0), (81, 40.5)):
        append_discarded(sup.group_dir(g0), 0, step, T0 + start, T0 + start + 0.5)
    # The replica loop sees both groups step, group 1's step fall (restarted), then catch up.
    for g in sup.groups:  # as `_start` leaves them
        g.started_at = T0
    for t, s0, s1 in (
        (5, 0, 0),
        (10, 20, 20),
        (39, 78, 78),
        (45, 90, 0),
        (50, 100, 60),
        (55, 110, 110),
        (99, 198, 198),
    ):
        clock.now = T0 + t
        sup._stepped(g0, s0, clock.now)
        sup._stepped(g1, s1, clock.now)
    for r in recorders.values():
        r.finish(T0, T0 + 100, "succeeded")
        r.close()
    clock.now = T0 + 100
    result = sup._finish(ExitCode.OK, "training completed")
    assert ReplicaResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result  # as --json writes it
    return db, result.to_dict()


def test_a_replica_jobs_report_is_its_groups_capacity_weighted(tmp_path):
    db, result = record_replica_job(tmp_path)
    with IncidentStore(db) as store:
        report = job_report(store, "llm")
    groups = report["groups"]
    assert groups["replica_groups"] == 2 and [g["group"] for g in groups["groups"]] == [0, 1]
    # Group 0: productive 5..100 less its two discarded steps (lost work); group 1: 5..40 and
    # 47..100, less its heal (45..55: not contributing until it reached the live group's step).
    g0, g1 = groups["groups"]
    assert g0["productive_s"] == pytest.approx(95 - 1.0)
    assert g0["discarded_steps"] == 2 and g0["discarded_s"] == pytest.approx(1.0)
    assert g1["productive_s"] == pytest.approx(35 + 45)
    assert g1["heals_s"] == [10.0] and groups["heals_s"] == [10.0]
    assert g1["interruptions"] == 1 and g0["interruptions"] == 0
    assert groups["capacity"] == pytest.approx((94 + 80) / 200, abs=1e-4)
    assert report["goodput"]["ettr"] == pytest.approx((94 + 80) / 200)
    assert report["goodput"]["productive_s"] == pytest.approx(87.0)
    # The rows add up to the wall time, as for any job.
    rows = [v for k, v in report["goodput"].items() if k.endswith("_s") and k != "wall_s"]
    assert sum(rows) == pytest.approx(report["goodput"]["wall_s"])
    # k of N: none at the start and while group 0 discarded the steps of group 1's failure, one
    # while group 1 was down and healing, both otherwise.
    assert groups["k_of_n_s"] == {"0_of_2": 6.0, "1_of_2": 14.0, "2_of_2": 80.0}
    # The loop's result carries the same figures.
    assert result["goodput"]["ettr"] == report["goodput"]["ettr"]
    assert [g["discarded_steps"] for g in result["groups"]] == [2, 0]
    assert g1["incidents"][0]["gpu"] == 1
    # Each group's line for the plot: the steps the loop saw (thinned to one a second at most).
    assert [g["progress"] for g in groups["groups"]] == [g["steps"] for g in result["groups"]]
    assert report["last_step"] == 198


def test_the_report_text_has_a_line_per_group_with_heals_and_discarded_steps(tmp_path):
    db, _ = record_replica_job(tmp_path)
    with IncidentStore(db) as store:
        text = render_report(job_report(store, "llm"))
    assert "capacity-weighted over the replica groups" in text
    assert "replica groups (2)" in text and "capacity       87.0%" in text
    assert "heals          1, median 10.0s, longest 10.0s" in text
    assert "discarded      2 steps" in text
    [line0] = [x for x in text.splitlines() if x.strip().startswith("group 0")]
    [line1] = [x for x in text.splitlines() if x.strip().startswith("group 1")]
    assert "discarded 2" in line0 and "heals -" in line0
    assert "interruptions 1" in line1 and "heals 10.0s" in line1


def test_a_job_without_groups_reports_as_before(tmp_path):
    with IncidentStore(tmp_path / "tg.db") as store:
        store.start_job("llm", started=T0, world_size=1)
        store.start_job("llm.gx", started=T0, world_size=1)  # not a group's id
        store.end_job("llm", ended=T0 + 10, status="succeeded")
        report = job_report(store, "llm")
    assert report["groups"] is None and "replica groups" not in render_report(report)


def test_k_of_n_counts_overlapping_spans():
    spans = [[(0.0, 10.0)], [(5.0, 8.0)], []]
    assert k_of_n(spans, 0.0, 12.0) == {"0_of_3": 2.0, "1_of_3": 7.0, "2_of_3": 3.0}


def test_report_json_and_the_plot_show_each_group(tmp_path, capsys):
    db, _ = record_replica_job(tmp_path)
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    assert main(["report", "llm", "--db", str(db), "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["groups"]["discarded_steps"] == 2
    assert png.stat().st_size > 0
    from trainguard.incidents.groups_plot import groups_timeline

    data = groups_timeline(groups_result(out))
    assert [line.group for line in data.lines] == [0, 1]
    assert [m.label for m in data.marks] == ["g1 rank 0 GPU 1: faulty_gpu"]


def test_the_module_examples_hold():
    import doctest

    import trainguard.incidents.groups_report as report_mod
    import trainguard.supervisor.replicas.judge as groups_mod

    for mod in (report_mod, groups_mod):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0
