"""Kubernetes through the official ``kubernetes`` client: cordon, taint, an Event, a node condition.

    cordon               spec.unschedulable = true, taint trainguard.io/gpu-unhealthy=<rule>:NoSchedule,
                         condition TrainguardGpuHealthy=False, a Warning Event on the node
    hardware_inspection  the same with the taint value "hardware-inspection"
    reboot_node          the same with "reboot-required" (a node reboot is the cluster's own tool's job)
    resume               the taint removed, schedulable again, the condition True

Only what ``deploy/kubernetes/trainguard-remediation-rbac.yaml`` grants: nodes get+patch,
nodes/status patch, events create in the pod's own namespace; its admission policy refuses a write
to any node but the pod's own (a 403, an honest failure). Each change reads the node first (idempotent) and patches
with its ``resourceVersion``, so a node changed meanwhile is a 409 and is read again, never
overwritten. A timeout is ambiguous: the caller verifies by reading the node.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError
from trainguard.remediate.providers import Outcome, Status, Target

try:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException
except ImportError:
    raise ImportError(
        "the Kubernetes provider needs the kubernetes client: pip install 'trainguard[kubernetes]'"
    ) from None

import urllib3

__all__ = ["CONDITION", "TAINT_KEY", "KubernetesProvider"]

TAINT_KEY = "trainguard.io/gpu-unhealthy"
CONDITION = "TrainguardGpuHealthy"
_VALUE = {"hardware_inspection": "hardware-inspection", "reboot_node": "reboot-required"}
POD_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubernetesProvider:
    name = "kubernetes"

    def __init__(
        self,
        api_client: Any = None,
        *,
        namespace: str = "",
        host: str = "",
        namespace_file: Path = POD_NAMESPACE,
    ) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient``; None loads the in-cluster config.
        ``namespace`` of the Events: "" = the pod's own (where its Role lets it create them)."""
        if api_client is None:
            from kubernetes import config

            try:
                config.load_incluster_config()
            except config.ConfigException as exc:
                raise ConfigError(
                    f"not inside a Kubernetes pod ({exc}): run the agent from the DaemonSet in deploy/kubernetes/, "
                    'or set provider = "slurm" or "none"'
                ) from None
            api_client = k8s.ApiClient()
        self.api = k8s.CoreV1Api(api_client)
        self.namespace, self.host = namespace or _pod_namespace(namespace_file), host

    def apply(self, remedy: str, target: Target) -> Outcome:
        if remedy not in ("cordon", "drain", "hardware_inspection", "reboot_node", "resume"):
            return Outcome(Status.FAILED, f"kubernetes cannot {remedy}")
        try:
            node: Any = self.api.read_node(target.node)
            taints = list(node.spec.taints or [])
            ours = [t for t in taints if t.key == TAINT_KEY]
            others = [t for t in taints if t.key != TAINT_KEY]
            if remedy == "resume":
                if not ours and not node.spec.unschedulable:
                    return Outcome(Status.ALREADY, "schedulable, no trainguard taint")
                spec: dict[str, Any] = {"unschedulable": False, "taints": [_taint_dict(t) for t in others]}
                self._patch(target.node, node, spec, healthy=True, message="resumed by trainguard")
                return Outcome(Status.DONE, f"{target.node} uncordoned")
            value = taint_value(remedy, target)
            if node.spec.unschedulable and any(t.value == value for t in ours):
                return Outcome(Status.ALREADY, f"already cordoned ({TAINT_KEY}={value})")
            taint = {"key": TAINT_KEY, "value": value, "effect": "NoSchedule"}
            spec = {"unschedulable": True, "taints": [*(_taint_dict(t) for t in others), taint]}
            self._patch(target.node, node, spec, healthy=False, message=target.reason)
        except ApiException as exc:
            retry = exc.status in (409, 429) or (exc.status or 0) >= 500
            return Outcome(Status.FAILED, f"Kubernetes API {exc.status} {exc.reason}", retry=retry)
        except (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError) as exc:
            return Outcome(Status.AMBIGUOUS, f"Kubernetes API: {exc}")
        except urllib3.exceptions.MaxRetryError as exc:
            if isinstance(exc.reason, urllib3.exceptions.NewConnectionError):
                return Outcome(Status.FAILED, f"Kubernetes API unreachable: {exc.reason}", retry=True)
            return Outcome(Status.AMBIGUOUS, f"Kubernetes API: {exc.reason}")
        return Outcome(Status.DONE, f"{target.node} cordoned, tainted {TAINT_KEY}={value}:NoSchedule")

    def _patch(self, name: str, node: Any, spec: dict[str, Any], *, healthy: bool, message: str) -> None:
        when = dt.datetime.now(dt.UTC).replace(microsecond=0)
        now = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        rv = node.metadata.resource_version
        self.api.patch_node(name, {"metadata": {"resourceVersion": rv}, "spec": spec})
        cond = {
            "type": CONDITION,
            "status": "True" if healthy else "False",
            "reason": "TrainguardHealthy" if healthy else "TrainguardRemediation",
            "message": message[:1024],
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.api.patch_node_status(name, {"status": {"conditions": [cond]}})
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{name}.trainguard."),
            involved_object=k8s.V1ObjectReference(kind="Node", name=name, uid=node.metadata.uid),
            reason="TrainguardResumed" if healthy else "TrainguardCordoned",
            message=message[:1024],
            type="Normal" if healthy else "Warning",
            source=k8s.V1EventSource(component="trainguard-agent", host=self.host or name),
            first_timestamp=when,
            last_timestamp=when,
            count=1,
        )
        self.api.create_namespaced_event(self.namespace, event)

    def verify(self, remedy: str, target: Target) -> bool | None:
        try:
            node: Any = self.api.read_node(target.node)
        except (ApiException, urllib3.exceptions.HTTPError):
            return None
        tainted = any(t.key == TAINT_KEY for t in node.spec.taints or [])
        if remedy == "resume":
            return not tainted and not node.spec.unschedulable
        return bool(node.spec.unschedulable) and tainted


def taint_value(remedy: str, target: Target) -> str:
    """A label-value-safe word: the remedy's own, else the finding's rule (``xid``, ``ecc_dbe``)."""
    if remedy in _VALUE:
        return _VALUE[remedy]
    finding = (target.payload or {}).get("finding")
    rule = finding.get("rule") if isinstance(finding, dict) else None
    word = re.sub(r"[^A-Za-z0-9_.-]", "-", str(rule or "unhealthy"))[:63].strip("-_.")
    return word or "unhealthy"


def _pod_namespace(path: Path) -> str:
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"


def _taint_dict(t: Any) -> dict[str, Any]:
    return {k: v for k, v in {"key": t.key, "value": t.value, "effect": t.effect}.items() if v is not None}
