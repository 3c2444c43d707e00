"""The replica-group loop's pure parts: judge (what to do about groups that exited and the
Lighthouse), the job's state from its groups', partial capacity, and chaos plans per group."""

from __future__ import annotations

import pytest

from trainguard.actions import GroupAction
from trainguard.chaos.plan import for_group, for_this_group, parse_plan, plan_toml
from trainguard.errors import ConfigError
from trainguard.rundir import replica_group_env
from trainguard.supervisor.config import ExitCode
from trainguard.supervisor.replicas import ReplicaConfig, group_hang_floor
from trainguard.supervisor.replicas.judge import GroupsView, ReplicaGroup, capacity, judge
from trainguard.supervisor.state import RunState, job_state


def groups(*states: RunState) -> list[ReplicaGroup]:
    return [ReplicaGroup(i, (i,), state=s) for i, s in enumerate(states)]


def view(
    exits: dict[int, int | None],
    lost: dict[int, tuple[int, ...]] | None = None,
    lighthouse: int | None = None,
) -> GroupsView:
    return GroupsView(100.0, exits, lost or {}, dict.fromkeys(exits), lighthouse)


R = RunState.RUNNING


def test_a_group_that_lost_its_gpu_is_replaced_on_a_spare():
    [act] = judge(view({0: None, 1: int(ExitCode.NO_CAPACITY)}, {1: (1,)}), groups(R, R), [2], 1)
    assert (act.kind, act.group, act.gpus) == (GroupAction.REPLACE, 1, (2,))


def test_a_group_that_lost_its_gpu_without_a_spare_stays_down_while_the_other_runs():
    [act] = judge(view({0: None, 1: int(ExitCode.NO_CAPACITY)}, {1: (1,)}), groups(R, R), [], 1)
    assert (act.kind, act.group) == (GroupAction.STOP_GROUP, 1)


def test_a_crashed_group_with_budget_left_is_restarted_on_its_own_gpus():
    [act] = judge(view({0: None, 1: int(ExitCode.INTERRUPTED)}, {1: ()}), groups(R, R), [], 1)
    assert (act.kind, act.gpus) == (GroupAction.REPLACE, (1,))


def test_a_group_out_of_budget_stops_and_the_last_one_down_restarts_them_all():
    g = groups(RunState.STOPPED, R)
    acts = judge(view({0: 1, 1: int(ExitCode.FAILED)}, {1: ()}), g, [], 1)
    assert [a.kind for a in acts] == [GroupAction.STOP_GROUP, GroupAction.RESTART_ALL]


def test_every_group_down_with_no_job_restart_left_stops_the_job():
    acts = judge(view({0: 1, 1: 1}, {0: (), 1: ()}), groups(R, R), [], 0)
    assert acts[-1].kind is GroupAction.STOP_JOB and "budget" in acts[-1].reason


def test_a_crash_loop_in_every_group_is_not_restarted():
    code = int(ExitCode.CRASH_LOOP)
    acts = judge(view({0: code, 1: code}, {0: (), 1: ()}), groups(R, R), [], 5)
    assert acts[-1].kind is GroupAction.STOP_JOB and "crash loop" in acts[-1].reason


def test_a_finished_group_is_not_restarted_when_the_other_stops():
    acts = judge(view({0: 0, 1: int(ExitCode.FAILED)}, {1: ()}), groups(R, R), [], 1)
    assert [a.kind for a in acts] == [GroupAction.FINISHED, GroupAction.STOP_GROUP]


def test_a_dead_lighthouse_is_restarted_and_nothing_else_happens():
    [act] = judge(view({0: None, 1: None}, {}, lighthouse=-9), groups(R, R), [], 1)
    assert (act.kind, act.code) == (GroupAction.RESTART_LIGHTHOUSE, -9)


def test_running_groups_need_nothing():
    assert judge(view({0: None, 1: None}, {}), groups(R, R), [], 1) == []


def test_one_group_down_and_others_running_is_the_degraded_state():
    assert job_state([R, RunState.RECOVERING]) is RunState.DEGRADED
    assert job_state([R, R]) is RunState.RUNNING
    assert job_state([RunState.RECOVERING, RunState.STOPPED]) is RunState.RECOVERING
    assert job_state([RunState.SUCCEEDED, R]) is RunState.RUNNING
    assert job_state([RunState.STOPPED, RunState.STOPPED]) is RunState.STOPPED
    assert job_state([RunState.SUCCEEDED, RunState.SUCCEEDED]) is RunState.SUCCEEDED


def test_capacity_counts_the_time_k_of_n_groups_stepped():
    a, b = ReplicaGroup(0, (0,)), ReplicaGroup(1, (1,))
    a.steps = [(float(t), t) for t in range(0, 11)]  # steps all along 0..10 s
    b.steps = [(float(t), t) for t in range(0, 4)] + [(float(t), t) for t in range(8, 11)]  # down 3..8 s
    cap = capacity([a, b], 0.0, 10.0)
    assert cap["2_of_2_s"] == pytest.approx(5.0) and cap["1_of_2_s"] == pytest.approx(5.0)
    assert cap["capacity"] == pytest.approx(0.75)


