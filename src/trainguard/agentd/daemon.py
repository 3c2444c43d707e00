"""The node agent's loop: look (one ``Agent.tick``), judge (new findings), act (store, publish).

    >>> from trainguard.agentd import AgentConfig, AgentDaemon
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> daemon = AgentDaemon(AgentConfig(backend="sim", db=f"{d}/tg.db", state_dir=d))
    >>> daemon.step().verdict.health.value
    'ok'
    >>> daemon.close()

One thread runs ``run(stop)``; the HTTP side only reads ``daemon.snapshot`` (replaced whole each
tick), ``daemon.tally`` and ``daemon.history``. Nothing the node does stops the loop: telemetry
and kernel-log failures are findings of the agent, a store that is locked or on a full disk keeps
the incidents in a bounded queue (written when it works again) and makes the agent degraded; a
state file that cannot be written is retried next tick.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from trainguard.agent import Agent
from trainguard.agentd.config import AgentConfig
from trainguard.agentd.follow import ResumingFollower, ResumingKmsg
from trainguard.agentd.judge import FindingKey, all_findings, incidents_for, onsets
from trainguard.agentd.snapshot import LATENCY_BUCKETS, History, Snapshot, Tally
from trainguard.agentd.state import SavedState, load_state, save_state
from trainguard.clock import Clock, RealClock
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import ConfigError, StoreError
from trainguard.incidents import Incident
from trainguard.records import Health

log = logging.getLogger(__name__)

MAX_PENDING = 10_000  # incidents waiting for the store; beyond this the oldest are dropped (counted)


class AgentDaemon:
    def __init__(
        self,
        config: AgentConfig,
        thresholds: Thresholds | None = None,
        *,
        clock: Clock | None = None,
        backend: Any = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or RealClock()
        self.hostname = config.hostname or socket.gethostname()
        self.state_dir = Path(config.state_dir or default_state_dir())
        self.state_path = self.state_dir / "agent-state.json"
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.fleet: Any = None  # the SimFleet when simulated: fault injection for drills and tests
        if backend is None:
            backend, kernel_log = self._open_backend()
        else:
            kernel_log = Path(config.kernel_log) if config.kernel_log else None
        saved = load_state(self.state_path)
        follower: ResumingFollower | ResumingKmsg | None = None
        if kernel_log is not None:
            kmsg = kernel_log.is_char_device()  # /dev/kmsg: one record per read
            follower = (
                ResumingKmsg(kernel_log, saved.cursor) if kmsg else ResumingFollower(kernel_log, saved.cursor)
            )
        self.follower = follower
        self.agent = Agent(
            backend, kernel_log=kernel_log, clock=self.clock, thresholds=thresholds, follower=follower
        )
        from trainguard.remediate.hook import AgentRemediation

        self.remediation = AgentRemediation(
            node=self.hostname, state_dir=self.state_dir, store=self._open_store, backend=backend,
            policy_path=config.policy, enforce=config.enforce, fleet=self.fleet,
            on_reset=self.agent.gpu_was_reset, clock=self.clock.time,
        )  # fmt: skip
        self._active: Counter[FindingKey] = saved.active
        self._saved = saved
        self._pending: deque[Incident] = deque()
        self._store: Any = None
        self._fleet: Any = None  # FleetWriter: this node's verdict changes into the store
        self.tally = Tally()
        self.history = History(config.history_s, config.interval_s)
        self.snapshot = Snapshot(
            0, self.clock.time(), self.hostname, started=time.time(), interval_s=config.interval_s
        )
        self.last_tick_monotonic = time.monotonic()
        self.wake = threading.Event()  # set to make run() tick at once (a reload)

    # -- setup ------------------------------------------------------------------------------

    def _open_backend(self) -> tuple[Any, Path | None]:
        cfg = self.config
        kernel_log = Path(cfg.kernel_log) if cfg.kernel_log else None
        if not cfg.sim:
            from trainguard.telemetry import open_backend

            return open_backend("nvml"), kernel_log
        from trainguard.telemetry.sim import SCENARIOS, SimFleet

        spec = SCENARIOS.get(cfg.scenario or "healthy")
        if spec is None:
            raise ConfigError(f"unknown scenario {cfg.scenario!r}: choose one of {', '.join(SCENARIOS)}")
        if kernel_log is None:  # the simulated kernel log lives as long as the daemon
            self._tmp = tempfile.TemporaryDirectory(prefix="trainguard-agent-")
            kernel_log = Path(self._tmp.name) / "kmsg.log"
        self.fleet = SimFleet(
            n_gpus=cfg.gpus, seed=cfg.seed, clock=self.clock, kmsg_path=kernel_log, hostname=self.hostname
        )
        spec.script(self.fleet)
        return self.fleet, kernel_log

    def _open_store(self) -> Any:
        if self._store is None:
            from trainguard.incidents.backend import is_url
            from trainguard.incidents.identity import NodeIdentity
            from trainguard.incidents.store import IncidentStore, default_db

            target = self.config.db or default_db()
            # A fleet database that is away: writes wait in a local spool, replayed when it returns.
            spool = self.state_dir / "store-spool.jsonl" if is_url(target) else None
            # A short busy timeout: a store locked by another writer must not stall sampling.
            self._store = IncidentStore(
                target, timeout_s=0.5, identity=NodeIdentity.from_env(host=self.hostname), spool=spool
            )
        return self._store

    def _record_fleet(self, verdict: Any, now: float, problems: list[str]) -> None:
        """The node's verdict changes into the (fleet) store; a failure is retried next tick."""
        try:
            if self._fleet is None:
                from trainguard.incidents.fleet import FleetWriter

                store = self._open_store()
                self._fleet = FleetWriter(store, store.identity)
            self._fleet.observe(verdict, now)
            if self._store.spool_depth:
                problems.append(f"fleet store away: {self._store.spool_depth} write(s) spooled")
        except StoreError as exc:
            with self.tally.lock:
                self.tally.errors["fleet_store"] += 1
            problems.append(f"fleet store: {exc}")

    @property
    def spool_depth(self) -> int:
        """Writes waiting in the local spool for a fleet database that is away."""
        return int(self._store.spool_depth) if self._store is not None else 0

    def store(self) -> Any:
        """The incident store for readers (the API); raises StoreError when it cannot be opened."""
        return self._open_store()

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set (the tick's own time is subtracted)."""
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                self.step()
            except Exception:  # a bug must not silence the node: log it and keep sampling
                log.exception("agent tick failed")
                with self.tally.lock:
                    self.tally.errors["tick"] += 1
            wait = max(0.0, self.config.interval_s - (time.monotonic() - t0))
            self.wake.wait(wait)
            self.wake.clear()

    def step(self) -> Snapshot:
        t0 = time.monotonic()
        # look
        verdict = self.agent.tick()
        samples, events = tuple(self.agent.samples), self.agent.events
        now = self.clock.time()
        # judge
        new, self._active = onsets(self._active, all_findings(verdict))
        incidents = incidents_for(new, self.hostname, now)
        # act
        problems: list[str] = []
        self._count(new, events, incidents)
        self._pending.extend(incidents)
        dropped = len(self._pending) - MAX_PENDING
        for _ in range(max(0, dropped)):
            self._pending.popleft()
        if dropped > 0:
            with self.tally.lock:
                self.tally.incidents_dropped += dropped
        self._flush(problems)
        self.remediation.step(new, now)
        self._record_fleet(verdict, now, problems)
        if not self._pending:  # only then is everything before the cursor safely stored
            self._save_state(problems)
        if not samples:
            problems.append("no telemetry: every GPU is unknown")
        self.history.add(samples)
        published = time.time()
        self._observe_latency(new, published, t0)
        health = Health.DEGRADED if problems else Health.OK
        self.snapshot = Snapshot(
            seq=self.snapshot.seq + 1,
            time=now,
            hostname=self.hostname,
            verdict=verdict,
            samples=samples,
            health=health,
            problems=tuple(problems),
            started=self.snapshot.started,
            tick_s=time.monotonic() - t0,
            interval_s=self.config.interval_s,
        )
        self.last_tick_monotonic = time.monotonic()
        return self.snapshot

    def _count(self, new: list[Any], events: list[Any], incidents: list[Incident]) -> None:
        t = self.tally
        with t.lock:
            t.ticks += 1
            for f in new:
                t.findings[(f.category.value if f.category else "", f.action.value, f.health.value)] += 1
            for inc in incidents:
                t.incidents[(inc.root_cause.value, inc.action)] += 1
            for ev in events:
                t.kernel_events[(ev.kind.value, ev.category.value)] += 1
                if ev.xid is not None:
                    gpu = self.agent.gpu_of(ev)
                    if gpu is not None:
                        t.xids[(gpu, ev.xid)] += 1
                        t.last_xid[gpu] = ev.xid
            if any(f.rule == "telemetry" for f in new):
                t.errors["telemetry"] += 1
            if any(f.rule == "kernel_log" for f in new):
                t.errors["kernel_log"] += 1

    def _observe_latency(self, new: list[Any], published: float, t0: float) -> None:
        tick_s = time.monotonic() - t0
        with self.tally.lock:
            for f in new:
                # Real clock: from the evidence's own time; otherwise from the start of the tick.
                lat = published - f.time if f.time is not None and 0 <= published - f.time < 3600 else tick_s
                self.tally.latency_sum += lat
                self.tally.latency_count += 1
                for b in LATENCY_BUCKETS:
                    if lat <= b:
                        self.tally.latency_buckets[b] += 1

    def _flush(self, problems: list[str]) -> None:
        if not self._pending:
            return
        try:
            store = self._open_store()
            store.add_many(list(self._pending))  # one transaction a tick; a retry is no duplicate
            self._pending.clear()
        except StoreError as exc:
            with self.tally.lock:
                self.tally.errors["store"] += 1
            problems.append(f"incident store: {exc} ({len(self._pending)} incident(s) kept to retry)")
            log.warning("cannot write incidents: %s", exc)

    def _save_state(self, problems: list[str]) -> None:
        cursor = self.follower.cursor if self.follower is not None else None
        state = SavedState(cursor, +self._active)
        if state == self._saved:
            return
        try:
            save_state(self.state_path, state)
            self._saved = state
        except OSError as exc:
            with self.tally.lock:
                self.tally.errors["state"] += 1
            problems.append(f"cannot save agent state to {self.state_path}: {exc.strerror or exc}")

    # -- control ----------------------------------------------------------------------------

    def reload(self, config: AgentConfig, thresholds: Thresholds | None) -> list[str]:
        """Apply a re-read config; returns the changed settings that need a restart."""
        restart = [
            name
            for name in (
                "listen",
                "tls_cert",
                "tls_key",
                "db",
                "kernel_log",
                "backend",
                "scenario",
                "state_dir",
                "policy",
                "enforce",
            )
            if getattr(config, name) != getattr(self.config, name)
        ]
        if config.interval_s != self.config.interval_s:
            self.history.resize(config.interval_s)
        self.config = config
        if thresholds is not None:
            self.agent.set_thresholds(thresholds)
        self.wake.set()
        return restart

    @property
    def pending(self) -> int:
        """Incidents waiting for the store."""
        return len(self._pending)

    def stalled(self) -> bool:
        """True when the loop has not ticked for three intervals (and at least five seconds)."""
        return time.monotonic() - self.last_tick_monotonic > max(5.0, 3 * self.config.interval_s)

    def close(self) -> None:
        self.remediation.close()
        self.agent.close()
        if self._store is not None:
            self._store.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def default_state_dir(environ: dict[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` (set by systemd's StateDirectory=) or ``~/.local/state/trainguard``."""
    env = os.environ if environ is None else environ
    first = env.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(first) if first else Path.home() / ".local" / "state" / "trainguard"
