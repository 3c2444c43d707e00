"""`trainguard run` launches workers as torchrun does, and its workers die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Writes what torchrun gave it (environment and argv) and, with --sleep, waits to be killed.
ENV_WORKER = """
import json, os, sys, time
out = os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json")
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
        "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_SIGNALS_TO_HANDLE", "OMP_NUM_THREADS")
env = {k: os.environ.get(k) for k in keys}
with open(out + ".tmp", "w") as f:
    json.dump({"env": env, "argv": sys.argv[2:], "pid": os.getpid()}, f)
os.replace(out + ".tmp", out)
if "--sleep" in sys.argv:
    time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's reaping is left


def _trainguard_run(tmp_path: Path, flags: list[str], worker_args: list[str]) -> subprocess.Popen[str]:
    worker = tmp_path / "worker.py"
    worker.write_text(ENV_WORKER)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "trainguard.cli", "run", "--no-warm-standby", "--no-tee"]
    cmd += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), *flags]
    cmd += ["--", sys.executable, str(worker), str(out), *worker_args]
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_of_the_supervisor_leaves_no_worker_alive(tmp_path):
    sup = _trainguard_run(tmp_path, ["--standalone", "--nproc-per-node", "2"], ["--sleep"])
    out = tmp_path / "out"
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("rank*.json"))) < 2:
            assert sup.poll() is None, sup.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.2)
        pids = [json.loads(p.read_text())["pid"] for p in out.glob("rank*.json")]
        assert all(_alive(p) for p in pids)
        sup.send_signal(signal.SIGKILL)
        sup.wait()
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "workers outlived their supervisor"
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        for p in out.glob("rank*.json"):
            pid = json.loads(p.read_text())["pid"]
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# Options a user passes to torchrun; each must reach the workers as it does under torchrun.
TORCHRUN_FLAGS = [
    "--nnodes",
    "1",
    "--nproc-per-node",
    "2",
    "--rdzv-backend",
    "c10d",
    "--rdzv-endpoint",
    "localhost:0",
    "--rdzv-id",
    "flags",
    "--max-restarts",
    "2",
    "--monitor-interval",
    "0.2",
    "--role",
    "trainer",
    "--start-method",
    "spawn",
    "--node-rank",
    "0",
    "--local-addr",
    "127.0.0.1",
    "--signals-to-handle",
    "SIGTERM,SIGINT",
    "--shutdown-timeout",
    "5",
]


def _seen(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


def test_every_torchrun_option_reaches_the_workers_as_under_torchrun(tmp_path):
    flags = list(TORCHRUN_FLAGS)
    (tmp_path / "tg").mkdir()
    ours = _trainguard_run(tmp_path / "tg", flags, ["a", "--b=1"])
    _, err = ours.communicate(timeout=120)
    assert ours.returncode == 0, err[-3000:]
    (tmp_path / "tr").mkdir()
    worker = tmp_path / "tg" / "worker.py"
    out = tmp_path / "tr" / "out"
    out.mkdir()
    torchrun = [sys.executable, "-m", "torch.distributed.run", *flags, "--no-python"]
    ref = subprocess.run(
        [*torchrun, sys.executable, str(worker), str(out), "a", "--b=1"],
        cwd=tmp_path / "tr",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    theirs, mine = _seen(out), _seen(tmp_path / "tg" / "out")
    assert set(mine) == set(theirs) == {"rank0.json", "rank1.json"}
    for name in theirs:
        assert mine[name]["argv"] == theirs[name]["argv"] == ["a", "--b=1"]
        assert mine[name]["env"] == theirs[name]["env"], name
    assert mine["rank0.json"]["env"]["ROLE_NAME"] == "trainer"


def test_trainguard_run_accepts_every_torchrun_option():
    from torch.distributed.run import get_args_parser

    from trainguard.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    ours = {s for a in run._actions for s in a.option_strings}
    theirs = {s for a in get_args_parser()._actions for s in a.option_strings}
    assert theirs - ours == set()  # tests/test_torchrun_compat.py: each resolves as under torchrun
