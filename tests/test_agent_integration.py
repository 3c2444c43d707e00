"""The agent against the real things that consume it: a Prometheus server scraping it and a
headless Chromium showing its dashboard. `make test-integration` installs both (Debian packages
prometheus, chromium, chromium-driver); without them `make test-all` fails naming what to install
(tests/real_parts.py).

The dashboard screenshot is kept in build/test-artifacts/agent-dashboard.png.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agent_service import TOKEN, Running, sim_config
from real_parts import require_module, require_real
from trainguard.procs import parent_death

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "build" / "test-artifacts"
RULES = ROOT / "deploy" / "prometheus" / "trainguard-agent.rules.yml"
# How long to wait for what a test expects (a page update, a scrape, an alert): generous, since a
# loaded 2-core machine is slow; how fast it comes is a benchmark's business, not a test's.
CEILING_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(check, timeout: float, step: float = 0.1):  # type: ignore[no-untyped-def]
    """``check()``'s first truthy value within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    return None


@pytest.fixture
def agent(tmp_path: Path):
    with Running(sim_config(tmp_path, interval_s=0.5)) as running:
        yield running


# -- Prometheus ---------------------------------------------------------------------------------


@pytest.fixture
def prometheus(agent: Running, tmp_path: Path):
    """A real Prometheus scraping the agent with its scrape token (created at the agent's start)."""
    exe = require_real("prometheus", install="apt-get install prometheus (make integration-deps)")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: trainguard-agent
    authorization: {{credentials_file: "{tmp_path / "state" / "scrape.token"}"}}
    static_configs: [{{targets: ["127.0.0.1:{agent.port}"]}}]
