"""The Kubernetes provider, through the official client, against a fake API server that records
requests; and the RBAC in deploy/ grants exactly the verbs those requests need."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from real_parts import require_module

kubernetes = require_module("kubernetes", install="pip install 'trainguard[kubernetes]' (make install does)")
yaml = pytest.importorskip("yaml")

from k8s_fake import FakeApiServer  # noqa: E402
from trainguard.actions import Advice  # noqa: E402
from trainguard.incidents.store import IncidentStore  # noqa: E402
from trainguard.records import Finding, Health  # noqa: E402
from trainguard.remediate import Remediator, parse_policy  # noqa: E402
from trainguard.remediate.providers import Status, Target  # noqa: E402
from trainguard.remediate.providers.kubernetes import CONDITION, TAINT_KEY, KubernetesProvider  # noqa: E402

RBAC = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "trainguard-remediation-rbac.yaml"
XID = Finding("xid", Health.FAILED, Advice.RESET_GPU, "Xid 48: double bit ECC error", gpu=2)
DBE = Finding("ecc_dbe", Health.FAILED, Advice.RESET_GPU, "1 uncorrectable ECC error", gpu=2)  # NVML's view


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer("gpu-node-7") as server:
        yield server


def provider(api: FakeApiServer) -> KubernetesProvider:
    conf = kubernetes.client.Configuration(host=api.url)
    return KubernetesProvider(kubernetes.client.ApiClient(conf), host="gpu-node-7")


def test_cordon_taints_adds_a_condition_and_an_event(api: FakeApiServer, tmp_path: Path) -> None:
    policy = parse_policy(
        {
            "remediation": {
                "enforce": True,
                "provider": "kubernetes",
                "actions": {"xid": "drain", "ecc_dbe": "drain"},
            }
        }
    )
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(policy, "gpu-node-7", store, state_dir=tmp_path,
                            providers={"node": provider(api)}).act([XID, DBE])  # fmt: skip
    assert rec.action == "cordon" and rec.resolved, rec
    spec = api.node["spec"]
    assert spec["unschedulable"] is True
    assert {"key": TAINT_KEY, "value": "xid", "effect": "NoSchedule"} in spec["taints"]
    assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in spec["taints"]  # others' taints kept
    cond = next(c for c in api.node["status"]["conditions"] if c["type"] == CONDITION)
    assert cond["status"] == "False" and f"inc {rec.id}" in cond["message"]
    (event,) = api.events
    assert event["involvedObject"] == {"kind": "Node", "name": "gpu-node-7", "uid": "0b1c-uid"}
    assert event["type"] == "Warning" and event["source"]["component"] == "trainguard-agent"


def test_cordon_is_idempotent_and_resume_undoes_it(api: FakeApiServer) -> None:
    p = provider(api)
    t = Target("gpu-node-7", 2, "trainguard: xid GPU 2 inc 1", {"finding": {"rule": "xid"}})
    assert p.apply("cordon", t).status is Status.DONE
    writes = sum(1 for m, _, _ in api.requests if m != "GET")
    assert p.apply("cordon", t).status is Status.ALREADY
    assert sum(1 for m, _, _ in api.requests if m != "GET") == writes  # nothing written again
    assert p.apply("resume", Target("gpu-node-7")).status is Status.DONE
    assert api.node["spec"]["unschedulable"] is False
    assert api.node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert p.verify("resume", Target("gpu-node-7")) is True


def test_a_conflicting_write_is_read_again_not_overwritten(api: FakeApiServer, tmp_path: Path) -> None:
    api.conflicts = 1
    policy = parse_policy(
        {
            "remediation": {
                "enforce": True,
                "provider": "kubernetes",
                "actions": {"xid": "drain", "ecc_dbe": "drain"},
            }
        }
    )
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(policy, "gpu-node-7", store, state_dir=tmp_path, providers={"node": provider(api)},
                            sleep=lambda s: None).act([XID, DBE])  # fmt: skip
    assert rec.resolved and "after 2 call(s)" in rec.evidence[-1]
    assert [m for m, p, _ in api.requests if p.endswith("gpu-node-7")].count("GET") == 2


def test_unknown_node_is_not_retried(api: FakeApiServer) -> None:
    out = provider(api).apply("cordon", Target("no-such-node"))
    assert out.status is Status.FAILED and not out.retry and "404" in out.detail


def test_rbac_grants_exactly_the_verbs_the_provider_uses(api: FakeApiServer) -> None:
    p = provider(api)
    t = Target("gpu-node-7", 2, "trainguard: xid", {"finding": {"rule": "xid"}})
    for remedy in ("cordon", "hardware_inspection", "reboot_node", "resume"):
        assert p.apply(remedy, t).ok
    p.verify("cordon", t)
    used = {_rbac_of(m, path) for m, path, _ in api.requests}
    assert used == granted(RBAC)


def test_the_rbac_check_notices_an_extra_verb(tmp_path: Path) -> None:
    broader = tmp_path / "rbac.yaml"
    broader.write_text(
        RBAC.read_text().replace('verbs: ["get", "patch"]', 'verbs: ["get", "patch", "delete"]')
    )
    assert ("", "nodes", "delete") in granted(broader)
    assert granted(broader) != granted(RBAC)


def granted(path: Path) -> set[tuple[str, str, str]]:
    """What the agent's ClusterRole grants, and its Role in its own namespace (events)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    assert [r["kind"] for r in roles] == ["ClusterRole", "Role"]
    assert roles[1]["metadata"]["namespace"] == "trainguard"
    return {
        (g, r, v)
        for role in roles
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def _rbac_of(method: str, path: str) -> tuple[str, str, str]:
    verb = {"GET": "get", "PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}[method]
    parts = path.strip("/").split("/")  # api/v1/nodes/N[/status] or api/v1/namespaces/NS/events
    if parts[2] == "namespaces":
        return ("", parts[4], verb)
    return ("", "/".join([parts[2], *parts[4:]]), verb)


def test_outside_a_pod_without_a_client_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.errors import ConfigError

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="not inside a Kubernetes pod"):
        KubernetesProvider()
