"""``trainguard run --replica-groups`` end to end: torchft's real Lighthouse and Manager, two
replica groups of examples/train_ft.py over gloo, real faults in one group while the other trains."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from real_parts import require_module

require_module("torchft", install="pip install 'trainguard[ft]' (make install does)")
torch = pytest.importorskip("torch")

from trainguard.incidents import IncidentStore  # noqa: E402
from trainguard.incidents.report import job_report  # noqa: E402
from trainguard.supervisor.config import (  # noqa: E402
    HealthConfig,
    LaunchConfig,
    RecordConfig,
    SupervisorConfig,
    WatchConfig,
)
from trainguard.supervisor.replicas import ReplicaConfig, ReplicaSupervisor  # noqa: E402

EXAMPLE = Path(__file__).parent.parent / "examples" / "train_ft.py"
pytestmark = pytest.mark.slow


def run_groups(tmp_path: Path, *flags: str, plan: str | None = None, steps: int = 400) -> dict:
    args = [sys.executable, "-m", "trainguard.cli", "run", "--replica-groups", "2", "--standalone"]
    args += ["--nproc-per-node", "1", "--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs")]
    args += ["--json", str(tmp_path / "result.json"), "--no-tee", "--backoff-base", "0.1", *flags]
    if plan is not None:
        (tmp_path / "plan.toml").write_text(plan)
        args += ["--chaos", str(tmp_path / "plan.toml")]
    args += [
        "--",
        sys.executable,
        str(EXAMPLE),
        "--steps",
        str(steps),
        "--step-delay",
        "0.1",
        "--all-groups-at-end",
    ]
    args += ["--out", str(tmp_path / "w{group}.pt"), "--checkpoint-dir", str(tmp_path / "ckpt")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    path = tmp_path / "result.json"
    assert path.exists(), proc.stderr[-3000:]
    result: dict = json.loads(path.read_text())
    result["returncode"] = proc.returncode
    return result


def group_story(result: dict, group: int) -> str:
    """What a group's own loop recorded, and the end of its log: the message of a failed check."""
    runs = result["groups"][group]["runs"]
    incidents = [
        f"{i['summary']} (rank {i['rank']}, {i['category']}, {i['action']})"
        for r in runs
        for i in r["incidents"]
    ]
    log = Path(result["run_dir"]) / "groups" / f"g{group}.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
    return f"group {group}: attempts {[r['attempts'] for r in runs]}, incidents {incidents}\n{tail}"


