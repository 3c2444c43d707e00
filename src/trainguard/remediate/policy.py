"""The remediation policy: which remedy a finding gets on which node (pure, loaded from TOML).

    findings  ->  policy.choose  ->  breaker.admit  ->  executor (the one place that acts)

A policy file maps a finding to a remedy, with defaults and per node-group / GPU-model
overrides. **Dry run is the default**: nothing is done unless ``enforce = true`` (or the agent's
``--enforce``); every decision is still recorded. ::

    [remediation]
    enforce = false                # dry run: decide and record, never act
    provider = "slurm"             # "slurm" | "kubernetes" | "none": who carries out drain/cordon
    [remediation.actions]          # finding rule, or the finding's suggested action -> remedy
    reset_gpu = "reset_gpu"
    unexpected_gpu_process = "webhook"
    predicted_failure = "drain"    # act on the failure predictor's forecasts (default: none)
    [[remediation.group]]          # first matching group wins; its actions override the defaults
    name = "h100-pod-a"
    nodes = ["gpu-a*"]             # shell globs over the node name
    gpu_model = "H100"             # a substring of the GPU's model name
    actions = { xid = "drain" }

    >>> from trainguard.actions import Advice
    >>> from trainguard.records import Finding, Health
    >>> p = Policy()
    >>> d = choose(p, Finding("xid", Health.FAILED, Advice.RESET_GPU, "Xid 48", gpu=2), "n1", "H100")
    >>> d.remedy.value, d.enforce
    ('reset_gpu', False)

A kernel-log line is a claim anyone who can write to the log may make (a user's message in
syslog reads like the driver's), so a finding from the log takes a node out only when NVML
corroborates it: a finding about the same GPU from NVML itself (lost, ECC, remapping...) in the
same batch. Alone, it is told to a person (``webhook``) instead; the NVML finding, when the GPU
really is broken, gets its own remedy. ``corroborate = false`` turns this off.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from trainguard.actions import Advice, NodeAction
from trainguard.detect.detector import PREDICTED_FAILURE
from trainguard.errors import ConfigError
from trainguard.records import Finding, Health

__all__ = [
    "DEFAULT_ACTIONS",
    "BreakerLimits",
    "EscalationLimits",
    "NodeDecision",
    "NodeGroup",
    "Policy",
    "choose",
    "corroborate",
    "load_policy",
    "parse_policy",
    "strongest",
]


# A finding's suggested action -> the remedy when the policy says nothing about it.
DEFAULT_ACTIONS: dict[str, NodeAction] = {
    Advice.RESET_GPU.value: NodeAction.RESET_GPU,
    Advice.REBOOT_NODE.value: NodeAction.REBOOT_NODE,
    Advice.DRAIN.value: NodeAction.DRAIN,
    Advice.CONTACT_SUPPORT.value: NodeAction.HARDWARE_INSPECTION,
}
# Rules whose remedy is not their suggested action's: a stranger's process is news, not a broken GPU;
# a forecast of a failure is acted on only where the policy names it (its own rule, not its action).
DEFAULT_RULES: dict[str, NodeAction] = {
    "unexpected_gpu_process": NodeAction.WEBHOOK,
    PREDICTED_FAILURE: NodeAction.NONE,
}
# What a forecast may get: it drains a node ahead of the next job or tells someone, and never
# resets or reboots by itself (nothing has failed yet).
PREDICTED_REMEDIES = (NodeAction.NONE, NodeAction.WEBHOOK, NodeAction.DRAIN, NodeAction.CORDON)
PROVIDERS = ("slurm", "kubernetes", "none")
# Findings read from the kernel log (detect/xid_rules.py): the log's word, not the GPU's state.
LOG_RULES = frozenset(
    {"xid", "sxid", "gpu_lost_log", "xid_fatal_repeat", "xid_app", "xid_app_repeat", "xid_recovery_action"}
)


@dataclass(frozen=True, slots=True)
class BreakerLimits:
    max_nodes: int = 4  # fleet: at most this many nodes actioned per window
    max_fraction: float = 0.05  # fleet: ... and at most this fraction of the fleet
    fleet_size: int = 0  # nodes in the fleet, for max_fraction (0: unknown, max_nodes alone)
    window_s: float = 3600.0  # sliding window of both fleet limits
    job_window_s: float = 3600.0  # per job: at most its spare nodes actioned per window
    job_spares: int = 0  # nodes one training job may lose per job window; 0: no job limit


@dataclass(frozen=True, slots=True)
class EscalationLimits:
    max_remediations: int = 3  # a node or GPU remediated this often in the window -> inspection
    window_s: float = 7 * 86400.0
    per_xid: dict[int, int] = field(default_factory=dict)  # Xid -> its own max (e.g. {79: 1})


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """A `[[remediation.group]]` entry: the nodes (and GPU model) its actions apply to."""

    name: str
    nodes: tuple[str, ...] = ()  # globs; empty: every node
    gpu_model: str | None = None  # substring of the GPU model; None: any
    actions: dict[str, NodeAction] = field(default_factory=dict)
    enforce: bool | None = None  # None: the policy's

    def matches(self, node: str, gpu_model: str | None) -> bool:
        if self.nodes and not any(fnmatch.fnmatchcase(node, g) for g in self.nodes):
            return False
        return self.gpu_model is None or (gpu_model is not None and self.gpu_model in gpu_model)


@dataclass(frozen=True, slots=True)
class Policy:
    enforce: bool = False  # dry run unless true
    provider: str = "slurm"  # who carries out drain / cordon / reboot
    actions: dict[str, NodeAction] = field(default_factory=dict)
    groups: tuple[NodeGroup, ...] = ()
    breaker: BreakerLimits = BreakerLimits()
    breaker_file: str = ""  # one file for the fleet (a shared path); "" = <state_dir>/breaker.json
    escalation: EscalationLimits = EscalationLimits()
    webhook_url: str | None = None
    webhook_secret_file: str | None = None
    racks: dict[str, str] = field(default_factory=dict)  # node -> rack (a node label)
    intrusion: bool = True  # look for GPU processes that belong to no job
    allowed_commands: tuple[str, ...] = ()  # command prefixes that may use a GPU outside a job
    allowed_users: tuple[str, ...] = ()  # users who may
    corroborate: bool = True  # a kernel-log finding takes a node out only with NVML's evidence


@dataclass(frozen=True, slots=True)
class NodeDecision:
    finding: Finding
    remedy: NodeAction
    enforce: bool
    group: str | None
    why: str  # which policy entry chose the remedy


def choose(policy: Policy, finding: Finding, node: str, gpu_model: str | None = None) -> NodeDecision:
    """The remedy for ``finding`` on ``node``: the first matching group's entry, else the policy's,
    else the built-in default for the finding's suggested action. Only degraded and failed findings
    are acted on; ``drain`` and ``cordon`` follow the provider (a Slurm site never cordons)."""
    group = next((g for g in policy.groups if g.matches(node, gpu_model)), None)
    enforce = policy.enforce if group is None or group.enforce is None else group.enforce
    if finding.health not in (Health.DEGRADED, Health.FAILED):
        return NodeDecision(finding, NodeAction.NONE, enforce, None, f"health {finding.health.value}")
    remedy, why = None, "default"
    keys = (finding.rule,) if finding.rule == PREDICTED_FAILURE else (finding.rule, finding.action.value)
    for table, where in ((group.actions if group else {}, f"group {group.name}" if group else ""),
                         (policy.actions, "policy")):  # fmt: skip
        for k in keys:
            if k in table:
                remedy, why = table[k], f"{where} actions.{k}"
                break
        if remedy is not None:
            break
    if remedy is None:
        remedy = DEFAULT_RULES.get(finding.rule) or DEFAULT_ACTIONS.get(finding.action.value, NodeAction.NONE)
    if remedy in (NodeAction.DRAIN, NodeAction.CORDON):
        remedy = NodeAction.CORDON if policy.provider == "kubernetes" else NodeAction.DRAIN
    return NodeDecision(finding, remedy, enforce, group.name if group else None, why)


def corroborate(decisions: list[NodeDecision], findings: list[Finding]) -> list[NodeDecision]:
    """``decisions`` with each kernel-log finding that would take the node out, and that no NVML
    finding of ``findings`` backs (the same GPU; for a node-scoped one, any GPU), turned into a
    webhook: a forged log line must not drain a healthy node (see the module docstring)."""
    backed = {
        f.gpu for f in findings if f.rule not in LOG_RULES and f.health in (Health.DEGRADED, Health.FAILED)
    }
    out = []
    for d in decisions:
        f = d.finding
        if (
            d.remedy.takes_node_out
            and f.rule in LOG_RULES
            and not (f.gpu in backed or (f.gpu is None and backed))
        ):
            where = f"GPU {f.gpu}" if f.gpu is not None else "every GPU"
            why = f"{d.why}; {d.remedy.value} not taken on the kernel log's word alone: NVML shows {where} healthy"
            d = replace(d, remedy=NodeAction.WEBHOOK, why=why)
        out.append(d)
    return out


def strongest(decisions: list[NodeDecision]) -> list[NodeDecision]:
    """One decision per GPU (and per node-scoped finding): several findings about one GPU in one
    tick (an Xid 79 line and NVML losing the GPU) are one fault and get one remedy, the strongest."""
    order = list(NodeAction)
    by_gpu: dict[int, NodeDecision] = {}
    out: list[NodeDecision] = []
    for d in decisions:
        g = d.finding.gpu
        if g is None:
            if all(o.remedy is not d.remedy for o in out if o.finding.gpu is None):
                out.append(d)
        elif g not in by_gpu or order.index(d.remedy) > order.index(by_gpu[g].remedy):
            by_gpu[g] = d
    return [*by_gpu.values(), *out]


def load_policy(path: str | Path) -> Policy:
    """Read a policy file; a ConfigError names the file, the entry and what would be accepted."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"policy file {p} does not exist (see docs/remediation.md for an example)"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"policy file {p} cannot be read: {exc}") from None
    return parse_policy(data, where=str(p))


