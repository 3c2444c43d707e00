"""`trainguard hosts`: the healthy hosts and slots from the fleet store or the agents' verdicts,
in Horovod's host-discovery format and Open MPI's host-file formats."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_service import Running, sim_config
from trainguard.actions import Advice
from trainguard.cli import main
from trainguard.errors import ConfigError
from trainguard.incidents import IncidentStore
from trainguard.incidents.fleet import FleetWriter
from trainguard.incidents.hosts import NodeState, choose, parse_hostfile, render
from trainguard.incidents.identity import NodeIdentity
from trainguard.records import Gpu, GpuVerdict, Health, NodeVerdict

NOW = 0.0  # this test's "now", set as it starts: a heartbeat written at import would go stale


@pytest.fixture(autouse=True)
def _now() -> None:
    global NOW
    NOW = time.time()


def verdict(
    host: str, failed: tuple[int, ...] = (), gpus: int = 4, action: Advice = Advice.NONE
) -> NodeVerdict:
    per_gpu = tuple(
        GpuVerdict(Gpu(i, f"GPU-{host}-{i}"), Health.FAILED if i in failed else Health.OK, Advice.NONE)
        for i in range(gpus)
    )
    return NodeVerdict(Health.FAILED if failed else Health.OK, action, per_gpu)


def fleet(path: Path, **nodes: NodeVerdict) -> dict[str, FleetWriter]:
    store = IncidentStore(path)
    writers = {}
    for host, v in nodes.items():
        writers[host] = FleetWriter(store, NodeIdentity(host))
        writers[host].observe(v, NOW)
    return writers


def hosts(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[list[str], list[str]]:
    assert main(["hosts", *argv]) == 0
    out, err = capsys.readouterr()
    return out.split(), err.splitlines()


def test_a_drained_node_is_left_out_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "tg.db"
    w = fleet(db, a=verdict("a"), b=verdict("b"), c=verdict("c"))
    w["b"].action("drain", outcome="done", target="b", detail="xid 79 on GPU 1", time=NOW)
    w["b"].store.close()
    out, err = hosts(capsys, "--db", str(db), "--format", "horovod")
    assert out == ["a:4", "c:4"]
    assert err == ["trainguard hosts: left out b: drained by remediate: xid 79 on GPU 1"]
    assert hosts(capsys, "--db", str(db), "--quiet") == (["a:4", "c:4"], [])  # a discovery script's log


def test_a_resumed_node_comes_back_and_a_cordoned_one_stays_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "tg.db"
    w = fleet(db, a=verdict("a"), b=verdict("b"))
    w["a"].action("drain", outcome="done", target="a", time=NOW - 60)
    w["a"].action("resume", outcome="done", target="a", time=NOW - 30)
    w["b"].action("cordon", outcome="already", target="b", time=NOW - 30)
    w["b"].action("drain", outcome="failed", target="b", time=NOW - 10)  # did not take: no change
    w["a"].store.close()
    out, err = hosts(capsys, "--db", str(db), "--format", "hostfile")
    assert out == ["a", "slots=4"]
    assert [e.split(":")[1].strip() for e in err] == ["left out b"]
    assert "cordoned" in err[0]


def test_a_failed_gpu_costs_its_slot_and_a_node_failure_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "tg.db"
    w = fleet(db, a=verdict("a", failed=(2,)), b=verdict("b", action=Advice.DRAIN))
    w["a"].store.close()
    out, err = hosts(capsys, "--db", str(db), "--format", "host", "--host", "a:4,b:4,newnode:2")
    assert out == ["a:3,newnode:2"]  # a node the store never heard of is kept, as asked
    assert err == ["trainguard hosts: left out b: its agent asks for a drain"]
    states = {"n": NodeState("n", health="failed", reason="NIC down")}
    assert choose(states, None, NOW)[0].left_out == "failed: NIC down"


def test_a_silent_agent_leaves_its_host_out() -> None:
    states = {"a": NodeState("a", gpus=8, last_seen=NOW - 301), "b": NodeState("b", gpus=8, last_seen=NOW)}
    picked = choose(states, None, NOW, stale_s=300)
    assert render(picked, "horovod") == "b:8"
    assert picked[0].left_out.startswith("no word from its agent for 301 s")


def test_host_files_are_read_as_open_mpi_and_horovod_write_them(tmp_path: Path) -> None:
    text = "# the job's nodes\nn1 slots=8 max_slots=8\nn2\nn3:4\n\nn4 slots=2 # spare\n"
    assert parse_hostfile(text) == [("n1", 8), ("n2", None), ("n3", 4), ("n4", 2)]
    with pytest.raises(ConfigError, match="slots must be a whole number"):
        parse_hostfile("n1 slots=x")


def horovod_discovery(script: Path, default_slots: int = 1) -> dict[str, int]:
    """What Horovod 0.28.1's elastic driver makes of a discovery script (its documented contract,
    `horovod.runner.elastic.discovery.HostDiscoveryScript`): run through a shell, exit 0, stdout
    lines ``host:slots`` or ``host`` (default slots), empty output meaning no host yet."""
    result = subprocess.run(str(script), shell=True, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    slots = {}
    for line in set(result.stdout.strip().split("\n")):
        if ":" in line:
            host, n = line.split(":")
            slots[host] = int(n)
        elif line:
            slots[line] = default_slots
    return slots


def test_it_serves_as_horovods_host_discovery_script(tmp_path: Path) -> None:
    db = tmp_path / "tg.db"
    w = fleet(db, a=verdict("a"), b=verdict("b", failed=(0, 1)))
    w["a"].store.close()
    (tmp_path / "all").write_text("a slots=2\nb slots=4\nc slots=1\n")
    script = tmp_path / "discover.sh"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} -m trainguard.cli hosts --format horovod --db {db} --hostfile {tmp_path / 'all'}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert horovod_discovery(script) == {"a": 2, "b": 2, "c": 1}
    with IncidentStore(db) as store:
        FleetWriter(store, NodeIdentity("a")).action("drain", outcome="done", target="a", time=time.time())
    assert horovod_discovery(script) == {"b": 2, "c": 1}


def test_a_missing_store_is_an_error_horovod_keeps_its_hosts_on(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "hosts", "--db", str(tmp_path / "none.db")],
        capture_output=True,
        text=True,
        env={**os.environ, "TRAINGUARD_DB": ""},
        check=False,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert "no incident store" in r.stderr


def test_the_agents_verdicts_are_a_source_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = sim_config(tmp_path)
    with Running(cfg) as agent:
        assert agent.daemon.sim is not None
        agent.daemon.sim.now().xid(79, gpu=3)
        agent.daemon.step()
        url = f"http://127.0.0.1:{agent.port}"
        out, err = hosts(
            capsys,
            "--agent", f"node-a={url}",
            "--agent", "node-b=http://127.0.0.1:9",  # nothing listens: no verdict
            "--agent-token-file", cfg.token_file,
        )  # fmt: skip
    assert out == ["node-a:7"]
    assert err == [
        "trainguard hosts: left out node-b: no verdict from its agent at http://127.0.0.1:9/api/v1/verdict"
    ]
