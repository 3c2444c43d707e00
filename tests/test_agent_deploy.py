"""deploy/: the systemd unit, the DaemonSet, the alert rules and the Grafana dashboard are checked
by the tools that consume them, and use only metrics the agent exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_service import sim_config
from trainguard.agent import AgentDaemon

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNIT = DEPLOY / "systemd" / "trainguard-agent.service"
MANIFEST = DEPLOY / "kubernetes" / "trainguard-agent.yaml"
RULES = DEPLOY / "prometheus" / "trainguard-agent.rules.yml"
DASHBOARD = DEPLOY / "grafana" / "trainguard-agent.json"
METRIC = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|trainguard_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every metric name in /metrics once the agent has seen a fault of each kind."""
    from trainguard.agent.prometheus import MetricsView

    daemon = AgentDaemon(sim_config(tmp_path_factory.mktemp("agent")))
    try:
        daemon.step()
        daemon.sim.now().xid(79, gpu=3).dbe(gpu=2)
        daemon.step()
        text = MetricsView(daemon).render().decode()
    finally:
        daemon.close()
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }


def unknown_metrics(exprs: list[str], exported: set[str]) -> set[str]:
    """Names in PromQL expressions that the agent does not export (histogram parts count)."""
    return {m for e in exprs for m in METRIC.findall(e)} - exported


def rule_exprs() -> list[str]:
    yaml = pytest.importorskip("yaml")
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_alert_rules_use_only_exported_metrics(exported: set[str]) -> None:
    exprs = rule_exprs()
    assert len(exprs) >= 8
    assert unknown_metrics(exprs, exported) == set()


def test_the_metric_check_catches_a_misspelt_name(exported: set[str]) -> None:
    assert unknown_metrics(["DCGM_FI_DEV_GPU_TEMPERATURE > 80", "trainguard_gpu_healthy == 1"], exported) == {
        "DCGM_FI_DEV_GPU_TEMPERATURE",
        "trainguard_gpu_healthy",
    }


def test_grafana_dashboard_uses_only_exported_metrics(exported: set[str]) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    assert unknown_metrics(exprs, exported) == set()
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: apt-get install prometheus")
def test_alert_rules_pass_promtool() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: apt-get install prometheus")
def test_promtool_check_refuses_a_broken_rule(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(by (\n")
    assert (
        subprocess.run(["promtool", "check", "rules", str(bad)], capture_output=True, timeout=60).returncode
        != 0
    )


def _verify_unit(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (not a systemd host)"
)
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    # verify insists that ExecStart exists: point it at this checkout's trainguard
    trainguard = Path(sys.executable).with_name("trainguard")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/trainguard", str(trainguard)))
    done = _verify_unit(unit)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    text = UNIT.read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text and "KillSignal=SIGTERM" in text


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing (not a systemd host)"
)
def test_systemd_verify_refuses_a_broken_unit(tmp_path: Path) -> None:
    unit = tmp_path / "broken.service"
    unit.write_text("[Service]\nExecStart=/nonexistent/trainguard agent\nRestartt=always\n")
    done = _verify_unit(unit)
    assert done.returncode != 0 or "Unknown key" in done.stderr


def test_daemonset_validates_against_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    for doc in docs:
        kv.validate(doc, "1.30.0", strict=True)
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    volumes = {v["name"] for v in spec["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} <= volumes
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))  # leaves the GPUs to jobs
    assert any(v.get("hostPath", {}).get("path") == "/var/log" for v in spec["volumes"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_schema_validation_catches_a_broken_daemonset() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    yaml = pytest.importorskip("yaml")
    ds = next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "ninety-four-ten"
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, "1.30.0", strict=True)
