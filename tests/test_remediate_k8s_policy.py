"""Each agent may change only its own node (issue 34): the Kubernetes provider, as the agent's
service account on gpu-node-7, against a fake API server that admits every write through the
ValidatingAdmissionPolicy shipped in deploy/kubernetes/ (its CEL run by Google's CEL runtime).
Not a real API server: none installs here (tests/k8s_admission.py says what is modelled)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from real_parts import require_module

kubernetes = require_module("kubernetes", install="pip install 'trainguard[kubernetes]' (make install does)")

from k8s_admission import Admission, User  # noqa: E402
from k8s_fake import FakeApiServer  # noqa: E402
from trainguard.remediate.providers import Status, Target  # noqa: E402
from trainguard.remediate.providers.kubernetes import CONDITION, TAINT_KEY, KubernetesProvider  # noqa: E402

MINE, OTHER, CONTROL = "gpu-node-7", "gpu-node-8", "control-plane-1"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer(MINE, others=(OTHER, CONTROL), admission=Admission(), user=User.agent_on(MINE)) as s:
        yield s


def provider(api: FakeApiServer, tmp_path: Path) -> KubernetesProvider:
    conf = kubernetes.client.Configuration(host=api.url)
    ns = tmp_path / "namespace"
    ns.write_text("trainguard\n")
    return KubernetesProvider(kubernetes.client.ApiClient(conf), host=MINE, namespace_file=ns)


def target(node: str) -> Target:
    return Target(node, 2, "trainguard: xid GPU 2 inc 1", {"finding": {"rule": "xid"}})


def test_an_agent_cordons_its_own_node_and_resumes_it(api: FakeApiServer, tmp_path: Path) -> None:
    p = provider(api, tmp_path)
    assert p.apply("cordon", target(MINE)).status is Status.DONE
    node = api.nodes[MINE]
    assert node["spec"]["unschedulable"] is True
    assert any(t["key"] == TAINT_KEY for t in node["spec"]["taints"])
    assert any(c["type"] == CONDITION and c["status"] == "False" for c in node["status"]["conditions"])
    assert p.apply("resume", Target(MINE)).status is Status.DONE
    assert api.refused == []
    assert {e["metadata"]["namespace"] for e in api.events} == {"trainguard"}  # where its Role allows


@pytest.mark.parametrize("victim", [OTHER, CONTROL])
def test_an_agent_cannot_cordon_another_node(api: FakeApiServer, tmp_path: Path, victim: str) -> None:
    before = {n: dict(api.nodes[n]["spec"]) for n in api.nodes}
    out = provider(api, tmp_path).apply("cordon", target(victim))
    assert out.status is Status.FAILED and "403" in out.detail and not out.retry
    assert api.refused == ["a trainguard agent may change only the node its own pod runs on"]
    assert {n: api.nodes[n]["spec"] for n in api.nodes} == before


def test_an_agent_cannot_set_another_nodes_condition(api: FakeApiServer, tmp_path: Path) -> None:
    p = provider(api, tmp_path)
    cond = {"type": CONDITION, "status": "False", "reason": "x", "message": "forged"}
    with pytest.raises(kubernetes.client.exceptions.ApiException) as err:
        p.api.patch_node_status(OTHER, {"status": {"conditions": [cond]}})
    assert err.value.status == 403
    assert all(c["type"] != CONDITION for c in api.nodes[OTHER]["status"]["conditions"])


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        ({"spec": {"taints": []}}, "only its own taint"),  # removes nvidia.com/gpu's taint
        ({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}, "labels or annotations"),
        ({"spec": {"providerID": "aws:///evil"}}, "only spec.unschedulable"),
    ],
    ids=["others-taint", "label", "provider-id"],
)
def test_on_its_own_node_an_agent_may_change_only_the_cordon_its_taint_and_its_condition(
    api: FakeApiServer, tmp_path: Path, patch: dict, why: str
) -> None:
    p = provider(api, tmp_path)
    with pytest.raises(kubernetes.client.exceptions.ApiException) as err:
        p.api.patch_node(MINE, patch)
    assert err.value.status == 403 and why in api.refused[-1]


def test_the_ready_condition_is_not_the_agents_to_change(api: FakeApiServer, tmp_path: Path) -> None:
    p = provider(api, tmp_path)
    with pytest.raises(kubernetes.client.exceptions.ApiException):
        p.api.patch_node_status(MINE, {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert "its own node condition" in api.refused[-1]


def test_a_token_without_its_pods_node_is_refused_and_others_are_not_the_policys_business(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.user = User("system:serviceaccount:trainguard:trainguard-agent")  # a token not bound to a pod
    assert provider(api, tmp_path).apply("cordon", target(MINE)).status is Status.FAILED
    api.user = User("system:node:gpu-node-8")  # the kubelet, an admin...: other policies' concern
    assert provider(api, tmp_path).apply("cordon", target(OTHER)).status is Status.DONE


def test_the_policy_check_sees_a_policy_that_lets_everything_through(tmp_path: Path) -> None:
    from k8s_admission import POLICY

    loose = tmp_path / "rbac.yaml"
    loose.write_text(POLICY.read_text().replace("== [oldObject.metadata.name]", "!= []"))
    old = {"metadata": {"name": OTHER}, "spec": {}, "status": {}}
    new = {"metadata": {"name": OTHER}, "spec": {"unschedulable": True}, "status": {}}
    assert Admission(loose).review(User.agent_on(MINE), "nodes", "UPDATE", new, old) is None
    assert Admission().review(User.agent_on(MINE), "nodes", "UPDATE", new, old) is not None


def test_the_rbac_and_admission_policy_validate_against_the_kubernetes_schema() -> None:
    import yaml

    from k8s_admission import POLICY

    kv = require_module(
        "kubernetes_validate", install="pip install 'trainguard[integration]' (make install does)"
    )
    docs = [d for d in yaml.safe_load_all(POLICY.read_text()) if d]
    assert {d["kind"] for d in docs} >= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for doc in docs:
        kv.validate(doc, "1.30.0", strict=True)
