"""The torchft DDP defect and trainguard's workaround (trainguard.torch.ft): when a peer replica
group dies or stops in the middle of the cross-group all-reduce, torchft 0.2.0's communication
hook asserts (``assert fut._fut``) and takes the healthy group down; trainguard's discards the
step and the healthy group trains on. And a peer that stops in a quorum: the healthy group gives up
on it within the collective timeout, in the process group's rendezvous and at the quorum's store
(PyTorch's TCPStore client waits for a stopped store with no deadline). Real Lighthouse, real
Managers, two groups over gloo."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from real_parts import require_module
from trainguard.procs import parent_death
from trainguard.rundir import read_discarded, replica_group_env
from trainguard.supervisor.ports import private_port
from trainguard.supervisor.replicas.lighthouse import Lighthouse, LighthouseConfig

require_module("torchft", install="pip install 'trainguard[ft]' (make install does)")

WORKER = Path(__file__).parent / "workers" / "ft_worker.py"
pytestmark = pytest.mark.slow


@pytest.fixture
def lighthouse(tmp_path: Path) -> Iterator[Lighthouse]:
    lh = Lighthouse(LighthouseConfig(), tmp_path / "lighthouse.log")
    lh.start()
    yield lh
    lh.stop()


def start(
    tmp_path: Path, lh: Lighthouse, group: int, *args: str, log: Path | None = None
) -> subprocess.Popen[str]:
    """One group; its output in a pipe for the test to read at the end, or in ``log`` (a group that
    runs on unread would block on a full pipe, a hang of its own)."""
    env = {
        **os.environ,
        **replica_group_env(group, 2),
        "TORCHFT_LIGHTHOUSE": lh.address,
        "TORCHFT_TIMEOUT_SEC": "3",  # a stopped peer's all-reduce fails after this long
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(private_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "TRAINGUARD_RUN_DIR": str(tmp_path / f"run{group}"),  # where trainguard.torch.ft records discards
    }
    argv = [sys.executable, str(WORKER), "--out", str(tmp_path / f"g{group}.json"), *args]
    with open(log or os.devnull, "w") as file:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE if log is None else file,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=parent_death(),
        )


def healthy_and_faulty(
    tmp_path: Path,
    lh: Lighthouse,
    fault: str,
    *healthy_args: str,
    ahead: int = 0,
    behind: int = 0,
    ceiling: float = 300,
) -> tuple[int, str, dict]:
    """Run a healthy group and a faulty one to the healthy one's end (within ``ceiling`` seconds).
    With ``ahead``, the faulty one starts once the healthy one has committed that many steps (it
    joins, and heals from it); with ``behind``, the healthy one starts once the faulty one has
    (the healthy one joins, and is to heal from the faulty one)."""
    first, then = (1, 0) if behind else (0, 1)
    args = {0: ["--steps", "1000", *healthy_args], 1: ["--steps", "1000", "--fault", fault]}
    progress = tmp_path / f"g{first}.progress"
    logs = {0: None, 1: tmp_path / "g1.out"}  # the faulty group's output is read from its file
    procs = {first: start(tmp_path, lh, first, *args[first], "--progress", str(progress), log=logs[first])}
    try:
        deadline = time.monotonic() + 120
        while int(progress.read_text() if progress.exists() else 0) < (ahead or behind):
            assert procs[first].poll() is None and time.monotonic() < deadline, f"group {first} never stepped"
            time.sleep(0.05)
        procs[then] = start(tmp_path, lh, then, *args[then], log=logs[then])
        output, _ = procs[0].communicate(timeout=ceiling)
    finally:
        for proc in procs.values():  # a stopped peer stays stopped until killed
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)
    path = tmp_path / "g0.json"
    return procs[0].returncode, output, json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_peer_lost_mid_all_reduce_discards_the_step_and_the_healthy_group_trains_on(
    tmp_path, lighthouse, fault
):
    code, output, result = healthy_and_faulty(tmp_path, lighthouse, fault)
    assert code == 0, output[-3000:]
    assert result["peers"] == 2 and result["committed"] < 1000  # it trained beside the peer, then alone
    assert result["discarded"] >= 1  # the step whose all-reduce failed was not applied
    assert "step" in output and "is discarded" in output
    # ... and the Manager wrote each discarded step into the run directory, for the job's ledger.
    recorded = read_discarded(tmp_path / "run0", 0)
    assert len(recorded) == result["discarded"] and all(end >= start for _, start, end in recorded)


def test_a_peer_that_hangs_in_the_quorum_it_joined_holds_the_healthy_group_no_longer_than_an_all_reduce(
    tmp_path, lighthouse
):
    # The peer joins the healthy group's quorum and stops before its process group's rendezvous:
    # the healthy group, reconfiguring for that quorum, waits for it there. torchft's process
    # groups wait 60 s by default, whatever the Manager's timeout; trainguard's give up after the
    # Manager's (TORCHFT_TIMEOUT_SEC, 3 s here), as the all-reduce does. A hang detector tuned to
    # the collective timeout (a replica group's hang floor) would otherwise restart the healthy one.
    code, output, result = healthy_and_faulty(tmp_path, lighthouse, "stop-in-quorum", ahead=5)
    assert code == 0, output[-3000:]
    # The quorum with the peer failed in its rendezvous: that step was discarded, and the group
    # trained on alone (a few steps, then done: far short of its 1,000).
    assert result["discarded"] >= 1 and result["committed"] < 1000
    recorded = read_discarded(tmp_path / "run0", 0)
    longest = max(end - start for _, start, end in recorded)
    assert longest < 30, f"the healthy group waited {longest:.1f}s in the quorum for its stopped peer"


def test_a_group_that_joins_behind_a_peer_that_hangs_in_the_quorum_gives_up_on_it_and_trains(
    tmp_path, lighthouse
):
    # The faulty group trains first; the healthy one joins it, so the quorum's store is the faulty
    # one's, and the faulty one stops before its reconfiguration. The healthy one reaches its own a
    # second later (a loaded host), when the store's process is already stopped: PyTorch's TCPStore
    # client waits for the stopped server's answer with no deadline, and the group waited for good
    # (its loop restarts a group that never starts after 300 s). trainguard's gives up on the store
    # after the collective timeout (3 s here), discards that step and trains on alone.
    code, output, result = healthy_and_faulty(
        tmp_path, lighthouse, "stop-in-quorum", "--reconfigure-delay", "1", behind=5, ceiling=120
    )
    assert code == 0, output[-3000:]
    assert result["discarded"] >= 1 and 0 < result["committed"] < 1000
    assert "did not answer in 3s" in output  # the store, named, was what it gave up on
    recorded = read_discarded(tmp_path / "run0", 0)
    longest = max(end - start for _, start, end in recorded)
    assert longest < 30, f"the group waited {longest:.1f}s in the quorum for its stopped peer's store"


def test_pytorchs_store_client_waits_for_a_stopped_server_past_its_timeout(tmp_path):
    """The upstream defect under the store workaround (trainguard.torch.ft._store_client_within):
    when this fails, PyTorch's TCPStore client keeps its timeout and the workaround can go."""
    port = private_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE_STORE, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=parent_death(),
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        os.kill(server.pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
        done = threading.Event()

        def connect() -> None:
            with contextlib.suppress(Exception):  # the reset when the server is killed below
                TCPStore(
                    "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=1)
                )
            done.set()

        threading.Thread(target=connect, daemon=True).start()
        assert not done.wait(10), "TCPStore's client kept its 1 s timeout: drop _store_client_within"
    finally:
        server.kill()
        server.communicate(timeout=60)
    assert done.wait(60)  # the server's death ends the wait, and the thread with it


SERVE_STORE = """
import sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False)
print("up", flush=True)
time.sleep(600)
"""


def test_torchfts_own_hook_takes_the_healthy_group_down_when_a_peer_dies_mid_all_reduce(tmp_path, lighthouse):
    """The upstream defect itself (docs/no-restart.md): when this fails, torchft has fixed it
    and trainguard's hook can go."""
    code, output, result = healthy_and_faulty(tmp_path, lighthouse, "kill", "--upstream")
    assert code != 0 and result == {}
    assert "AssertionError" in output and "assert fut._fut" in output
