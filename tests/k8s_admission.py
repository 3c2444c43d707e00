"""The ValidatingAdmissionPolicy of deploy/kubernetes/, evaluated as the API server evaluates it
(there is no API server here: no kube-apiserver, etcd-with-apiserver, envtest or kwok binary
installs from Debian or PyPI, so this is not a real API server).

The CEL is run by ``cel-expr-python``, Google's CEL runtime (cel-cpp; Kubernetes runs cel-go, the
same language and standard macros). What the API server adds is modelled from its documented
behaviour: a policy applies to a request whose resource and operation its matchConstraints name
and whose matchConditions are all true; every validation must evaluate to true; an evaluation
error counts as a failure under ``failurePolicy: Fail``; a binding with ``Deny`` refuses the
request with the validation's message (HTTP 403 for reason Forbidden).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cel_expr_python import cel

POLICY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "trainguard-remediation-rbac.yaml"
AGENT = "system:serviceaccount:trainguard:trainguard-agent"
NODE_NAME = "authentication.kubernetes.io/node-name"


@dataclass(frozen=True)
class User:
    username: str
    extra: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def agent_on(cls, node: str) -> User:
        """The agent's service-account token, bound to a pod on ``node``."""
        return cls(AGENT, {NODE_NAME: [node]})


class Admission:
    def __init__(self, path: Path = POLICY) -> None:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        (self.policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
        (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
        assert binding["spec"]["policyName"] == self.policy["metadata"]["name"]
        assert binding["spec"]["validationActions"] == ["Deny"]
        env = cel.NewEnv(variables={n: cel.Type.DYN for n in ("request", "object", "oldObject")})
        spec = self.policy["spec"]
        self.conditions = [env.compile(c["expression"]) for c in spec.get("matchConditions", [])]
        self.validations = [(env.compile(v["expression"]), v["message"]) for v in spec["validations"]]

    def matches(self, resource: str, operation: str) -> bool:
        return any(
            resource in r["resources"] and operation in r["operations"] and "" in r["apiGroups"]
            for r in self.policy["spec"]["matchConstraints"]["resourceRules"]
        )

    def review(
        self, user: User, resource: str, operation: str, obj: dict[str, Any], old: dict[str, Any]
    ) -> str | None:
        """None when the request is admitted, else the message it is refused with."""
        if not self.matches(resource, operation):
            return None
        name, _, sub = resource.partition("/")
        data = {
            "request": {
                "operation": operation,
                "resource": {"group": "", "version": "v1", "resource": name},
                "subResource": sub,
                "userInfo": {"username": user.username, "extra": user.extra},
            },
            "object": obj,
            "oldObject": old,
        }
        if not all(_true(c, data) for c in self.conditions):
            return None
        for expression, message in self.validations:
            if not _true(expression, data):
                return message
        return None


def _true(expression: Any, data: dict[str, Any]) -> bool:
    try:
        return expression.eval(data=data).plain_value() is True
    except Exception:  # an evaluation error: failurePolicy Fail
        return False
