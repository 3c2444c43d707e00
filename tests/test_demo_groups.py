"""`trainguard demo --replica-groups 2`: the self-test's verdict both ways (pure, on result-shaped
dicts), and the demo itself end to end (slow: torchft's real Lighthouse, two groups of
examples/train_ft.py, a simulated Xid 79 in one)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest

from real_parts import require_module
from trainguard.demo.groups import check_groups, plan_toml


def good_run() -> tuple[dict[str, Any], dict[str, Any]]:
    """Group 1 loses GPU 1 at 2.5 s, is back on the spare GPU 2 at 18 s and heals; group 0
    commits a step every 0.1 s throughout."""
    healthy = {
        "group": 0,
        "state": "succeeded",
        "starts": 1,
        "gpus": [0],
        "heals_s": [],
        "steps": [(t / 10, t) for t in range(300)],
        "runs": [{"attempts": 1, "incidents": [], "injected": []}],
    }
    incident = {"rank": 0, "gpu": 1, "root_cause": "faulty_gpu", "summary": "GPU 1 failed: Xid 79"}
    injected = {"index": 0, "kind": "xid", "time": 2.5, "rank": 0, "gpu": 1, "step": 30}
    failing = {
        "group": 1,
        "state": "succeeded",
        "starts": 2,
        "gpus": [2],
        "heals_s": [15.5],
        "steps": [(0.0, 0), (1.0, 10), (2.0, 20), (18.0, 0), (19.0, 190)],
        "runs": [
            {"attempts": 1, "incidents": [incident], "injected": [injected]},
            {"attempts": 1, "incidents": [], "injected": []},
        ],
    }
    result = {"exit_code": 0, "groups": [healthy, failing]}
    report = {"groups": {"capacity": 0.7, "k_of_n_s": {"1_of_2": 16.5, "2_of_2": 12.0}, "heals_s": [15.5]}}
    return result, report


def failed(result: dict[str, Any], report: dict[str, Any] | None, same: bool | None = True) -> list[str]:
    return [c.name for c in check_groups(result, report, same) if not c.ok]


def test_the_self_test_passes_a_run_where_only_the_faulty_group_stopped():
    result, report = good_run()
    checks = check_groups(result, report, True)
    assert all(c.ok for c in checks), checks
    assert [c.name for c in checks] == [
        "fault injected",
        "culprit",
        "group 0 never stopped",
        "group 0 kept stepping",
        "group 1 healed",
        "report: partial capacity and the heal",
        "same weights",
    ]


def test_a_healthy_group_that_paused_fails_the_self_test():
    result, report = good_run()
    steps = result["groups"][0]["steps"]
    result["groups"][0]["steps"] = [(t, s) for t, s in steps if t <= 2.5] + [(18.5, 26), (19.0, 31)]
    assert failed(result, report) == ["group 0 kept stepping"]


def test_a_faulty_group_first_seen_at_its_faults_step_is_out_from_the_fault():
    # Beside two CPU hogs the faulty group joined late: healed to the live step, it fired the
    # fault on its first step, and the loop saw that step only after the fault. It was out from
    # the fault until its restart (step 0), and the healthy group kept stepping meanwhile.
    result, report = good_run()
    failing = result["groups"][1]
    failing["steps"] = [(2.6, 30), (18.0, 0), (19.0, 190)]
    assert failed(result, report) == []
    healthy = result["groups"][0]
    healthy["steps"] = [(t, s) for t, s in healthy["steps"] if t <= 2.5] + [(18.5, 26), (19.0, 31)]
    assert failed(result, report) == ["group 0 kept stepping"]


def test_a_faulty_group_first_seen_at_step_0_after_the_fault_is_back_only_after_its_restart():
    # Its first heartbeats (step 0, then the fault's step) were read just after the fault; the
    # loop started it again at 16 s. It was out from the fault until 18 s, not from 2.51 s.
    result, report = good_run()
    failing = result["groups"][1]
    failing["steps"] = [(2.51, 0), (2.61, 30), (18.0, 0), (19.0, 190)]
    failing["started_at"] = [0.0, 16.0]
    assert failed(result, report) == []
    healthy = result["groups"][0]
    healthy["steps"] = [(t, s) for t, s in healthy["steps"] if t <= 2.5] + [(18.5, 26), (19.0, 31)]
    assert failed(result, report) == ["group 0 kept stepping"]


def test_a_healthy_group_that_was_restarted_fails_the_self_test():
    result, report = good_run()
    result["groups"][0]["starts"] = 2
    assert failed(result, report) == ["group 0 never stopped"]
    result, report = good_run()
    result["groups"][0]["runs"][0]["incidents"] = [{"summary": "rank 0 hung", "rank": 0, "gpu": 0}]
    assert failed(result, report) == ["group 0 never stopped"]


@pytest.mark.parametrize(
    "change",
    [{"gpu": 0}, {"rank": 1}, {"root_cause": "unknown"}],
    ids=["wrong GPU", "wrong rank", "wrong cause"],
)
def test_a_wrong_culprit_fails_the_self_test(change):
    result, report = good_run()
    result["groups"][1]["runs"][0]["incidents"][0].update(change)
    assert failed(result, report) == ["culprit"]


def test_a_failed_group_that_never_came_back_fails_the_self_test():
    result, report = good_run()
    failing = result["groups"][1]
    failing["steps"] = failing["steps"][:3]
    failing["state"], failing["heals_s"] = "stopped", []
    assert failed(result, report) == ["group 0 kept stepping", "group 1 healed"]


def test_a_report_without_the_partial_capacity_or_differing_weights_fail_the_self_test():
    result, report = good_run()
    full = copy.deepcopy(report)
    full["groups"].update(capacity=1.0, k_of_n_s={"2_of_2": 30.0})
    assert failed(result, full) == ["report: partial capacity and the heal"]
    assert failed(result, None) == ["report: partial capacity and the heal"]
    assert failed(result, report, same=False) == ["same weights"]


def test_no_fault_fired_fails_the_self_test():
    result, report = good_run()
    result["groups"][1]["runs"][0]["injected"] = []
    assert failed(result, report) == ["fault injected"]


def test_the_plan_aims_one_xid_at_the_last_group():
    from trainguard.chaos.plan import for_group, parse_plan

    plan = parse_plan(plan_toml(3, 30))
    assert [(f.kind.value, f.group, f.rank, f.step) for f in plan.faults] == [("xid", 2, 0, 30)]
    assert not for_group(plan, 0).faults and len(for_group(plan, 2).faults) == 1


@pytest.mark.slow
def test_the_replica_groups_demo_passes_its_self_test(tmp_path):
    require_module("torchft", install="pip install 'trainguard[ft]' (make install does)")
    out = tmp_path / "demo.json"
    argv = [sys.executable, "-m", "trainguard.cli", "demo", "--replica-groups", "2", "--quick"]
    argv += ["--json", str(out), "--workdir", str(tmp_path / "w")]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["passed"] and all(c["ok"] for c in doc["checks"])
    assert "replica groups (2)" in proc.stdout and "PASS  culprit" in proc.stdout
