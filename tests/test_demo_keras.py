"""`trainguard demo --framework keras --quick` end to end on real TensorFlow and Keras 3: one Keras
process over a simulated 4-GPU node under ``--framework tf``, five faults (NaN, Xid 79, kill, torn
checkpoint, hang), each matched to its incident with the expected rank, GPU, root cause and
action, no false incident, the accuracy within the fault-free reference's. The reference is
recorded in pytest's cache, as test_demo.py's is. And the plan's expectations fail a wrong answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real_parts import require_module
from trainguard.demo.match import judge
from trainguard.demo.plan import build_keras_plan
from trainguard.incidents import Incident, RootCause

KINDS = {"nan", "xid", "kill", "corrupt_checkpoint", "hang"}


@pytest.mark.slow
@pytest.mark.timeout(1000)  # a ceiling for a loaded machine: the first run also trains the reference
def test_the_keras_tour_explains_every_incident(tmp_path, request):
    require_module("tensorflow", install="make install (tensorflow-cpu 2.21)")
    report_path = tmp_path / "report.json"
    cache = request.config.cache.mkdir("trainguard-demo-reference")
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "demo", "--framework", "keras", "--quick",
         "--workdir", str(tmp_path / "work"), "--json", str(report_path)],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[1],
        env={**os.environ, "TRAINGUARD_CACHE_DIR": str(cache)},
    )  # fmt: skip
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0, report["problems"]
    assert report["all_matched"] and report["passed"] and report["unmatched_incidents"] == []
    injected = {f["kind"]: f for f in report["injected"]}
    assert set(injected) == KINDS
    incidents = {i["id"]: i for i in report["incidents"]}
    for kind, fault in injected.items():
        incident = incidents[fault["matched_incident"]]
        assert incident["root_cause"] in fault["expected_root_cause"]
        assert incident["action"] in fault["expected_action"]
        if kind != "corrupt_checkpoint":
            assert incident["rank"] == 0 and incident["gpu"] == fault["gpu"], (kind, incident)
    xid = incidents[injected["xid"]["matched_incident"]]
    assert (xid["gpu"], xid["root_cause"], xid["action"]) == (0, "faulty_gpu", "exclude_gpu")
    assert injected["kill"]["gpu"] == 1  # after the exclusion the process runs on GPUs 1-3


def incident(cause: RootCause, action: str, evidence: tuple[str, ...] = ()) -> Incident:
    return Incident("job", 1.0, cause, action, rank=0, gpu=0, evidence=evidence, id=1)


def test_the_keras_plan_fails_a_conclusion_the_evidence_does_not_allow():
    plan = build_keras_plan(quick=True)
    nan, xid, kill = plan.fault("F1"), plan.fault("F2"), plan.fault("F3")
    both = "unknown; suspects: silent_data_corruption (a); software_bug (b)"
    assert judge(incident(RootCause.UNKNOWN, "rollback", (both,)), nan)[0]
    # A NaN whose step was never replayed cannot be called silent data corruption.
    assert not judge(incident(RootCause.SILENT_DATA_CORRUPTION, "rollback"), nan)[0]
    assert not judge(incident(RootCause.UNKNOWN, "restart", (both,)), nan)[0]
    assert not judge(incident(RootCause.FAULTY_GPU, "restart"), xid)[0]  # the GPU must go
    assert not judge(incident(RootCause.HOST, "restart"), kill)[0]  # no OOM-killer evidence
