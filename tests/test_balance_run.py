"""Uneven GPUs under `trainguard run --backend sim`, answered by rebalancing first: the documented
variant of the demo's straggler (docs/balance.md), end to end through the supervisor, the store
and the report.

Four ranks train the digits example with ``--balance``. Rank 1's simulated GPU is power-capped to
half its clock (no health rule fires); later rank 2's GPU gets its SM clock stuck low (the
demo's straggler fault: the node verdict is degraded). Both ranks really compute slower. The
supervisor records the ranks' rebalances with their evidence, leaves the degraded GPU to the
balancing instead of diagnosing and excluding it, and the run ends on all four GPUs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.incidents import IncidentStore
from trainguard.incidents.report import job_report, render_report

EXAMPLE = Path(__file__).parents[1] / "examples" / "train_digits.py"
PLAN = """
[[fault]]
name = "rank 1's GPU power-capped to 50%"
kind = "throttle"
rank = 1
fraction = 0.5
step = 20

[[fault]]
name = "rank 2's GPU clocks stuck low"
kind = "slow"
rank = 2
delay_s = 0.05
steps = 3
step = 120
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_uneven_gpus_are_answered_by_rebalancing_first(tmp_path):
    (tmp_path / "plan.toml").write_text(PLAN)
    args = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "4"]
    args += ["--backend", "sim", "--chaos", str(tmp_path / "plan.toml"), "--no-tee"]
    args += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), "--job-id", "uneven"]
    args += ["--json", str(tmp_path / "result.json")]
    args += ["--", sys.executable, str(EXAMPLE), "--balance", "--steps", "260"]
    args += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "100"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=840, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["attempts"] == 1  # nothing excluded, nothing restarted

    with IncidentStore(tmp_path / "tg.db") as store:
        incidents = store.incidents(job="uneven")
        report = job_report(store, "uneven")
    actions = [i.action for i in incidents]
    assert "exclude_gpu" not in actions and "diagnose" not in actions
    moves = [i for i in incidents if i.action == "rebalance"]
    assert moves, actions
    first = moves[0]
    # the evidence names the slow rank and its GPU, with every rank's measured speed and the shares
    assert (first.rank, first.gpu) == (1, 1) and "rank 1 (GPU 1)" in first.summary
    move = next(e["balance"] for e in first.evidence if isinstance(e, dict) and "balance" in e)
    assert move["speeds"][1] < 0.75 * max(move["speeds"])
    assert move["shares"][1] < move["old_shares"][1] and sum(move["shares"]) == sum(move["old_shares"])
    # the straggler GPU was left to the balancing, and its rank's share moved too
    degraded = [i for i in incidents if i.summary.startswith("GPU 2 degraded")]
    assert degraded and all(i.action == "continue" for i in degraded), [i.summary for i in incidents]
    assert any("balances" in str(e) for i in degraded for e in i.evidence)
    later = [
        e["balance"]
        for i in moves
        if i.time > degraded[0].time
        for e in i.evidence
        if isinstance(e, dict) and "balance" in e
    ]
    assert any(m["shares"][2] < m["old_shares"][2] for m in later)
    text = render_report(report)
    assert "rebalance" in text
