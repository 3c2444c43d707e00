"""One reading of the node: a supervisor where the agent serves takes the agent's verdict."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from agent_service import Running, sim_config
from trainguard.agent.verdicts import AgentApiVerdicts, verdict_from_json, verdict_to_json
from trainguard.records import Health
from trainguard.supervisor.health import NodeHealth
from trainguard.telemetry.sim import SimNode


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Every simulated node's readings, by node: the simulated NVML calls."""
    counted: Counter[int] = Counter()
    sample = SimNode.sample

    def counting(self: SimNode) -> list:
        counted[id(self)] += 1
        return sample(self)

    monkeypatch.setattr(SimNode, "sample", counting)
    return counted


def wait_for(pred, what: str, ceiling_s: float = 60.0):
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def test_a_supervisor_and_an_agent_on_one_node_read_it_once(tmp_path: Path, reads: Counter[int]) -> None:
    cfg = sim_config(tmp_path, interval_s=0.05)
    with Running(cfg) as agent:
        health = NodeHealth(
            "sim",
            8,
            tmp_path,
            agent_url=f"http://127.0.0.1:{agent.port}",
            agent_token_file=Path(cfg.token_file),
        )
        try:
            assert health.source == "agent" and health.sim is None
            assert agent.daemon.sim is not None
            agent.daemon.sim.now().xid(79, gpu=3)

            def failed() -> bool:
                v = health.tick(force=True)
                return v is not None and v.health is Health.FAILED

            wait_for(failed, "the agent's Xid 79 verdict at the supervisor")
            assert health.gpu_health(3) is Health.FAILED
            assert health.gpu_health(2) is Health.OK
            assert list(reads) == [id(agent.daemon.sim)]  # one node read, by the agent
        finally:
            health.close()


def test_the_supervisor_reads_the_node_itself_where_no_agent_serves(
    tmp_path: Path, reads: Counter[int]
) -> None:
    token = tmp_path / "token"
    token.write_text("x" * 32)
    token.chmod(0o600)
    health = NodeHealth("sim", 2, tmp_path, agent_url="http://127.0.0.1:9", agent_token_file=token)
    try:
        assert health.source == "local" and health.sim is not None
        assert health.tick(force=True) is not None
        assert list(reads) == [id(health.sim)]
    finally:
        health.close()


def test_a_wrong_token_gives_no_verdict(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path)) as agent:
        source = AgentApiVerdicts(f"http://127.0.0.1:{agent.port}", "not-the-token-0123456789")
        assert source.verdict() is None
        assert agent.daemon.tally.copy().refusals["wrong_token"] == 1


def test_the_verdict_survives_its_json(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path)) as agent:
        agent.daemon.sim.now().dbe(gpu=2)
        agent.daemon.step()
        body = agent.json("/api/v1/verdict")
        local = agent.daemon.snapshot.verdict
        assert local is not None and verdict_from_json(body["verdict"]) == local
        assert verdict_to_json(local) == body["verdict"]
        assert local.health is Health.FAILED
