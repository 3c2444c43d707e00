"""The one place remediation acts: decide (policy, escalation, breaker: pure), then call providers.

    findings -> choose -> corroborate -> inspection? -> breaker.admit -> provider (retry) -> incident record
                                                                        -> fleet store (fleetlog.py)

Every remedy other than ``none`` becomes an incident record whatever happens to it: ``dry_run``
(the default: the policy did not enforce), ``held`` (a breaker), ``done``/``already``,
``failed`` or ``ambiguous``. The record is written before the provider is called, so its id can
go into the Slurm reason, and updated with the result after. With ``fleet=`` (a `FleetWriter`)
each action is also a ``remediation_actions`` row and each breaker trip or held action a
``breaker_events`` row, with the node's identity, for ``trainguard fleet breaker``::

    >>> import tempfile
    >>> from trainguard.incidents.store import IncidentStore
    >>> from trainguard.actions import Advice
    >>> from trainguard.records import Finding, Health
    >>> d = tempfile.mkdtemp()
    >>> r = Remediator(Policy(), "n1", IncidentStore(f"{d}/tg.db"), state_dir=d)
    >>> [i.resolution for i in r.act([Finding("ecc_dbe", Health.FAILED, Advice.RESET_GPU, "1 DBE", gpu=2)])]
    ['dry_run: would reset_gpu']
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.actions import NodeAction
from trainguard.detect.verdict import finding_to_dict
from trainguard.incidents import Incident
from trainguard.incidents.correlate import root_cause_for
from trainguard.records import Finding
from trainguard.remediate import breaker as brk
from trainguard.remediate import escalation as esc
from trainguard.remediate import fleetlog
from trainguard.remediate.policy import NodeDecision, Policy, choose, corroborate, strongest
from trainguard.remediate.providers import Outcome, Provider, Status, Target, with_retry

log = logging.getLogger(__name__)

__all__ = ["JobInfo", "Remediator", "provider_for"]

DETECTED_BY = "remediation"


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The training job on a node, for the job breaker: it may lose ``spares`` nodes per window."""

    job: str
    spares: int


def provider_for(remedy: NodeAction) -> str:
    """Which provider slot carries a remedy: ``node`` (Slurm or Kubernetes), ``gpu`` or ``webhook``."""
    if remedy is NodeAction.RESET_GPU:
        return "gpu"
    if remedy is NodeAction.WEBHOOK:
        return "webhook"
    return "node"


