"""`trainguard run` as a torchrun drop-in for a script that never imports trainguard
(tests/workers/plain_ddp.py: epoch loop, DistributedSampler, its own torch.save snapshot).

Timeouts are shortened so that every run lasts longer than every timeout in force."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.incidents import IncidentStore
from trainguard.incidents.report import job_report, render_report

PLAIN = Path(__file__).parent / "workers" / "plain_ddp.py"
SHORT = ("--startup-timeout", "4", "--hang-timeout-floor", "3", "--idle-timeout", "4")
pytestmark = pytest.mark.slow


def run_plain(
    tmp_path: Path,
    *flags: str,
    epochs: int = 60,
    plan: str | None = None,
    job: str = "plain",
    save_every: int = 5,
) -> tuple[int, dict, str]:
    args = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2"]
    args += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), "--no-tee"]
    args += ["--json", str(tmp_path / "result.json"), "--job-id", job, *SHORT, *flags]
    if plan is not None:
        (tmp_path / "plan.toml").write_text(plan)
        args += ["--chaos", str(tmp_path / "plan.toml")]
    args += ["--", sys.executable, str(PLAIN), "--epochs", str(epochs), "--save-every", str(save_every)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    result_file = tmp_path / "result.json"
    assert result_file.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(result_file.read_text()), proc.stderr


def test_the_plain_script_never_imports_trainguard():
    code = [line.strip() for line in PLAIN.read_text().splitlines()]
    assert not [line for line in code if line.startswith(("import trainguard", "from trainguard"))]


def test_a_plain_ddp_script_outlives_every_timeout_with_zero_incidents(tmp_path):
    started = time.monotonic()
    code, result, err = run_plain(tmp_path, epochs=60)
    assert time.monotonic() - started > 4 * 2  # twice the longest timeout in force
    assert code == 0, err[-3000:]
    assert result["incidents"] == [] and result["attempts"] == 1
    assert "no heartbeats yet" in err and "process state only" in err  # said once, at start
    assert err.count("watching ") == 1
    assert result["goodput"]["ettr"] is None and "ETTR n/a" in err
    assert (tmp_path / "snapshot.pt").exists()


def test_a_chaos_kill_of_a_plain_script_is_recovered_and_reported_truthfully(tmp_path):
    plan = '[[fault]]\nkind = "kill"\nrank = 1\nat_s = 12\n'
    code, result, err = run_plain(tmp_path, epochs=90, plan=plan, save_every=1)
    assert code == 0, err[-3000:]
    assert result["attempts"] == 2
    [incident] = result["incidents"]
    assert incident["rank"] == 1 and incident["action"] == "restart" and "SIGKILL" in incident["summary"]
    [recovery] = result["recoveries"]
    assert recovery["restart_s"] > 0 and recovery["mttr_s"] is None  # first step: not reported
    logs = tmp_path / "runs" / "plain" / "logs"
    [before] = list(logs.glob("*/attempt0/rank0.stdout"))
    [resumed] = list(logs.glob("*/attempt1/rank0.stdout"))
    first = resumed.read_text().splitlines()[0]
    if first.startswith("[rank 0] resuming from snapshot at epoch "):  # its own snapshot:
        epoch = int(first.rsplit(" ", 1)[1])
        assert f"[rank 0] epoch {epoch - 1} | " in before.read_text()  # written by the killed attempt
    else:  # on a loaded machine the kill at 12 s can come before the first snapshot: it starts over
        assert "snapshot saved" not in before.read_text() and first.startswith("[rank 0] epoch 0 | ")
    with IncidentStore(tmp_path / "tg.db") as store:
        report = job_report(store, "plain")
        [stored] = store.incidents(job="plain")
    assert stored.resolved and "restarted" in (stored.resolution or "")
    g = report["goodput"]
    assert g["attempts"] == 2 and g["interruptions"] == 1 and g["ettr"] is None
    assert g["unaccounted_s"] < 0.05 * g["wall_s"]
    assert "n/a (no heartbeats" in render_report(report)


def test_a_hung_plain_script_is_caught_from_process_state_not_heartbeats(tmp_path):
    plan = '[[fault]]\nkind = "stop"\nrank = 0\nat_s = 8\n'  # SIGSTOP: rank 1 then waits in gloo
    code, result, err = run_plain(tmp_path, epochs=70, plan=plan)
    assert code == 0, err[-3000:]
    [incident] = result["incidents"]
    assert incident["detected_by"] == "process_state"
    # Not a NCCL timeout (this is gloo): the stacks show rank 0 stopped (state T), the host's.
    assert incident["root_cause"] == "host"
    assert "rank 0 (process stopped" in incident["summary"]
    assert "every rank idle" in incident["summary"]
    assert result["attempts"] == 2


def test_step_faults_are_refused_and_said_for_a_script_without_heartbeats(tmp_path):
    plan = '[[fault]]\nkind = "kill"\nrank = 1\nstep = 5\n'
    code, result, err = run_plain(tmp_path, epochs=60, plan=plan)
    assert code == 0, err[-3000:]
    assert result["incidents"] == [] and result["injected"] == []
    assert "refusing fault(s) #1 (kill rank 1, step = 5)" in err and "at_s" in err
    assert "chaos fault(s) never fired: #1 (kill rank 1)" in err


def test_a_plain_scripts_ranks_print_no_warning_of_ours(tmp_path):
    # what a rank prints on stderr is the script's own: no deprecation our environment (a renamed
    # torch variable) or our warm standby (a walk over every object at exit) causes
    code, result, err = run_plain(
        tmp_path, "--backend", "sim", "--warm-standby", "--warm-fill-at-start", epochs=2, save_every=1
    )
    assert code == 0 and result["attempts"] == 1, err[-3000:]
    assert "starting the workers cold" not in err  # the ranks ran in warm standbys
    stderr = list((tmp_path / "runs" / "plain" / "logs").glob("*/attempt0/rank*.stderr"))
    assert len(stderr) == 2
    for path in stderr:
        text = path.read_text()
        assert "Warning" not in text and "deprecated" not in text, f"{path.name}: {text}"


@pytest.mark.timeout(1800)
def test_30_runs_of_the_plain_script_under_warm_standby_all_exit_cleanly(tmp_path):
    outcomes = []
    for i in range(30):
        work = tmp_path / f"run{i}"
        work.mkdir()
        flags = ("--warm-standby", "--warm-fill-at-start", "--warm-standby-sets", "1")
        code, result, _ = run_plain(work, *flags, epochs=3, job=f"r{i}")
        outcomes.append((code, result["attempts"], len(result["incidents"])))
    assert outcomes == [(0, 1, 0)] * 30


def test_kill_9_of_trainguard_run_leaves_no_warm_standby_alive(tmp_path):
    args = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2"]
    args += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), "--no-tee"]
    args += ["--job-id", "k9", "--warm-standby", "--"]
    args += [sys.executable, str(PLAIN), "--epochs", "500"]
    sup = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rank_log = tmp_path / "runs" / "k9" / "logs"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(
            "epoch" in p.read_text() for p in rank_log.glob("*/*/*.stdout")
        ):
            time.sleep(0.2)
        # Wait for the ranks (former standbys) and at least 2 idle standbys, all alive.
        deadline = time.monotonic() + 120
        while len(_standbys(family := _descendants(sup.pid))) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_standbys(family)) >= 4, family
    finally:
        sup.send_signal(signal.SIGKILL)
        sup.wait()
    deadline = time.monotonic() + 60  # parent-death signals, delivered on a loaded machine
    while time.monotonic() < deadline and any(_alive(p) for p in family):
        time.sleep(0.1)
    left = [p for p in family if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == []


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def _standbys(pids: list[int]) -> list[int]:
    """The warm standbys among ``pids`` (a rank keeps the command line of the standby it was)."""
    found = []
    for pid in pids:
        try:
            if b"trainguard.supervisor.standby" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"
