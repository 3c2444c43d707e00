"""torchft's own example under ``trainguard run --replica-groups 2``: tests/workers/torchft_train_ddp.py
is torchft's train_ddp.py with CPU edits only (torchft's Manager, DDP, Optimizer wrapper and
ProcessGroupGloo; no line of trainguard). One group's rank is killed mid-run: the other keeps
committing, the killed one is restarted by its own loop and heals from the live one, the job exits
0, the ranks' output reaches the console, and the final line and the report count it all."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from real_parts import require_module

require_module("torchft", install="pip install 'trainguard[ft]' (make install does)")
torch = pytest.importorskip("torch")

from trainguard.incidents import IncidentStore  # noqa: E402
from trainguard.incidents.report import job_report  # noqa: E402

WORKER = Path(__file__).parent / "workers" / "torchft_train_ddp.py"
pytestmark = pytest.mark.slow


def test_torchfts_own_example_survives_a_killed_group_and_the_run_says_so(tmp_path):
    (tmp_path / "plan.toml").write_text('[[fault]]\nkind = "kill"\ngroup = 1\nrank = 0\nstep = 15\n')
    args = [sys.executable, "-m", "trainguard.cli", "run", "--replica-groups", "2", "--standalone"]
    args += ["--nproc-per-node", "1", "--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs")]
    args += [
        "--json",
        str(tmp_path / "result.json"),
        "--backoff-base",
        "0.1",
        "--chaos",
        str(tmp_path / "plan.toml"),
    ]
    # A cold restart (no warm standby): the killed group is out for longer than the Lighthouse's
    # heartbeat timeout (1 s), so torchft gives up on it and the healthy group commits alone; a
    # group back within that timeout is waited for, as torchft intends.
    args += ["--no-warm-standby", "--", sys.executable, str(WORKER), "--steps", "40", "--step-delay", "0.05"]
    args += ["--out", str(tmp_path / "w{group}.pt")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert (tmp_path / "result.json").exists(), proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert proc.returncode == 0, (result["reason"], proc.stderr[-3000:])
    healthy, killed = result["groups"]
    # The healthy group: one start, one attempt, no incident.
    assert healthy["starts"] == 1 and [r["attempts"] for r in healthy["runs"]] == [1]
    assert [i for r in healthy["runs"] for i in r["incidents"]] == []
    # The killed group: its own loop recorded the kill and restarted its worker (no new group
    # start), which healed from the live group once.
    [incident] = [i for r in killed["runs"] for i in r["incidents"]]
    assert (incident["summary"], incident["rank"]) == ("rank 0 killed by SIGKILL", 0)
    assert killed["starts"] == 1 and [r["attempts"] for r in killed["runs"]] == [2]
    [heal] = killed["heals_s"]
    assert healthy["heals_s"] == []
    # The healthy group kept committing while the killed one was down and healing.
    last = max(s for t, s in killed["steps"] if t <= incident["time"])
    healed_at = next(t for t, s in killed["steps"] if t > incident["time"])
    alone = {s for t, s in healthy["steps"] if incident["time"] < t < healed_at and s > last}
    assert len(alone) >= 2, (incident, healthy["steps"], killed["steps"])
    # ... and the groups ended with the same weights.
    a, b = (torch.load(tmp_path / f"w{g}.pt") for g in (0, 1))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The ranks' output on the console, each line with its group and rank.
    for g in (0, 1):
        assert f"[g{g}] [rank0] Total number of parameters: " in proc.stdout
    # The final line: the group's incident, the heal, a measured capacity.
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("trainguard run: ok (exit 0)")]
    assert "incidents 0 in the job, 1 in the groups; 1 heal(s)" in line, line
    cap = re.search(r"capacity ([0-9.]+)", line)
    assert cap is not None and 0 < float(cap.group(1)) < 1, line
    # The report of the store: the same heal and capacity.
    with IncidentStore(tmp_path / "tg.db") as store:
        groups = job_report(store, result["job_id"])["groups"]
    assert groups["heals_s"] == [heal] and groups["capacity"] == pytest.approx(float(cap.group(1)), abs=0.01)
    assert groups["groups"][1]["incidents"][0]["rank"] == 0