class Remediator:
    """Carries out a policy for one node. ``providers``: ``{"node": ..., "gpu": ..., "webhook": ...}``;
    a slot left empty makes its remedies fail with a clear result (never silently pass)."""

    def __init__(
        self,
        policy: Policy,
        node: str,
        store: Any,
        *,
        state_dir: str | Path,
        providers: dict[str, Provider] | None = None,
        breaker_path: str | Path | None = None,
        enforce: bool | None = None,
        fleet_size: int | None = None,
        job: Callable[[], JobInfo | None] = lambda: None,
        gpu_model: str | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        backoff_s: float = 1.0,
        on_reset: Callable[[int], None] | None = None,
        record_dry_run: bool = True,
        fleet: Any = None,
    ) -> None:
        self.policy, self.node, self.store = policy, node, store
        self.providers = providers or {}
        self.breaker = brk.BreakerFile(
            breaker_path or policy.breaker_file or Path(state_dir) / "breaker.json"
        )
        self.escalation = esc.EscalationFile(Path(state_dir) / "escalation.json")
        self.enforce, self.job, self.gpu_model = enforce, job, gpu_model
        self.fleet_size = policy.breaker.fleet_size if fleet_size is None else fleet_size
        self.clock, self.sleep, self.backoff_s = clock, sleep, backoff_s
        self.on_reset = on_reset  # told which GPU was reset (the agent forgets its old Xids)
        self.actor = f"trainguard-agent@{node}"
        # False: dry-run decisions are returned (and counted by the caller) but not stored; the
        # agent's out-of-the-box default, so an unconfigured agent's store holds only detections.
        self.record_dry_run = record_dry_run
        self.fleet = fleet  # a FleetWriter (or None): actions and breaker events into the fleet store

    # -- the act step ---------------------------------------------------------------------------

    def act(self, findings: Iterable[Finding]) -> list[Incident]:
        """Decide and (when enforced) carry out a remedy for each new finding; the records made."""
        decisions = []
        findings = list(findings)
        for f in findings:
            d = choose(self.policy, f, self.node, self.gpu_model)
            if self.enforce is not None:
                d = replace(d, enforce=self.enforce or d.enforce)
            if d.remedy is not NodeAction.NONE:
                decisions.append(d)
        if self.policy.corroborate:
            decisions = corroborate(decisions, findings)
        out: list[Incident] = []
        for d in strongest(decisions):
            out.extend(self._one(d))
        return out

    def _one(self, d: NodeDecision) -> list[Incident]:
        f, now = d.finding, self.clock()
        xid = esc.xid_of(f.reason)
        state = self.escalation.load()
        if d.remedy.takes_node_out:
            why = esc.in_inspection(state, self.node, f.gpu)
            if why is not None:  # already out for a person to look at: nothing more to do
                log.info("%s is in hardware inspection (%s): %s not repeated", self.node, why, d.remedy.value)
                return []
            if esc.needs_inspection(state, self.policy.escalation, self.node, f.gpu, xid, now):
                d = replace(d, remedy=NodeAction.HARDWARE_INSPECTION, why=f"escalated from {d.remedy.value}: "
                            f"remediated {self.policy.escalation.max_remediations}+ times in the window")  # fmt: skip
        if not d.enforce:
            _, (ok, why, _) = self._admit(d, save=False)
            note = "" if ok or not d.remedy.takes_node_out else f" (the breaker would hold it: {why})"
            return [self._record(d, f"dry_run: would {d.remedy.value}{note}", now)]
        return self._enforce(d, xid, now)

    def _enforce(self, d: NodeDecision, xid: int | None, now: float) -> list[Incident]:
        f = d.finding
        racks: list[Incident] = []
        if d.remedy.takes_node_out:
            before, (ok, why, after) = self._admit(d, save=True)
            racks = self._rack_incident(now)
            if not ok:
                where = f" GPU {f.gpu}" if f.gpu is not None else ""
                fleetlog.admission_events(self.fleet, before, after, ok, why, source=self.actor, time=now,
                                          what=f"{d.remedy.value} {self.node}{where}")  # fmt: skip
                held = self._record(d, f"held: {why}", now)
                if "tripped" in why:  # the moment a breaker opens: tell a person (best effort)
                    self._call(NodeAction.WEBHOOK, f, held)
                return [*racks, held]
        rec = self._record(d, "in_progress", now)
        outcome, tries = self._call(d.remedy, f, rec)
        records = [*racks, self._finish(rec, outcome, tries)]
        if d.remedy.takes_node_out and outcome.ok:
            self._remember(d, xid, now)
        if d.remedy is NodeAction.RESET_GPU and not outcome.ok:  # a GPU that won't reset: ask for a reboot
            reboot = replace(d, remedy=NodeAction.REBOOT_NODE, why=f"reset_gpu failed: {outcome.detail}")
            records += self._enforce(reboot, xid, self.clock())  # through the breaker like any other
        if d.remedy is NodeAction.RESET_GPU and outcome.ok and f.gpu is not None and self.on_reset:
            self.on_reset(f.gpu)
        return records

    def _admit(
        self, d: NodeDecision, save: bool
    ) -> tuple[brk.BreakerState, tuple[bool, str, brk.BreakerState]]:
        """(the state before, (allowed, why, the state after))."""
        info = self.job()
        job, spares = (info.job, info.spares) if info else (None, None)
        limits, now = self.policy.breaker, self.clock()
        if not save:
            before = self.breaker.load()
            return before, brk.admit(before, limits, self.node, job, now, self.fleet_size, spares)
        with self.breaker.update() as box:
            before = box[0]
            ok, why, box[0] = brk.admit(box[0], limits, self.node, job, now, self.fleet_size, spares)
            return before, (ok, why, box[0])

    def _rack_incident(self, now: float) -> list[Incident]:
        """One incident for a rack with half its nodes bad (a switch, a PDU, cooling), recorded by the
        first agent that sees it (the breaker file is shared)."""
        if not self.policy.racks:
            return []
        with self.breaker.update() as box:
            found = brk.rack_to_report(
                box[0], self.policy.racks, self.node, now, self.policy.breaker.window_s
            )
            if found is None:
                return []
            rack, hit, box[0] = found
        size = sum(1 for r in self.policy.racks.values() if r == rack)
        inc = Incident(
            job=f"rack:{rack}",
            time=now,
            action=NodeAction.HARDWARE_INSPECTION.value,
            summary=f"rack {rack}: {len(hit)} of its {size} nodes bad ({', '.join(hit)}): inspect what they share",
            evidence=tuple(f"bad node {n}" for n in hit),
            node=None,
            detected_by=DETECTED_BY,
            resolution="recorded",
        )
        return [self.store.add(inc)]

    def _remember(self, d: NodeDecision, xid: int | None, now: float) -> None:
        with self.escalation.update() as box:
            box[0] = esc.remember(box[0], self.node, d.finding.gpu, d.remedy.value, now, xid)
            if d.remedy is NodeAction.HARDWARE_INSPECTION:
                gpu = None if d.finding.gpu is None else d.finding.gpu
                box[0] = replace(box[0], inspection=(*box[0].inspection, (self.node, gpu, d.finding.reason)))

    def _call(self, remedy: NodeAction, f: Finding, rec: Incident) -> tuple[Outcome, int]:
        slot = provider_for(remedy)
        provider = self.providers.get(slot)
        if provider is None:
            return Outcome(Status.FAILED, f"no {slot} provider configured for {remedy.value}"), 0
        where = f" GPU {f.gpu}" if f.gpu is not None else ""
        target = Target(
            self.node,
            f.gpu,
            reason=f"trainguard: {f.rule}{where} inc {rec.id}",
            payload={"incident": rec.to_dict(), "finding": finding_to_dict(f, evidence=True)},
        )
        try:
            return with_retry(provider, remedy.value, target, backoff_s=self.backoff_s, sleep=self.sleep)
        except Exception as exc:  # a provider bug must not stop the agent: it is this action's result
            log.exception("%s provider failed", slot)
            return Outcome(Status.FAILED, f"{type(exc).__name__}: {exc}"), 1

    # -- records --------------------------------------------------------------------------------

    def _record(self, d: NodeDecision, resolution: str, now: float) -> Incident:
        f = d.finding
        where = f" GPU {f.gpu}" if f.gpu is not None else ""
        inc = Incident(
            job=f"node:{self.node}",
            time=now,
            root_cause=root_cause_for([f]),
            action=d.remedy.value,
            summary=f"{d.remedy.value} {self.node}{where}: {f.reason}",
            category=f.category.value if f.category else None,
            evidence=(f"finding {f.rule}: {f.reason}", f"policy: {d.why}", f"by {self.actor}"),
            gpu=f.gpu,
            node=self.node,
            detected_by=DETECTED_BY,
            resolved=False,
            resolution=resolution,
        )
        if not self.record_dry_run and resolution.startswith("dry_run"):
            return inc
        stored: Incident = self.store.add(inc)
        if resolution != "in_progress":  # dry run or held: final now; a taken action when finished
            self._fleet_action(stored, resolution)
        return stored

    def _fleet_action(self, rec: Incident, resolution: str) -> None:
        key_of = getattr(self.store, "key_of", None)
        fleetlog.record_action(
            self.fleet, rec.action, resolution.split(":")[0], node=self.node, gpu=rec.gpu,
            detail=resolution, incident_key=key_of(rec) if key_of else None, source=self.actor, time=rec.time,
        )  # fmt: skip

    def _finish(self, rec: Incident, outcome: Outcome, tries: int) -> Incident:
        slot = provider_for(NodeAction(rec.action))
        name = getattr(self.providers.get(slot), "name", slot)
        evidence = (*rec.evidence, f"provider {name}: {outcome.status.value} after {tries} call(s)")
        resolution = f"{outcome.status.value}: {outcome.detail}" if outcome.detail else outcome.status.value
        if rec.id is None:  # not stored (a dry run kept out), or spooled: the update follows it
            done = replace(rec, resolution=resolution, evidence=evidence, resolved=outcome.ok)
            by_key, key_of = getattr(self.store, "update_by_key", None), getattr(self.store, "key_of", None)
            if by_key is not None and key_of is not None:
                by_key(key_of(rec), resolution=resolution, evidence=evidence, resolved=outcome.ok)
        else:
            done = self.store.update(rec.id, resolution=resolution, evidence=evidence, resolved=outcome.ok)
        self._fleet_action(done, resolution)
        return done