def same_weights(tmp_path: Path) -> bool:
    a, b = (torch.load(tmp_path / f"w{g}.pt") for g in (0, 1))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_one_group_is_killed_hung_and_loses_a_gpu_while_the_other_never_stops(tmp_path):
    plan = "".join(
        f'[[fault]]\nkind = "{kind}"\ngroup = 1\nrank = 0\nstep = {step}\n\n'
        for kind, step in (("kill", 20), ("stop", 60), ("xid", 100))
    )
    result = run_groups(
        tmp_path,
        "--gpu-ids",
        "0,1,2",
        "--backend",
        "sim",
        "--no-preflight",
        "--hang-timeout-floor",
        "4",
        plan=plan,
    )
    assert result["returncode"] == 0, result["reason"]
    healthy, failing = result["groups"]
    # The healthy group: one start, one attempt, no incident, and its steps only ever went up.
    assert healthy["starts"] == 1 and healthy["state"] == "succeeded"
    [run] = healthy["runs"]
    assert run["attempts"] == 1 and run["incidents"] == [], group_story(result, 0)
    steps = [s for _, s in healthy["steps"]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # The failing group: each fault recorded by its own loop with the rank, GPU and cause.
    incidents = [i for r in failing["runs"] for i in r["incidents"]]
    assert [(i["rank"], i["gpu"]) for i in incidents] == [(0, 1)] * 3
    assert incidents[0]["summary"] == "rank 0 killed by SIGKILL"
    assert incidents[1]["category"] == "hang" and "process stopped" in incidents[1]["summary"]
    assert incidents[2]["root_cause"] == "faulty_gpu" and "Xid 79" in incidents[2]["summary"]
    # ... its GPU excluded, the group replaced on the spare, and healed: it finished too.
    assert result["excluded_gpus"] == [1] and failing["gpus"] == [2]
    assert failing["starts"] == 2 and failing["state"] == "succeeded"
    # The failing group stepped again after each fault.
    for incident in incidents:
        assert [t for t, _ in failing["steps"] if t > incident["time"]], (
            "the failing group never stepped again"
        )
    # The healthy group committed steps while the failing one was stopped: from the hang's start
    # (its evidence) to its detection the stopped group cannot step, and that span is at least the
    # group's hang floor (--hang-timeout-floor 4 raised to 15 s, past torchft's 10 s collective
    # timeout), past torchft's 1 s heartbeat timeout. (After the kill and the Xid the failing
    # group may be back within the heartbeat timeout; then torchft rightly waits for it.)
    hang = incidents[1]
    stuck_at = max(s for t, s in failing["steps"] if t <= hang["time"])  # where it was stopped
    assert [s for t, s in healthy["steps"] if hang["started"] < t <= hang["time"] and s > stuck_at + 1]
    assert same_weights(tmp_path)
    # The report of the real run's store: the whole job's figures from the groups' ledgers.
    with IncidentStore(tmp_path / "tg.db") as store:
        report = job_report(store, result["job_id"])
    groups = report["groups"]
    assert [g["group"] for g in groups["groups"]] == [0, 1]
    g0, g1 = groups["groups"]
    assert g0["interruptions"] == 0 and g0["attempts"] == 1 and g1["interruptions"] >= 2
    assert g1["heals_s"] == failing["heals_s"] and len(g1["heals_s"]) >= 1 and g0["heals_s"] == []
    assert 0 < groups["capacity"] < 1 and groups["k_of_n_s"].get("1_of_2", 0) > 0
    assert report["goodput"]["ettr"] == pytest.approx(groups["capacity"], abs=1e-3)
    assert g0["ettr"] > g1["ettr"]


def test_the_lighthouse_is_restarted_and_the_groups_carry_on(tmp_path):
    cmd = (sys.executable, str(EXAMPLE), "--steps", "300", "--step-delay", "0.1", "--all-groups-at-end")
    config = SupervisorConfig(
        LaunchConfig(cmd=(*cmd, "--out", str(tmp_path / "w{group}.pt")), standalone=True),
        RecordConfig(runs_root=tmp_path / "runs", db=tmp_path / "tg.db"),
        WatchConfig(tee=False),
        HealthConfig(preflight=False),
    )
    sup = ReplicaSupervisor(config, ReplicaConfig(groups=2))
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(sup.run().to_dict()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 300
    while min((g.last_step or 0) for g in sup.groups) < 30 and runner.is_alive():
        assert time.monotonic() < deadline, "the groups never reached step 30"
        time.sleep(0.2)
    assert sup.lighthouse.proc is not None
    sup.lighthouse.proc.kill()
    before = max(g.last_step or 0 for g in sup.groups)
    runner.join(600)
    assert not runner.is_alive()
    assert out["exit_code"] == 0, out["reason"]
    assert out["lighthouse_restarts"] == 1
    assert [i["action"] for i in out["incidents"]] == ["restart_lighthouse"]
    assert all(g["starts"] == 1 and g["final_step"] > before for g in out["groups"])
    assert same_weights(tmp_path)


def test_every_group_down_restarts_them_all_from_the_durable_checkpoint(tmp_path):
    plan = "".join(f'[[fault]]\nkind = "kill"\ngroup = {g}\nrank = 0\nstep = 60\n\n' for g in (0, 1))
    result = run_groups(tmp_path, "--max-restarts", "0", plan=plan, steps=120)
    assert result["returncode"] == 0, result["reason"]
    actions = [i["action"] for i in result["incidents"]]
    assert actions.count("stop_group") == 2 and "restart_all_groups" in actions
    for g in result["groups"]:
        assert g["starts"] == 2 and g["state"] == "succeeded"
        resumed = [s for _, s in g["steps"]]
        # the second start resumed from a checkpoint (every 50 steps), not from step 0
        restart = next(i for i in range(1, len(resumed)) if resumed[i] < resumed[i - 1])
        assert resumed[restart] >= 50
    assert same_weights(tmp_path)
