"""deploy/: the systemd unit, the DaemonSet, the alert rules and the Grafana dashboard are checked
by the tools that consume them, and use only metrics the agent exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_service import sim_config
from real_parts import require_real
from trainguard.agent.assemble import assemble

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNIT = DEPLOY / "systemd" / "trainguard-agent.service"
DROP_INS = DEPLOY / "systemd" / "trainguard-agent.service.d"
MANIFEST = DEPLOY / "kubernetes" / "trainguard-agent.yaml"
ACTING = DEPLOY / "kubernetes" / "trainguard-agent-remediation.yaml"
RBAC = DEPLOY / "kubernetes" / "trainguard-remediation-rbac.yaml"
RULES = DEPLOY / "prometheus" / "trainguard-agent.rules.yml"
SCRAPE = DEPLOY / "prometheus" / "trainguard-scrape.yml"
DASHBOARD = DEPLOY / "grafana" / "trainguard-agent.json"
METRIC = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|trainguard_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every metric name in /metrics once the agent has seen a fault of each kind."""
    from trainguard.agent.prometheus import MetricsView

    daemon = assemble(sim_config(tmp_path_factory.mktemp("agent")))  # as `trainguard agent` runs it
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


def test_alert_rules_pass_promtool() -> None:
    require_real("promtool", install="apt-get install prometheus")
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_check_refuses_a_broken_rule(tmp_path: Path) -> None:
    require_real("promtool", install="apt-get install prometheus")
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


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    require_real("systemd-analyze", install="apt-get install systemd")
    # verify insists that ExecStart exists: point it at this checkout's trainguard
    trainguard = Path(sys.executable).with_name("trainguard")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/trainguard", str(trainguard)))
    done = _verify_unit(unit)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    text = UNIT.read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in text and "KillSignal=SIGTERM" in text


def test_systemd_verify_refuses_a_broken_unit(tmp_path: Path) -> None:
    require_real("systemd-analyze", install="apt-get install systemd")
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
    host = [v["hostPath"] for v in spec["volumes"] if "hostPath" in v]
    assert {h["path"] for h in host} == {"/var/log", "/var/lib/trainguard"}
    log_mount = next(m for m in container["volumeMounts"] if m["name"] == "host-log")
    assert log_mount["readOnly"] is True
    assert 4 in spec["securityContext"]["supplementalGroups"]  # adm: reads kern.log without a capability
    sc = container["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz" and probe["httpGet"]["scheme"] == "HTTPS"


def test_the_daemonset_serves_tls_by_default_behind_a_network_policy() -> None:
    import tomllib

    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    config = tomllib.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["agent.toml"])["agent"]
    assert config["tls_cert"] and config["tls_key"]
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert str(Path(config["tls_key"]).parent) in mounts
    tls = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert tls["secret"]["defaultMode"] == 0o400
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"} and policy["spec"]["egress"] == []
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9410}] and rule["from"]


def test_the_systemd_unit_runs_with_the_least_privilege_that_works(tmp_path: Path) -> None:
    require_real("systemd-analyze", install="apt-get install systemd")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text())
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= 2.5  # was 7.5 EXPOSED as full root
    text = UNIT.read_text()
    assert "DynamicUser=yes" in text and "CapabilityBoundingSet=CAP_SYSLOG" in text and "UMask=0077" in text


def test_schema_validation_catches_a_broken_daemonset() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    yaml = pytest.importorskip("yaml")
    ds = next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "ninety-four-ten"
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, "1.30.0", strict=True)


def _unit_with(tmp_path: Path, *drop_ins: str) -> Path:
    """The unit (ExecStart pointed at this checkout) with the named drop-ins beside it."""
    trainguard = Path(sys.executable).with_name("trainguard")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/trainguard", str(trainguard)))
    d = tmp_path / f"{UNIT.name}.d"
    d.mkdir(exist_ok=True)
    for name in drop_ins:
        (d / name).write_text((DROP_INS / name).read_text())
    return unit


def _exposure(unit: Path) -> float:
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


