"""Remediation in the running node agent: the act step, /metrics, the API and its admin token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_service import TOKEN, Running, sim_config, write_token
from real_parts import require_module, require_real
from trainguard.agent import AgentDaemon
from trainguard.agent.assemble import assemble, remediation_of
from trainguard.agent.prometheus import MetricsView
from trainguard.incidents.store import IncidentStore
from trainguard.remediate.hook import AgentRemediation

ADMIN = "admin-token-0123456789abcdef"


def remediation(daemon: AgentDaemon) -> AgentRemediation:
    """The daemon's act, which `assemble` made its remediation."""
    found = remediation_of(daemon)
    assert found is not None
    return found


def _policy(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


def test_default_agent_decides_but_does_not_act(tmp_path: Path) -> None:
    daemon = assemble(sim_config(tmp_path))
    try:
        daemon.step()
        daemon.sim.now().xid(79, gpu=3)
        daemon.step()
        remediation(daemon).flush()
        assert remediation(daemon).counts[("reboot_node", "dry_run")] == 1
        assert remediation(daemon).enforcing is False
        node = remediation(daemon).remediator.providers.get("node")
        assert node is None  # nothing that could act was even built
    finally:
        daemon.close()


def test_enforcing_agent_acts_records_and_exports(tmp_path: Path) -> None:
    policy = _policy(
        tmp_path, '[remediation]\nenforce = true\n[remediation.actions]\nxid = "drain"\ngpu_lost = "drain"\n'
    )
    daemon = assemble(sim_config(tmp_path, policy=policy))
    try:
        daemon.step()
        daemon.sim.now().xid(79, gpu=3)
        daemon.step()
        remediation(daemon).flush()
        sched = remediation(daemon).remediator.providers["node"]
        assert sched.state("node-a")[0] == "drained"  # type: ignore[attr-defined]
        with IncidentStore(tmp_path / "tg.db") as store:
            acts = [i for i in store.incidents() if i.detected_by == "remediation"]
        assert [(a.action, a.gpu, a.resolved) for a in acts] == [("drain", 3, True)]
        text = MetricsView(daemon).render().decode()
        assert 'trainguard_remediation_actions_total{remedy="drain",result="done"} 1.0' in text
        assert "trainguard_remediation_breaker_open 0.0" in text
        assert "trainguard_remediation_enforcing 1.0" in text
    finally:
        daemon.close()


def test_agent_reports_a_stranger_process_once(tmp_path: Path) -> None:
    daemon = assemble(sim_config(tmp_path, policy=_policy(tmp_path, "[remediation]\n")))
    try:
        daemon.sim.start_process(1, 1001, "python train.py", user="alice", job="77")
        daemon.sim.start_process(5, 4242, "xmrig -o pool", user="mallory")
        for _ in range(3):
            daemon.step()
        remediation(daemon).flush()
        with IncidentStore(tmp_path / "tg.db") as store:
            (rec,) = [i for i in store.incidents() if i.detected_by == "remediation"]
        assert (
            rec.action == "webhook" and rec.gpu == 5 and "mallory" in rec.summary and "xmrig" in rec.summary
        )
        assert rec.resolution == "dry_run: would webhook"
    finally:
        daemon.close()


def test_breaker_reset_needs_the_admin_token(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "[remediation]\nenforce = true\n[remediation.breaker]\nmax_nodes = 0\n")
    admin = write_token(tmp_path / "admin", ADMIN)
    with Running(sim_config(tmp_path, policy=policy, admin_token_file=str(admin))) as agent:
        agent.daemon.step()
        agent.daemon.sim.now().xid(79, gpu=2)
        agent.daemon.step()
        remediation(agent.daemon).flush()
        status = agent.json("/api/v1/remediation")
        assert status["breaker"]["open"] is True and status["breaker"]["held"] == 1
        assert agent.get("/api/v1/breaker/reset", token=TOKEN, method="POST")[0] == 403  # read token
        assert agent.get("/api/v1/breaker/reset", token=None, method="POST")[0] == 403
        assert agent.get("/api/v1/breaker/reset", token=ADMIN, method="GET")[0] == 405
        assert agent.get("/api/v1/node", token=TOKEN, method="POST")[0] == 405  # the rest stays read-only
        code, _, body = agent.get("/api/v1/breaker/reset", token=ADMIN, method="POST")
        assert code == 200 and json.loads(body)["was"].startswith("0 node(s) already actioned")
        assert agent.json("/api/v1/remediation")["breaker"]["open"] is False


def test_enforcing_agent_resets_a_gpu_and_the_next_tick_sees_it_healthy(tmp_path: Path) -> None:
    from trainguard.records import Health

    daemon = assemble(sim_config(tmp_path, enforce=True))  # --enforce with the built-in defaults
    try:
        daemon.step()
        daemon.sim.now().dbe(gpu=2)
        assert daemon.step().verdict.gpus[2].health is Health.FAILED  # type: ignore[union-attr]
        remediation(daemon).flush()
        assert remediation(daemon).counts[("reset_gpu", "done")] == 1
        daemon.step()  # its act step tells the agent (on the tick's thread) that GPU 2 was reset
        snap = daemon.step()
        assert snap.verdict.gpus[2].health is Health.OK  # type: ignore[union-attr]
    finally:
        daemon.close()


@pytest.mark.integration
@pytest.mark.slow
def test_dashboard_shows_an_open_breaker(tmp_path: Path) -> None:
    """In a real Chromium: the header says when the fleet breaker is open and how much it held."""
    import time

    require_real("chromium", install="apt-get install chromium (make integration-deps)")
    chromedriver = require_real(
        "chromedriver", install="apt-get install chromium-driver (make integration-deps)"
    )
    webdriver = require_module("selenium.webdriver", install="pip install 'trainguard[integration]'")
    from selenium.webdriver.chrome.service import Service

    policy = _policy(tmp_path, "[remediation]\nenforce = true\n[remediation.breaker]\nmax_nodes = 0\n")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    with Running(sim_config(tmp_path, policy=policy)) as agent:
        driver = webdriver.Chrome(service=Service(chromedriver), options=options)
        try:
            agent.daemon.step()
            agent.daemon.sim.now().xid(79, gpu=2)
            agent.daemon.step()
            remediation(agent.daemon).flush()
            driver.get(f"http://viewer:{TOKEN}@127.0.0.1:{agent.port}/")
            deadline, box = time.monotonic() + 30, {}
            while time.monotonic() < deadline:
                box = driver.execute_script(
                    "const b = document.querySelector('#remediation'); return {s: b.dataset.breaker, t: b.textContent};"
                )
                if box["s"] == "open":
                    break
                time.sleep(0.2)
            assert box["s"] == "open", box
            assert "breaker OPEN" in box["t"] and "1 held" in box["t"] and "enforcing" in box["t"]
        finally:
            driver.quit()


def test_an_agent_whose_act_is_not_remediation_serves_no_remediation(tmp_path: Path) -> None:
    seen: list[object] = []
    admin = write_token(tmp_path / "admin", ADMIN)
    with Running(sim_config(tmp_path, admin_token_file=str(admin)), act=seen.append) as agent:
        agent.daemon.step()
        assert remediation_of(agent.daemon) is None and len(seen) == 2  # start() ticks once too
        assert agent.get("/api/v1/remediation")[0] == 404
        assert agent.get("/api/v1/breaker/reset", token=ADMIN, method="POST")[0] == 404
        assert "trainguard_remediation_" not in agent.get("/metrics")[2].decode()


def test_trainguard_agent_runs_remediation_as_its_act(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path)) as agent:
        agent.daemon.step()
        assert remediation_of(agent.daemon) is not None
        assert agent.json("/api/v1/remediation")["enforcing"] is False
        assert "trainguard_remediation_enforcing 0.0" in agent.get("/metrics")[2].decode()
