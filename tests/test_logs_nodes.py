"""`logs explain` on a two-node job that lost one node: the node, never the network by default.

The jobs are generated: two simulated nodes (gpu-a01: ranks 0-3, gpu-b07: ranks 4-7), one per-task
file per rank (Slurm ``--output=job-%j-%t.out``) in the line formats NCCL 2.21, torch 2.4+ and
torch elastic print. gpu-b07 dies at 10:14:02: its ranks' output stops there; what the survivors
print afterwards depends on the scenario.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.detect.training_log import training_time
from trainguard.incidents.nodes import NodeLine, lone_rank, node_failure

# glog stamps carry no year (the reader takes it from the clock): the ISO lines use the same year.
YEAR = datetime.fromtimestamp(training_time("[E1124 10:14:02.000000 1 x.cpp:1] x") or 0).year
HOSTS = {r: ("gpu-a01" if r < 4 else "gpu-b07") for r in range(8)}
ADDR = {"gpu-a01": "10.0.0.11", "gpu-b07": "10.0.0.17"}
BUS = ["18000", "3b000", "5e000", "86000"]


def _head(r: int) -> list[str]:
    h, d, pid = HOSTS[r], r % 4, 4100 + r
    return [
        f"[rank{r}]:{h}:{pid}:{pid} [{d}] NCCL INFO Bootstrap : Using eth0:{ADDR[h]}<0>",
        f"[rank{r}]:{h}:{pid}:{pid + 40} [{d}] NCCL INFO comm 0x55d0c8a3e2f0 rank {r} nranks 8 cudaDev {d} nvmlDev {d} "
        f"busId {BUS[d]} commId 0x7b2e10f9c3a1d2e4 - Init START",
    ] + [
        f"{YEAR}-11-24 10:1{3 + s // 60}:{s % 60:02d},100 [rank{r}] step {s} loss 2.{s}"
        for s in range(0, 63, 3)
    ]


_CLOSED = "[rank{r}]:gpu-a01:{pid}:{tid} [{d}] misc/socket.cc:47 NCCL WARN socketProgress: Connection closed by remote peer gpu-b07.cluster.local<51234>"
_WATCHDOG = (
    "[rank{r}]:[E1124 10:14:{ss}.481220 {pid} ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
    "Process group watchdog thread terminated with exception: NCCL error: remote process exited or there was a "
    "network error, NCCL version 2.21.5"
)
_TIMEOUT = (
    "[rank{r}]:[E1124 10:{mm}:{ss}.481220 {pid} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=2210, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) "
    "ran for 600042 milliseconds before timing out."
)
_RESET_A = "[rank{r}]:[E1124 10:14:{ss}.100000 {pid} socket.cpp:487] recvValue failed on SocketImpl(fd=41, addr=[gpu-b07]:41234, remote=[gpu-a01]:29500): Connection reset by peer"


def _job(tmp: Path, scenario: str) -> Path:
    job = tmp / scenario
    job.mkdir()
    for r in range(8):
        lines = _head(r)
        pid, d = 4100 + r, r % 4
        if r < 4 and scenario in ("reset", "dead_node"):
            lines += [
                _CLOSED.format(r=r, pid=pid, tid=pid + 60, d=d),
                _WATCHDOG.format(r=r, ss="05", pid=pid),
            ]
        if r < 4 and scenario == "timeouts":
            lines += [_TIMEOUT.format(r=r, mm="24", ss="03", pid=pid)]
        if scenario == "mutual":  # both nodes alive and printing, each blaming the other
            if r < 4:
                lines += [_CLOSED.format(r=r, pid=pid, tid=pid + 60, d=d)]
            else:
                lines += [
                    _RESET_A.format(r=r, ss="04", pid=pid).replace(
                        "remote=[gpu-a01]:29500", "peer [10.0.0.11]:29500"
                    )
                ]
            lines += [f"{YEAR}-11-24 10:14:{10 + r},000 [rank{r}] still here"]
        (job / f"job-77-{r}.out").write_text("\n".join(lines) + "\n")
    if scenario == "dead_node":
        (job / "agent-gpu-a.log").write_text(
            f"[{YEAR}-11-24 10:14:40,102] torch.distributed.elastic.rendezvous.dynamic_rendezvous: [INFO] Detected dead "
            "node 'gpu-b07_2211_0', removing it from the rendezvous\n"
        )
    return job


@pytest.mark.parametrize("scenario", ["reset", "timeouts", "dead_node"])
def test_killed_node_is_named_with_its_ranks_and_not_the_network(
    tmp_path: Path, scenario: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, scenario)
    assert main(["logs", "explain", str(job), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["node"]["host"] == "gpu-b07", out["node"]
    root = out["root_cause"]
    assert root["host"] == "gpu-b07" and root["ranks"] == [4, 5, 6, 7] and root["category"] == "node_failure"
    assert out["cause"] != "network_switch_cable"
    assert out["recommendation"]["verb"] == "restart_without" and "gpu-b07" in out["recommendation"]["reason"]


def test_two_live_nodes_blaming_each_other_is_unknown_with_both_suspects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["logs", "explain", str(_job(tmp_path, "mutual")), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["node"]["host"] is None and out["node"]["suspects"] == ["gpu-a01", "gpu-b07"]
    assert out["cause"] == "unknown"


def test_a_reporter_never_accuses_its_own_host() -> None:
    lines = [NodeLine(0, "gpu-a01", 1.0, "Connection closed by peer [10.0.0.11]:4242")]
    assert node_failure(lines, HOSTS, {v: k for k, v in ADDR.items()}) is None


def test_only_rank_that_did_not_time_out_is_the_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert lone_rank({0, 1, 3}, {0, 1, 2, 3}) == 2
    assert lone_rank({0, 1}, {0, 1, 2, 3}) is None  # two silent ranks: no single origin
    job = tmp_path / "job"
    job.mkdir()
    for r in range(4):
        lines = _head(r)[1:2] + (
            [] if r == 2 else [_TIMEOUT.format(r=r, mm="24", ss="03", pid=4100 + r).replace("Rank", "Rank")]
        )
        (job / f"job-9-{r}.out").write_text("\n".join(lines).replace("nranks 8", "nranks 4") + "\n")
    assert main(["logs", "explain", str(job), "--json"]) == 0
    root = json.loads(capsys.readouterr().out)["root_cause"]
    assert root["ranks"] == [2] and "did not time out" in root["evidence"]["2"][0]