def _service(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_the_remediation_drop_ins_verify_and_add_only_what_they_say(tmp_path: Path) -> None:
    """Issue 34: the shipped unit could not remediate (a dynamic user Slurm cannot make an
    operator, no capability for a GPU reset): two drop-ins add exactly that, and the unit stays OK."""
    require_real("systemd-analyze", install="apt-get install systemd")
    assert sorted(p.name for p in DROP_INS.iterdir()) == ["gpu-reset.conf", "remediation.conf"]
    unit = _unit_with(tmp_path, "remediation.conf", "gpu-reset.conf")
    done = _verify_unit(unit)
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr
    assert _exposure(unit) <= 2.5  # the unit alone: 1.8
    acting = _service((DROP_INS / "remediation.conf").read_text())
    assert acting["DynamicUser"] == ["no"] and acting["User"] == ["trainguard"]
    assert acting["IPAddressDeny"] == ["any"] and "localhost" in acting["IPAddressAllow"]
    assert "CapabilityBoundingSet" not in acting and "AmbientCapabilities" not in acting
    reset = _service((DROP_INS / "gpu-reset.conf").read_text())
    assert reset == {"CapabilityBoundingSet": ["CAP_SYS_ADMIN"], "AmbientCapabilities": ["CAP_SYS_ADMIN"]}


def test_the_exposure_check_sees_a_drop_in_that_loosens_the_unit(tmp_path: Path) -> None:
    require_real("systemd-analyze", install="apt-get install systemd")
    unit = _unit_with(tmp_path)
    (tmp_path / f"{UNIT.name}.d" / "loose.conf").write_text(
        "[Service]\nDynamicUser=no\nUser=root\nCapabilityBoundingSet=~\nProtectSystem=no\nSystemCallFilter=\n"
    )
    assert _exposure(unit) > 2.5


def _docs(path: Path) -> list[dict]:  # type: ignore[type-arg]
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_acting_daemonset_is_the_watching_one_plus_a_token_a_policy_and_egress_to_the_api(
    tmp_path: Path,
) -> None:
    """Issue 34: the shipped DaemonSet had no API token and no egress, so it could not cordon:
    the acting variant adds those, validated, and differs in nothing else."""
    import tomllib

    kv = pytest.importorskip("kubernetes_validate")
    base, acting = _docs(MANIFEST), _docs(ACTING)
    for doc in acting:
        kv.validate(doc, "1.30.0", strict=True)
    assert [d["kind"] for d in base] == [d["kind"] for d in acting]
    kinds = {d["kind"]: (b, d) for b, d in zip(base, acting, strict=True)}
    ds_base, ds_acting = (d["spec"]["template"]["spec"] for d in kinds["DaemonSet"])
    account = next(d for d in _docs(RBAC) if d["kind"] == "ServiceAccount")["metadata"]
    assert ds_acting.pop("serviceAccountName") == account["name"]
    assert account["namespace"] == kinds["DaemonSet"][1]["metadata"]["namespace"]
    assert ds_base.pop("automountServiceAccountToken") is False
    assert ds_acting.pop("automountServiceAccountToken") is True
    assert ds_acting == ds_base
    cm_base, cm_acting = kinds["ConfigMap"]
    agent_base = tomllib.loads(cm_base["data"]["agent.toml"])["agent"]
    agent_acting = tomllib.loads(cm_acting["data"]["agent.toml"])["agent"]
    assert agent_acting.pop("policy") == "/etc/trainguard/remediation.toml"
    assert agent_acting == agent_base
    mounts = {m["mountPath"] for m in ds_acting["containers"][0]["volumeMounts"]}
    assert "/etc/trainguard" in mounts  # the ConfigMap, policy included
    from trainguard.remediate.policy import load_policy

    policy_file = tmp_path / "remediation.toml"
    policy_file.write_text(cm_acting["data"]["remediation.toml"])
    policy = load_policy(policy_file)
    assert policy.enforce and policy.provider == "kubernetes"
    np_base, np_acting = kinds["NetworkPolicy"]
    assert np_acting["spec"]["ingress"] == np_base["spec"]["ingress"] and np_base["spec"]["egress"] == []
    (egress,) = np_acting["spec"]["egress"]
    assert {p["port"] for p in egress["ports"]} == {443, 6443} and all("ipBlock" in t for t in egress["to"])


def test_prometheus_scrapes_with_the_scrape_token_in_a_config_promtool_accepts(tmp_path: Path) -> None:
    """deploy/prometheus's scrape job (the scrape token from a file), checked by promtool with
    its files in place; the DaemonSet's agent reads the same token from its Secret."""
    import tomllib

    require_real("promtool", install="apt-get install prometheus")
    text = SCRAPE.read_text().replace("/etc/prometheus/", f"{tmp_path}/")
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    for name in ("trainguard-scrape.token", "trainguard-ca.crt"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / RULES.name).write_text(RULES.read_text())
    done = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "credentials_file" in text and "trainguard-scrape.token" in text
    cm = next(d for d in _docs(MANIFEST) if d["kind"] == "ConfigMap")
    agent = tomllib.loads(cm["data"]["agent.toml"])["agent"]
    assert Path(agent["scrape_token_file"]).parent == Path(agent["token_file"]).parent  # the Secret
