"""A node lost under a two-node script that never imports trainguard (#36).

tests/workers/plain_ddp.py is shaped like pytorch/examples' ddp-tutorial-series multinode.py
(torchrun's env vars, gloo, its own snapshot it resumes from). Two `trainguard run --nnodes 1:2`
on one host act as two nodes; node b's supervisor and workers are SIGKILLed at once. What the
survivor's incident may rest on is only what any torch job leaves: its ranks' stderr (gloo's
"Connection closed by peer"), torchelastic's error file when ``main`` carries torch's ``@record``,
and the rendezvous' view of who left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_multinode import RDZV_CONF, _descendants, free_port
from trainguard.incidents import IncidentStore, RootCause

PLAIN = Path(__file__).parent / "workers" / "plain_ddp.py"
pytestmark = pytest.mark.slow


def start_node(tmp_path: Path, name: str, port: int, record: bool) -> subprocess.Popen:
    args = [
        sys.executable, "-m", "trainguard.cli", "run", "--nnodes", "1:2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "plain2",
        "--max-restarts", "3", "--rdzv-conf", f"{RDZV_CONF},is_host={str(name == 'a').lower()}",
        "--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / name), "--no-tee", "--no-warm-standby",
        "--json", str(tmp_path / f"{name}.json"),
        "--", sys.executable, str(PLAIN), "--epochs", "40", "--save-every", "1", "--batch-sleep", "0.02",
        *(["--record"] if record else []),
    ]  # fmt: skip
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def both_train(tmp_path: Path) -> bool:
    """Both nodes' ranks printed an epoch: the two-node group formed and trains."""
    out = [p.read_text(errors="replace") for p in tmp_path.glob("*/*/logs/*/attempt0/rank*.stdout")]
    return len(out) == 2 and all(" | loss " in o for o in out)


@pytest.mark.parametrize("record", [False, True], ids=["plain", "at-record"])
def test_a_killed_node_under_a_plain_script_is_that_node_never_a_bug_or_the_network(tmp_path, record):
    port = free_port()
    a = start_node(tmp_path, "a", port, record)
    b = start_node(tmp_path, "b", port, record)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not (both_train(tmp_path) and (tmp_path / "snapshot.pt").exists()):
            time.sleep(0.2)
        assert both_train(tmp_path), (tmp_path / "a.log").read_text()[-3000:]
        for pid in [b.pid, *_descendants(b.pid)]:  # node b loses power: supervisor and workers at once
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert a.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    [resumed] = list(tmp_path.glob("a/*/logs/*/attempt1/rank0.stdout"))
    assert "resuming from snapshot at epoch" in resumed.read_text()  # the script's own snapshot
    incidents = IncidentStore(tmp_path / "tg.db").incidents(job="plain2")
    assert incidents, (tmp_path / "a.log").read_text()[-3000:]
    first = incidents[0]
    b_node = f"_{b.pid}_0"
    assert first.root_cause in (RootCause.HOST, RootCause.UNKNOWN), first
    if first.root_cause is RootCause.HOST:
        assert first.category == "node_failure" and first.node is not None and first.node.endswith(b_node), (
            first
        )
    else:
        [named] = [str(e) for e in first.evidence if str(e).startswith("unknown; suspects: host")]
        assert b_node in named, first
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainguard.cli",
            "incidents",
            "show",
            str(first.id),
            "--db",
            str(tmp_path / "tg.db"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0 and b_node in shown.stdout, shown.stdout + shown.stderr