def parse_policy(data: dict[str, Any], where: str = "policy") -> Policy:
    table = data.get("remediation", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [remediation] must be a table")
    known = {
        "enforce",
        "provider",
        "actions",
        "group",
        "breaker",
        "escalation",
        "webhook",
        "racks",
        "intrusion",
        "breaker_file",
        "corroborate",
    }
    _no_unknown(table, known, f"{where}: [remediation]")
    provider = table.get("provider", "slurm")
    if provider not in PROVIDERS:
        raise ConfigError(f"{where}: provider = {provider!r}: choose one of {', '.join(PROVIDERS)}")
    groups = []
    for i, g in enumerate(table.get("group", [])):
        here = f"{where}: [[remediation.group]] #{i + 1}"
        _no_unknown(g, {"name", "nodes", "gpu_model", "actions", "enforce"}, here)
        nodes = g.get("nodes", [])
        if isinstance(nodes, str):
            nodes = [nodes]
        groups.append(
            NodeGroup(
                name=str(g.get("name", f"group{i + 1}")),
                nodes=tuple(str(n) for n in nodes),
                gpu_model=g.get("gpu_model"),
                actions=_actions(g.get("actions", {}), here),
                enforce=_bool(g["enforce"], f"{here} enforce") if "enforce" in g else None,
            )
        )
    webhook = table.get("webhook", {})
    _no_unknown(webhook, {"url", "secret_file"}, f"{where}: [remediation.webhook]")
    intrusion = table.get("intrusion", {})
    _no_unknown(
        intrusion, {"enabled", "allowed_commands", "allowed_users"}, f"{where}: [remediation.intrusion]"
    )
    esc = dict(table.get("escalation", {}))
    per_xid = {int(k): int(v) for k, v in esc.pop("per_xid", {}).items()}
    return Policy(
        enforce=_bool(table.get("enforce", False), f"{where}: enforce"),
        provider=provider,
        actions=_actions(table.get("actions", {}), f"{where}: [remediation.actions]"),
        groups=tuple(groups),
        breaker_file=str(table.get("breaker_file", "")),
        breaker=_section(BreakerLimits, table.get("breaker", {}), f"{where}: [remediation.breaker]"),
        escalation=EscalationLimits(
            **_section(EscalationLimits, esc, f"{where}: [remediation.escalation]", as_dict=True),
            per_xid=per_xid,
        ),
        webhook_url=webhook.get("url"),
        webhook_secret_file=webhook.get("secret_file"),
        racks={str(k): str(v) for k, v in table.get("racks", {}).items()},
        intrusion=_bool(intrusion.get("enabled", True), f"{where}: [remediation.intrusion] enabled"),
        allowed_commands=tuple(str(c) for c in intrusion.get("allowed_commands", [])),
        allowed_users=tuple(str(u) for u in intrusion.get("allowed_users", [])),
        corroborate=_bool(table.get("corroborate", True), f"{where}: corroborate"),
    )


def _actions(raw: Any, where: str) -> dict[str, NodeAction]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: actions must be a table of finding = remedy")
    out = {}
    for k, v in raw.items():
        try:
            out[str(k)] = NodeAction(v)
        except ValueError:
            raise ConfigError(
                f"{where}: {k} = {v!r} is not a remedy: choose one of {', '.join(r.value for r in NodeAction)}"
            ) from None
        if k == PREDICTED_FAILURE and out[k] not in PREDICTED_REMEDIES:
            raise ConfigError(
                f"{where}: {k} = {v!r}: a predicted failure has not happened yet: it may drain (or "
                f"cordon) the node ahead of the next job or tell someone, never reset or reboot: "
                f"choose one of {', '.join(r.value for r in PREDICTED_REMEDIES)}"
            )
    return out


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where} must be true or false, not {v!r}")
    return v


def _no_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}: known are {', '.join(sorted(known))}"
        )


def _section(cls: Any, raw: dict[str, Any], where: str, as_dict: bool = False) -> Any:
    names = {f.name: f for f in fields(cls) if f.name != "per_xid"}
    _no_unknown(raw, set(names), where)
    values: dict[str, Any] = {}
    for k, v in raw.items():
        kind: Any = type(names[k].default)
        if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not isinstance(v, int)):
            raise ConfigError(f"{where}: {k} must be a {kind.__name__}, not {v!r}")
        if v < 0:
            raise ConfigError(f"{where}: {k} must not be negative ({v})")
        values[k] = kind(v)
    return values if as_dict else cls(**values)
