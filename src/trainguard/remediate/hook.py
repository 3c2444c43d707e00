"""The node agent's remediation: one object, built once where the agent is assembled, called once
per tick as the daemon's act (agent/assemble.py wraps it in the daemon's ``Act`` seam).

    daemon.step():  look (Agent.tick) -> judge (onsets) -> record (incidents stored) -> act: remediation.step(new)

It adds intrusion findings (GPU processes of no job), hands the tick's new findings to the
``Remediator``, and serves the breaker's state to ``/metrics`` and the API from a `BreakerView`
(remediate/breaker_view.py: the file read off the event loop, one reader at a time, the last
good state served with a staleness flag while a read hangs). Providers follow the
node: a simulated node gets the simulated scheduler and GPU reset; a real one Slurm or Kubernetes
(the policy's ``provider``) and ``nvidia-smi``; a webhook when the policy names one. Nothing is
done unless the policy (or ``--enforce``) enforces: by default every decision is a dry-run record.
With ``fleet_writer`` (the daemon's `FleetWriter`, opened when first needed) every action and
breaker event also goes to the fleet store (remediate/fleetlog.py).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError, StoreError
from trainguard.incidents import Incident
from trainguard.records import Finding
from trainguard.remediate.breaker import BreakerState, fleet_limit
from trainguard.remediate.breaker_view import BreakerView
from trainguard.remediate.executor import JobInfo, Remediator
from trainguard.remediate.intrusion import unexpected_processes
from trainguard.remediate.policy import Policy, load_policy
from trainguard.remediate.providers import Provider

log = logging.getLogger(__name__)

__all__ = ["AgentRemediation"]


class AgentRemediation:
    def __init__(
        self,
        *,
        node: str,
        state_dir: Path,
        store: Callable[[], Any],
        backend: Any,
        policy_path: str = "",
        enforce: bool = False,
        sim: Any = None,  # the simulated node (a SimNode): its own scheduler and GPUs
        on_reset: Callable[[int], None] | None = None,
        clock: Callable[[], float] | None = None,
        fleet_writer: Callable[[], Any] | None = None,
    ) -> None:
        self.policy: Policy = load_policy(policy_path) if policy_path else Policy()
        self.node, self.backend, self._store = node, backend, store
        self._on_reset = on_reset  # the agent's gpu_was_reset: not thread-safe, so called from step()
        self._resets: list[int] = []
        self.enforcing = enforce or self.policy.enforce or any(g.enforce for g in self.policy.groups)
        providers = self._providers(sim) if self.enforcing else {}
        kw: dict[str, Any] = {"clock": clock} if clock is not None else {}
        gpus = backend.gpus() if hasattr(backend, "gpus") else []
        self.remediator = Remediator(
            self.policy,
            node,
            _LazyStore(store),
            state_dir=state_dir,
            providers=providers,
            enforce=True if enforce else None,
            job=self._job,
            gpu_model=gpus[0].name if gpus else None,
            on_reset=self._resets.append,  # applied on the tick's thread, in step()
            record_dry_run=bool(policy_path) or enforce,
            fleet=_LazyFleet(fleet_writer) if fleet_writer is not None else None,
            **kw,
        )
        self.breaker_view = BreakerView(self.remediator.breaker)  # what /metrics and the API show
        self._flagged: set[int] = set()  # pids already reported as unexpected
        self._jobs: Counter[str] = Counter()
        self.counts: Counter[tuple[str, str]] = Counter()  # (remedy, result) -> n
        self.errors = 0
        # Providers block (scontrol, retries with backoff, nvidia-smi -r): they run on one worker
        # thread, in order, so a slow controller never stalls sampling.
        self._work: queue.Queue[list[Finding] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def _providers(self, sim: Any) -> dict[str, Provider]:
        p = self.policy
        out: dict[str, Provider] = {}
        if sim is not None:  # a simulated node: never touch the real scheduler or GPUs
            from trainguard.remediate.providers.gpu_reset import GpuResetProvider, SimGpuControl
            from trainguard.remediate.providers.sim import SimScheduler

            out["node"] = SimScheduler([self.node])
            out["gpu"] = GpuResetProvider(SimGpuControl(sim))
        else:
            if p.provider == "slurm":
                from trainguard.remediate.providers.slurm import SlurmProvider

                out["node"] = SlurmProvider()
            elif p.provider == "kubernetes":
                from trainguard.remediate.providers.kubernetes import KubernetesProvider

                out["node"] = KubernetesProvider(host=self.node)
            from trainguard.remediate.providers.gpu_reset import GpuResetProvider, NvidiaSmi

            try:
                out["gpu"] = GpuResetProvider(NvidiaSmi())
            except ConfigError as exc:
                log.warning("GPU reset unavailable: %s", exc)
        if p.webhook_url:
            from trainguard.remediate.providers.webhook import WebhookProvider

            if not p.webhook_secret_file:
                raise ConfigError("[remediation.webhook] url needs secret_file (mode 0600, 16+ characters)")
            out["webhook"] = WebhookProvider.from_secret_file(p.webhook_url, p.webhook_secret_file)
        return out

    def _job(self) -> JobInfo | None:
        """The training job on this node (the one most GPU processes belong to), for the job breaker."""
        if not self._jobs or self.policy.breaker.job_spares <= 0:
            return None
        return JobInfo(self._jobs.most_common(1)[0][0], self.policy.breaker.job_spares)

    def step(self, new: list[Finding], now: float) -> None:
        """The act step: queue this tick's new findings (plus new intrusions) for the worker."""
        while self._resets:  # GPUs the worker reset since the last tick: their old Xids are behind them
            gpu = self._resets.pop(0)
            if self._on_reset is not None:
                self._on_reset(gpu)
        findings = list(new) + self._intrusions(now)
        if not findings:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainguard-remediation", daemon=True)
            self._thread.start()
        self._work.put(findings)

    def _run(self) -> None:
        while (item := self._work.get()) is not None:
            try:
                self.act(item)
            except Exception:  # a bug must not end remediation for the agent's lifetime
                self.errors += 1
                log.exception("remediation failed")
            finally:
                self._work.task_done()
        self._work.task_done()

    def flush(self) -> None:
        """Wait until every queued finding has been handled (tests, shutdown)."""
        self._work.join()

    def close(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None:
            self._work.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    def act(self, findings: list[Finding]) -> list[Incident]:
        """Remediate now, on this thread; the records made."""
        try:
            records = self.remediator.act(findings)
        except StoreError as exc:  # no record, no action: held until the store works again
            self.errors += 1
            log.warning("remediation skipped: cannot record it (%s)", exc)
            return []
        for r in records:
            self.counts[(r.action, (r.resolution or "").split(":")[0])] += 1
        return records

    def _intrusions(self, now: float) -> list[Finding]:
        lister = getattr(self.backend, "processes", None)
        if lister is None:
            return []
        procs = []
        try:
            for g in self.backend.gpus():
                procs += lister(g.index)
        except Exception as exc:  # could not read: unknown, never "no intruder" nor a crash
            log.debug("cannot list GPU processes: %s", exc)
            return []
        self._jobs = Counter(p.job for p in procs if p.job is not None)
        alive = {p.pid for p in procs}
        self._flagged &= alive
        if not self.policy.intrusion:
            return []
        found = unexpected_processes(
            [p for p in procs if p.pid not in self._flagged],
            now,
            allowed_commands=self.policy.allowed_commands,
            allowed_users=self.policy.allowed_users,
        )
        self._flagged |= {int(f.evidence[0].split("=")[1]) for f in found}
        return found

    # -- for /metrics and the API ------------------------------------------------------------

    def breaker(self) -> BreakerState:
        """The breaker's state read now, on this thread (it may block on a hung file)."""
        return self.remediator.breaker.load()

    def status(self) -> dict[str, Any]:
        """``GET /api/v1/remediation``: the breaker as last read (``breaker_view``; no I/O)."""
        r = self.breaker_view.latest()
        if r.state is None:
            return {
                "enforcing": self.enforcing,
                "error": self.breaker_view.problem() or "breaker not read yet",
            }
        b, limits = r.state, self.policy.breaker
        return {
            "enforcing": self.enforcing,
            "breaker": {
                "open": b.tripped is not None,
                "why": b.tripped,
                "tripped_at": b.tripped_at,
                "held": b.held,
                "jobs_open": dict(b.jobs_tripped),
                "actioned_in_window": len({a.node for a in b.actioned}),
                "limit": fleet_limit(limits, limits.fleet_size),
                "window_s": limits.window_s,
                "stale": r.stale,  # the file hangs or is unreadable: this is its last good state
                "read_age_s": r.age_s,
            },
            "actions": [{"remedy": k[0], "result": k[1], "count": n} for k, n in sorted(self.counts.items())],
        }

    def metrics(self) -> list[tuple[str, str, str, list[tuple[dict[str, str], float]]]]:
        """(name, gauge|counter, help, [(labels, value)]) for the Prometheus exporter (no I/O)."""
        r = self.breaker_view.latest()
        b = r.state
        if b is None:
            open_, held, jobs = float("nan"), float("nan"), 0
        else:
            open_, held, jobs = float(b.tripped is not None), float(b.held), len(b.jobs_tripped)
        actions = [({"remedy": k[0], "result": k[1]}, float(n)) for k, n in sorted(self.counts.items())]
        return [
            ("trainguard_remediation_breaker_open", "gauge", "1 while the fleet breaker is open (a person resets it).",
             [({}, open_)]),
            ("trainguard_remediation_breaker_jobs_open", "gauge", "Jobs whose breaker is open.", [({}, float(jobs))]),
            ("trainguard_remediation_held", "gauge", "Actions held by a breaker since its last reset.", [({}, held)]),
            ("trainguard_remediation_breaker_stale", "gauge", "1 while the breaker file hangs or is unreadable "
             "(the breaker gauges show its last good state).", [({}, float(r.stale))]),
            ("trainguard_remediation_enforcing", "gauge", "1 when remediation acts, 0 in dry run.",
             [({}, float(self.enforcing))]),
            ("trainguard_remediation_actions", "counter", "Remediation records by remedy and result "
             "(dry_run, held, done, already, failed, ambiguous).", actions),
        ]  # fmt: skip


class _LazyStore:
    """The daemon's store, opened when first written (it may be locked at start)."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener

    def add(self, incident: Incident) -> Incident:
        return self._opener().add(incident)

    def update(self, incident_id: int, **changes: Any) -> Incident:
        return self._opener().update(incident_id, **changes)

    def update_by_key(self, key: str, **changes: Any) -> None:
        self._opener().update_by_key(key, **changes)

    def key_of(self, incident: Incident) -> str:
        return str(self._opener().key_of(incident))


class _LazyFleet:
    """The daemon's `FleetWriter`, opened when remediation first writes to it."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener

    def action(self, action: str, **kw: Any) -> None:
        self._opener().action(action, **kw)

    def breaker(self, breaker: str, state: str, **kw: Any) -> None:
        self._opener().breaker(breaker, state, **kw)
