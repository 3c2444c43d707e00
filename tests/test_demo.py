"""`trainguard demo --quick` end to end, as CI runs it (stdout is a pipe: plain lines): six real
faults on a simulated 4-GPU node and one only an active test finds, each matched to its incident
with the expected root cause and action, no false incident, the accuracy within the fault-free
reference's and the ETTR the incidents' losses predict.

The reference run's result is recorded in pytest's cache (``.pytest_cache``) under a key of the
training (script, steps, ranks, torch): the first run of this test trains it, later ones reuse it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

KINDS = {"nan", "xid", "crash", "hang", "straggler", "corrupt_checkpoint", "wrong_products"}


@pytest.mark.timeout(1000)  # a ceiling for a loaded machine: the first run also trains the reference
def test_quick_demo_explains_every_incident_and_keeps_the_reference_accuracy(tmp_path, request):
    report_path = tmp_path / "report.json"
    cache = request.config.cache.mkdir("trainguard-demo-reference")
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "demo", "--quick",
         "--workdir", str(tmp_path / "work"), "--json", str(report_path)],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[1],
        env={**os.environ, "TRAINGUARD_CACHE_DIR": str(cache)},
    )  # fmt: skip
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0, report["problems"]
    assert report["all_matched"] and report["passed"] and report["unmatched_incidents"] == []
    ref = report["reference_accuracy"]
    assert ref is not None and report["accuracy"] >= ref - report["accuracy_tolerance"]
    assert list(cache.glob("demo-reference/*.json"))  # recorded for the next run
    assert abs(report["ettr"] - report["ettr_predicted"]) <= report["ettr_tolerance"]
    assert report["ettr_reference"] is not None  # reported beside the ledger's (context, not judged)
    injected = {f["kind"]: f for f in report["injected"]}
    assert set(injected) == KINDS
    incidents = {i["id"]: i for i in report["incidents"]}
    for kind, fault in injected.items():
        incident = incidents[fault["matched_incident"]]
        assert incident["matched_fault"] == fault["id"]
        assert incident["root_cause"] in fault["expected_root_cause"]
        assert incident["action"] in fault["expected_action"]
        if kind != "corrupt_checkpoint":  # the only fault with no rank: the job-wide resume names it
            assert (incident["rank"], incident["gpu"]) in (
                (fault["rank"], fault["gpu"]),
                (fault["rank"], None),
                (None, fault["gpu"]),
            ), (kind, incident)
        assert 0 <= fault["detection_delay_s"] < 30
    assert (injected["nan"]["rank"], injected["nan"]["gpu"]) == (0, 0)
    assert injected["xid"]["gpu"] == 3 and incidents[injected["xid"]["matched_incident"]]["gpu"] == 3
    nan = incidents[injected["nan"]["matched_incident"]]
    assert (nan["rank"], nan["gpu"]) == (injected["nan"]["rank"], injected["nan"]["gpu"]) == (0, 0)
    assert injected["hang"]["detection_delay_s"] < 20  # the heartbeat watchdog, not gloo's 30 min
    sdc = incidents[injected["wrong_products"]["matched_incident"]]
    assert (sdc["detected_by"], sdc["action"], sdc["gpu"]) == ("preflight", "exclude_gpu", 1)
    assert any(d.startswith("sdc fail") for d in injected["wrong_products"]["diagnostics"])
    # The NaN's and the straggler's GPUs were tested; the figures are in their incidents.
    assert any(d.startswith("compute pass") for d in injected["nan"]["diagnostics"])
    assert any(
        d.startswith("compute fail") and "% of peers" in d for d in injected["straggler"]["diagnostics"]
    )
    assert "pre-flight diagnostics before each start" in proc.stdout
    assert Path(report["plot"]).is_file() and Path(report["db"]).is_file()
    # Not a terminal: plain lines, no cursor movement, and the report at the end.
    assert "\x1b[" not in proc.stdout
    assert "incident #" in proc.stdout and "PASSED" in proc.stdout