"""
    )
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=parent_death(),
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        if not poll(ready, CEILING_S, 0.25):
            proc.kill()
            pytest.fail("prometheus did not become ready: " + proc.stderr.read().decode()[-2000:])  # type: ignore[union-attr]
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_a_real_prometheus_scrapes_the_agent_and_sees_a_fault(agent: Running, prometheus: str) -> None:
    temps = poll(
        lambda: (
            len(query(prometheus, "DCGM_FI_DEV_GPU_TEMP")) == 8 and query(prometheus, "DCGM_FI_DEV_GPU_TEMP")
        ),
        CEILING_S,
    )
    assert temps, "8 GPU temperatures never arrived"
    labels = temps[0]["metric"]
    assert {"gpu", "UUID", "pci_bus_id", "modelName", "Hostname"} <= set(labels) and labels[
        "Hostname"
    ] == "node-a"
    assert query(prometheus, 'up{job="trainguard-agent"}')[0]["value"][1] == "1"
    agent.daemon.sim.now().xid(79, gpu=3)
    failed = poll(lambda: query(prometheus, 'trainguard_gpu_health{state="failed"} == 1'), CEILING_S)
    assert failed and [r["metric"]["gpu"] for r in failed] == ["3"]
    xids = poll(lambda: query(prometheus, 'trainguard_xid_total{xid="79"}'), CEILING_S)
    assert xids and xids[0]["value"][1] == "1"
    # the shipped alert rules evaluate against the real series, and the lost GPU fires one
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10) as r:
        groups = json.loads(r.read())["data"]["groups"]
    assert groups and all(rule["health"] in ("ok", "unknown") for g in groups for rule in g["rules"])

    def alert_names() -> set[str]:
        with urllib.request.urlopen(f"{prometheus}/api/v1/alerts", timeout=10) as r:
            alerts = json.loads(r.read())["data"]["alerts"]
        return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

    assert poll(lambda: {"TrainguardGpuLost", "TrainguardGpuFailed"} <= alert_names(), CEILING_S)


# -- the dashboard in Chromium --------------------------------------------------------------------


@pytest.fixture
def browser():
    require_real("chromium", install="apt-get install chromium (make integration-deps)")
    require_real("chromedriver", install="apt-get install chromium-driver (make integration-deps)")
    webdriver = require_module("selenium.webdriver", install="pip install 'trainguard[integration]'")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.TemporaryDirectory(prefix="trainguard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile.name}",
        "--window-size=1400,1600",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        profile.cleanup()


# The page redraws every second: read it in one script call (no stale element references).
PAGE_STATE = """
const q = (sel) => document.querySelector(sel);
const chart = q('#charts .chart[data-field="temperature_c"]');
return {
  rows: document.querySelectorAll('#gpus tbody tr').length,
  gpu3: q('#gpus tbody tr[data-gpu="3"]')?.dataset.health ?? null,
  verdict: q('#verdict').dataset.health,
  points: chart ? Number(chart.dataset.points || 0) : 0,
  lines: chart ? chart.querySelectorAll('path[data-gpu]').length : 0,
  reasons: q('#reasons').textContent,
  incidents3: document.querySelectorAll('#incidents tbody tr[data-gpu="3"]').length,
  agent: q('#agent').textContent,
};
"""


def test_dashboard_shows_live_data_and_a_fault(agent: Running, browser) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"http://viewer:{TOKEN}@127.0.0.1:{agent.port}/")  # HTTP Basic: the token is the password

    def state() -> dict:  # type: ignore[type-arg]
        return dict(browser.execute_script(PAGE_STATE))

    assert poll(lambda: state()["rows"] == 8, CEILING_S), "the GPU table never filled"
    assert poll(lambda: state()["points"] >= 16, CEILING_S), (
        "the temperature chart shows no data"
    )  # 2+ points x 8 GPUs
    first = state()
    assert first["lines"] == 8 and first["verdict"] == "ok" and first["gpu3"] == "ok"

    agent.daemon.sim.now().xid(79, gpu=3)
    injected = time.monotonic()
    assert poll(lambda: state()["gpu3"] == "failed", CEILING_S), "GPU 3's failure never reached the page"
    seen_after = time.monotonic() - injected
    after = state()
    assert after["verdict"] == "failed" and "fallen off the bus" in after["reasons"]
    assert poll(lambda: state()["incidents3"] > 0, CEILING_S), "the incident never reached the timeline"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "agent-dashboard.png"))
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert "unreachable" not in state()["agent"]
    print(f"fault on the page {seen_after:.2f} s after injection")


def test_dashboard_without_credentials_gets_nothing(agent: Running, browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    browser.get(f"http://127.0.0.1:{agent.port}/")
    assert not browser.find_elements(By.ID, "gpus")
    assert agent.daemon.tally.copy().refusals["unauthenticated"] >= 1


DASHBOARD = ROOT / "tests" / "data" / "grafana" / "dcgm-exporter-dashboard-queries.json"


def label_values(base: str, metric: str, label: str) -> list[str]:
    """What Grafana's ``label_values(metric, label)`` asks Prometheus."""
    url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})
    with urllib.request.urlopen(url, timeout=10) as r:
        return list(json.loads(r.read())["data"])


def test_nvidias_dcgm_exporter_dashboard_shows_every_panel(agent: Running, prometheus: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert poll(lambda: len(query(prometheus, "DCGM_FI_DEV_GPU_TEMP")) == 8, 30), "no scrape arrived"
    chosen: dict[str, str] = {}
    for var in dashboard["variables"]:  # Grafana fills each with label_values(...), "All" selected
        metric, label = var["query"].removeprefix("label_values(").removesuffix(")").split(", ")
        values = label_values(prometheus, metric, label)
        assert values, f"dashboard variable ${var['name']} has no values"
        chosen[var["name"]] = "(" + "|".join(values) + ")"
    empty = []
    for panel in dashboard["panels"]:
        for expr in panel["expr"]:
            for name, value in chosen.items():
                expr = expr.replace(f"${name}", value)
            if not poll(lambda e=expr: query(prometheus, e), 10):
                empty.append(panel["title"])
    assert empty == [], f"panels without data: {empty}"