def test_capacity_of_steps_slower_than_the_gap_rule_is_not_zero():
    # 3 s steps, all seen: the groups stepped the whole time (a gap rule of 2 s made it 0.00).
    a, b = ReplicaGroup(0, (0,)), ReplicaGroup(1, (1,))
    a.steps = b.steps = [(float(t), t // 3) for t in range(0, 31, 3)]
    assert capacity([a, b], 0.0, 30.0)["capacity"] == pytest.approx(1.0)


def test_capacity_of_a_run_with_no_step_seen_is_not_measured():
    # No heartbeat (a script that reports no step) or no wall time: n/a, never 0.
    assert capacity(groups(R, R), 0.0, 30.0) == {}
    ran = ReplicaGroup(0, (0,), steps=[(1.0, 1), (2.0, 2)])
    assert capacity([ran], 5.0, 5.0) == {}


@pytest.mark.parametrize("floor", [1.0, 4.0, 10.0, 30.0, 600.0])
def test_a_groups_hang_timeout_outlasts_its_wait_on_a_peer_and_ends_before_the_quorum_times_out(floor):
    # A healthy group waits on a hung, healing or slow peer for up to torchft's collective timeout
    # (then it discards the step and goes on): a group hang timeout under it restarts a healthy
    # group for its peer's fault (seen under load with --hang-timeout-floor 4 and the 10 s timeout).
    replicas = ReplicaConfig()
    group = group_hang_floor(floor, replicas)
    assert group > replicas.timeout_s
    assert group <= replicas.quorum_timeout_s / 2  # a hung group is stopped before the quorum times out
    assert group_hang_floor(floor, ReplicaConfig(timeout_s=2.0)) == max(min(floor, 15.0), 7.0)


def test_a_plan_aims_faults_at_one_group_and_round_trips_through_toml():
    plan = parse_plan(
        '[[fault]]\nkind = "kill"\ngroup = 1\nrank = 0\nstep = 5\n\n'
        '[[fault]]\nkind = "xid"\nrank = 0\nxid = 48\nstep = 9\n'
    )
    assert [f.kind.value for f in for_group(plan, 0).faults] == ["xid"]
    assert [f.kind.value for f in for_group(plan, 1).faults] == ["kill", "xid"]
    assert for_group(plan, None) == plan
    assert for_this_group(plan, replica_group_env(1, 2)) == for_group(plan, 1)
    assert for_this_group(plan, {}) == plan
    assert parse_plan(plan_toml(plan.faults)).faults == plan.faults


def test_a_negative_group_is_a_clear_error():
    with pytest.raises(ConfigError, match="'group' must not be negative"):
        parse_plan('[[fault]]\nkind = "kill"\ngroup = -1\nrank = 0\nstep = 5\n')


def test_only_trainguard_torch_ft_imports_torchft():
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "trainguard"
    importers = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n.split(".")[0] == "torchft" for n in names):
                importers.add(path.relative_to(src).as_posix())
    assert importers == {"torch/ft.py"}


def test_the_groups_timeline_has_a_line_per_group_and_marks_each_groups_incident(tmp_path):
    from trainguard.incidents.groups_plot import groups_timeline, plot_groups

    incident = {"time": 105.0, "rank": 0, "gpu": 1, "root_cause": "faulty_gpu"}
    result = {
        "job_id": "j",
        "capacity": {"capacity": 0.8},
        "groups": [
            {"group": 0, "steps": [[100.0, 0], [104.0, 40], [108.0, 80]], "runs": [{"incidents": []}]},
            {
                "group": 1,
                "steps": [[100.0, 0], [104.0, 40], [108.0, 80]],
                "runs": [{"incidents": [incident]}],
            },
        ],
    }
    data = groups_timeline(result)
    assert [line.group for line in data.lines] == [0, 1] and data.lines[0].x == (0.0, 4.0, 8.0)
    [mark] = data.marks
    assert (mark.x, mark.group) == (5.0, 1) and "GPU 1: faulty_gpu" in mark.label
    assert "capacity 0.80" in data.title
    pytest.importorskip("matplotlib")
    plot_groups(result, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_gpus_and_replica_groups_parse_and_a_bad_gpu_list_is_a_clear_error():
    import argparse

    from trainguard.cli import run as run_cli

    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    ok = parser.parse_args(
        ["run", "--standalone", "--replica-groups", "2", "--gpu-ids", "2,3", "--", "python", "t.py"]
    )
    config = run_cli.config_from_args(ok)
    assert (config.replica_groups, config.launch.gpus) == (2, (2, 3))
    bad = parser.parse_args(["run", "--standalone", "--gpu-ids", "a,b", "--", "python", "t.py"])
    with pytest.raises(ConfigError, match="--gpu-ids 'a,b': give GPU indices"):
        run_cli.config_from_args(bad)
