"""`trainguard demo --quick` end to end, as CI runs it (stdout is a pipe: plain lines): six real
faults on a simulated 4-GPU node and one only an active test finds, each matched to its incident
with the expected root cause and action."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

KINDS = {"nan", "xid", "crash", "hang", "straggler", "corrupt_checkpoint", "wrong_products"}


@pytest.mark.timeout(1000)
def test_quick_demo_matches_every_injected_fault_to_its_incident_and_trains_above_90_percent(tmp_path):
    report_path = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "demo", "--quick", "--no-reference",
         "--workdir", str(tmp_path / "work"), "--json", str(report_path)],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0, report["problems"]
    assert report["all_matched"] and report["passed"]
    assert report["accuracy"] > 0.90 and report["reference_accuracy"] is None
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
    assert 0 < report["ettr"] < 1
    assert Path(report["plot"]).is_file() and Path(report["db"]).is_file()
    # Not a terminal: plain lines, no cursor movement, and the report at the end.
    assert "\x1b[" not in proc.stdout
    assert "incident #" in proc.stdout and "PASSED" in proc.stdout
