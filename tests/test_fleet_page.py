# ruff: noqa: F811 - the PostgreSQL fixtures are imported from pgserver.py and requested by name
"""The fleet page in a real Chromium, served by an agent whose store is the fleet's PostgreSQL:
nodes as tiles coloured by verdict, a group filter, a click through to a node's incidents; the
fleet API behind the token.

The screenshot is kept in build/test-artifacts/fleet-page.png.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agent_service import TOKEN, Running, sim_config
from pgserver import pg_url, postgres  # noqa: F401 - fixtures
from test_agent_integration import ARTIFACTS, browser, poll  # noqa: F401 - the Chromium fixture
from test_fleet_cli import fill
from trainguard.incidents import IncidentStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAGE = """
const tiles = [...document.querySelectorAll('#grid .node')];
return {
  tiles: tiles.map((t) => [t.dataset.host, t.dataset.health, t.dataset.group, getComputedStyle(t).backgroundColor]),
  summary: document.querySelector('#summary').textContent,
  groups: [...document.querySelectorAll('#group option')].map((o) => o.value),
  incidents: [...document.querySelectorAll('#node-incidents tbody tr[data-id]')].map((r) => r.textContent),
  node: document.querySelector('#node-name').textContent,
};
"""


@pytest.fixture
def fleet_agent(pg_url: str, tmp_path: Path):
    with IncidentStore(pg_url) as store:
        fill(store, time.time())  # six nodes in two groups; node-04 failed; node-01 has four incidents
    with Running(sim_config(tmp_path, db=pg_url)) as running:
        yield running


def test_the_fleet_api_needs_the_token(fleet_agent: Running) -> None:
    assert fleet_agent.get("/api/v1/fleet/status", token=None)[0] == 401
    assert fleet_agent.get("/fleet", token=None)[0] == 401
    status, _, body = fleet_agent.get("/api/v1/fleet/nodes?group=h100")
    assert status == 200 and [n["host"] for n in json.loads(body)] == ["node-04", "node-05"]
    assert fleet_agent.get("/api/v1/fleet/incidents?limit=0")[0] == 400
    assert fleet_agent.get("/api/v1/fleet/nope")[0] == 404


def test_the_fleet_page_colours_nodes_filters_groups_and_opens_a_nodes_incidents(
    fleet_agent: Running, browser
) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(f"http://viewer:{TOKEN}@127.0.0.1:{fleet_agent.port}/fleet")

    def state() -> dict:  # type: ignore[type-arg]
        return dict(browser.execute_script(PAGE))

    # The six nodes of the store, and the serving agent itself: its first tick wrote its verdict.
    assert poll(lambda: len(state()["tiles"]) == 7, 20), f"the grid never filled: {state()}"
    tiles = {host: (health, colour) for host, health, _, colour in state()["tiles"]}
    assert tiles["node-a"][0] == "ok"
    assert tiles["node-04"] == ("failed", "rgb(198, 40, 40)")  # --failed
    assert tiles["node-00"] == ("ok", "rgb(46, 125, 50)")  # --ok
    assert "7 nodes: 6 ok, 0 degraded, 1 failed" in state()["summary"]
    assert poll(lambda: state()["groups"] == ["", "(none)", "a100", "h100"], 10)

    Select(browser.find_element(By.ID, "group")).select_by_value("h100")
    assert poll(lambda: sorted(t[0] for t in state()["tiles"]) == ["node-04", "node-05"], 10), state()
    Select(browser.find_element(By.ID, "group")).select_by_value("(none)")
    assert poll(lambda: [t[0] for t in state()["tiles"]] == ["node-a"], 10), state()

    Select(browser.find_element(By.ID, "group")).select_by_value("a100")
    assert poll(lambda: len(state()["tiles"]) == 4, 10)
    browser.find_element(By.CSS_SELECTOR, '#grid .node[data-host="node-01"]').click()
    assert poll(lambda: len(state()["incidents"]) == 4, 10), state()
    page = state()
    assert page["node"] == "node-01" and all("gpu_hbm_memory" in row for row in page["incidents"])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "fleet-page.png"))
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
