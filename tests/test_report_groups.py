"""`trainguard report` on a ``--replica-groups 2`` job: the ledgers are written by the real
recording code (each group's `JobRecorder`, as its loop writes it; the replica loop's heals and
the discarded steps the ranks wrote into the run directory), then read back as the whole job's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.incidents import Incident, IncidentStore, IntervalKind, RootCause
from trainguard.incidents.goodput import Interval
from trainguard.incidents.groups_report import groups_result, groups_summary, k_of_n, render_groups
from trainguard.incidents.report import job_report, render_report
from trainguard.rundir import HeartbeatWriter, append_discarded
from trainguard.supervisor.config import ExitCode, LaunchConfig, RecordConfig, SupervisorConfig
from trainguard.supervisor.record import JobRecorder
from trainguard.supervisor.replicas import GroupRun, ReplicaConfig, ReplicaResult, ReplicaSupervisor
from trainguard.supervisor.state import RunState

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


def test_the_final_line_counts_the_groups_incidents_heals_and_capacity(tmp_path):
    _, data = record_replica_job(tmp_path)
    result = ReplicaResult.from_dict(data)
    # Group 1's own loop recorded its rank's failure (its `trainguard run`'s result, read back).
    xid = Incident(
        job="llm.g1", time=T0 + 41, root_cause=RootCause.FAULTY_GPU, summary="Xid 79", rank=0, gpu=1
    )
    run = {"exit_code": 0, "job_id": "llm.g1", "run_dir": str(tmp_path), "incidents": [xid.to_dict()]}
    g1 = result.groups[1]
    groups = (
        result.groups[0],
        type(g1)(**{**_fields(g1), "runs": (GroupRun.from_dict({**run, "group": 1, "start": 1}),)}),
    )
    line = type(result)(**{**_fields(result), "groups": groups}).summary()
    assert "incidents 0 in the job, 1 in the groups; 1 heal(s), longest 10.0s" in line
    assert "capacity 0.87" in line  # the report's figure (the groups' ledgers), not 0.00


def test_a_groups_restart_is_a_heal_even_when_its_step_never_falls(tmp_path):
    # torchft heals a restarted rank before its first commit: a script that beats only on commits
    # (torchft alone, `trainguard.torch.ft_progress`) goes from step 5 to 8. Its new attempt's
    # start beat is what says it restarted.
    clock = Clock()
    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "train.py")), RecordConfig(job_id="ft", runs_root=tmp_path, db=None)
    )
    sup = ReplicaSupervisor(config, ReplicaConfig(groups=2), clock=clock)
    beats = {g.index: HeartbeatWriter(sup.group_dir(g), 0, 0) for g in sup.groups}
    for g in sup.groups:
        g.started_at = T0
    for t in range(1, 6):
        clock.now = T0 + t
        for w in beats.values():
            w.beat(t, now=clock.now)
        sup.look()
    restarted = HeartbeatWriter(sup.group_dir(sup.groups[1]), 0, attempt=1)
    clock.now = T0 + 6
    restarted.beat(0, phase="init", now=clock.now)  # its worker started again and joins a quorum
    beats[0].beat(6, now=clock.now)
    sup.look()
    assert sup.groups[1].state is RunState.RECOVERING
    clock.now = T0 + 9
    beats[0].beat(8, now=clock.now)
    restarted.beat(8, now=clock.now)  # healed from group 0: its first commit is at group 0's step
    sup.look()
    assert sup.groups[1].state is RunState.RUNNING and sup.groups[1].heals == [3.0]
    assert sup.groups[0].heals == []


def test_a_group_that_reported_no_step_has_no_capacity_figure():
    ran = [Interval("j.g0", K.PRODUCTIVE, 0, 100)]
    silent = [Interval("j.g1", K.UNMEASURED, 0, 100)]  # a script that reports no step
    section = groups_summary({0: ran, 1: silent}, 0, 100)
    assert section["capacity"] is None
    [line] = [x for x in render_groups(section) if "capacity" in x]
    assert "n/a" in line and "0.0%" not in line
    assert groups_summary({0: ran}, 0, 100)["capacity"] == 1.0


def _fields(value: object) -> dict:
    from dataclasses import fields

    return {f.name: getattr(value, f.name) for f in fields(value)}


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
