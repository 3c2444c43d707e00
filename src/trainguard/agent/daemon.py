"""The node agent's loop, one ``step()`` per interval: look -> judge -> record -> act.

    look    ``Agent.tick``: every GPU sampled, the new kernel-log lines read, a NodeVerdict
    judge   ``onsets``/``incidents_for`` (pure): the findings new this tick and their incidents
    record  the incident store (a bounded retry queue in front of it), counters, state, snapshot
    act     ``self.act(judged)``: the one seam for remediation (``Act``; default ``no_action``)

Record comes before act: an action is taken on an incident already stored (remediation's own
record names it), so a crash between the two leaves an incident with no action yet, never an
action with no incident to say why (and remediation takes no action it cannot record). ``assemble()``
(agent/assemble.py) builds the daemon as ``trainguard agent`` runs it, remediation as its act::

    >>> from trainguard.agent import AgentConfig, AgentDaemon
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
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainguard.agent.config import AgentConfig
from trainguard.agent.judge import FindingKey, all_findings, incidents_for, onsets
from trainguard.agent.node import Node, driver_version, open_node
from trainguard.agent.series_record import SeriesRecorder
from trainguard.agent.snapshot import History, Snapshot, Tally
from trainguard.agent.state import SavedState, load_state, save_state
from trainguard.agent.tick import Agent
from trainguard.clock import Clock, RealClock
from trainguard.detect.detector import Detector
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import StoreError
from trainguard.incidents import Incident
from trainguard.records import Event, Finding, Health, NodeVerdict, Sample
from trainguard.telemetry.series import Series

log = logging.getLogger(__name__)

MAX_PENDING = 10_000  # incidents waiting for the store; beyond this the oldest are dropped (counted)


@dataclass(frozen=True, slots=True)
class Judged:
    """One tick, looked at, judged and recorded: what ``act`` receives."""

    time: float  # the agent's clock
    hostname: str
    verdict: NodeVerdict  # the node's state now (every finding, old and new)
    samples: tuple[Sample, ...]
    events: tuple[Event, ...]  # kernel-log events read this tick
    new: tuple[Finding, ...]  # findings that appeared this tick
    incidents: tuple[Incident, ...]  # what the new findings are: stored (or queued for the store)


class Act(Protocol):
    """The agent's act step: called once per tick with the judged tick, after it is recorded.

    It must not raise (a failure is logged and counted as ``trainguard_agent_errors_total
    {source="act"}``) and should return quickly: the next tick waits for it. An act with a
    ``close()`` (a worker thread, say) is closed with the daemon, before its store; one with a
    ``problems()`` (a list of strings) adds them to the agent's problems (degraded) each tick.
    """

    def __call__(self, judged: Judged) -> None: ...


@runtime_checkable
class _Closes(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class _Reports(Protocol):
    def problems(self) -> list[str]: ...


def no_action(judged: Judged) -> None:
    """The default act: observe only."""


class AgentDaemon:
    def __init__(
        self,
        config: AgentConfig,
        thresholds: Thresholds | None = None,
        *,
        clock: Clock | None = None,
        backend: Any = None,
        act: Act = no_action,
        store: Any = None,
        detectors: Iterable[Detector] | None = None,
    ) -> None:
        """``backend``: a ready ``TelemetryBackend`` instead of the one ``config`` names;
        ``act``: the act step (``assemble()`` sets remediation here); ``store``: where incidents
        are recorded (an `IncidentStore`; default the one at ``config.db``, opened lazily);
        ``detectors``: what judges each tick (default the fixed rules, detect/detector.py, and
        the failure predictor when ``config.predictor`` names a model file)."""
        if detectors is None and config.predictor:  # checked before anything of the node opens
            detectors = with_predictor(config, thresholds)
        self.config = config
        self.clock: Clock = clock or RealClock()
        self.hostname = config.hostname or socket.gethostname()
        self.state_dir = Path(config.state_dir or default_state_dir())
        self.state_path = self.state_dir / "agent-state.json"
        saved = load_state(self.state_path)
        self.node: Node = self._open_node(backend, saved)
        self.sim = self.node.sim  # the SimNode when simulated: fault injection for drills and tests
        self.series = (
            Series(config.series_step_s, config.series_points, host=self.hostname)
            if config.series_points
            else None
        )  # the telemetry series a model reads (telemetry/series.py); the agent folds each tick in
        self.agent = Agent.of(
            self.node, clock=self.clock, thresholds=thresholds, detectors=detectors, series=self.series
        )
        self.series_record = SeriesRecorder(
            config.series_keep_days * 86400.0, max_pending=max(1, config.series_points) * 64
        )
        self.driver_version = driver_version(self.node.backend)
        self.act: Act = act
        self._active: Counter[FindingKey] = saved.active
        self._failed = 0  # detector failures seen so far (agent.failures)
        self._saved = saved
        self._pending: deque[Incident] = deque()
        self._store: Any = store
        self._fleet: Any = None  # FleetWriter: verdict changes, remediation actions, breaker events
        self._fleet_lock = threading.RLock()  # the tick and an act's worker thread both open them
        self.tally = Tally()
        self.history = History(config.history_s, config.interval_s)
        self.snapshot = Snapshot(
            0, self.clock.time(), self.hostname, started=time.time(), interval_s=config.interval_s
        )
        self.last_tick_monotonic = time.monotonic()
        self.wake = threading.Event()  # set to make run() tick at once (a reload)

    # -- setup ------------------------------------------------------------------------------

    def _open_node(self, backend: Any, saved: SavedState) -> Node:
        cfg = self.config
        kernel_log = cfg.kernel_log or None
        if backend is not None:
            from trainguard.telemetry.lines import open_lines

            lines = open_lines(kernel_log, saved.cursor, resume=True) if kernel_log else None
            return Node(backend, lines, None, Path(kernel_log) if kernel_log else None, self.hostname)
        return open_node(
            "sim" if cfg.sim else cfg.backend,
            kernel_log=kernel_log,
            cursor=saved.cursor,
            resume=True,
            n_gpus=cfg.gpus,
            seed=cfg.seed,
            scenario=cfg.scenario,
            clock=self.clock,
            hostname=self.hostname,
        )

    def _open_store(self) -> Any:
        with self._fleet_lock:
            return self._open_store_locked()

    def _open_store_locked(self) -> Any:
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
            self.fleet_writer().observe(verdict, now)
            if self._store.spool_depth:
                problems.append(f"fleet store away: {self._store.spool_depth} write(s) spooled")
        except StoreError as exc:
            with self.tally.lock:
                self.tally.errors["fleet_store"] += 1
            problems.append(f"fleet store: {exc}")

    def fleet_writer(self) -> Any:
        """This node's `FleetWriter` on the store (opened on first use; raises StoreError)."""
        with self._fleet_lock:
            if self._fleet is None:
                from trainguard.incidents.fleet import FleetWriter

                store = self._open_store()
                self._fleet = FleetWriter(store, store.identity)
            return self._fleet

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
        samples, events = tuple(self.agent.samples), tuple(self.agent.events)
        now = self.clock.time()
        # judge
        new, self._active = onsets(self._active, all_findings(verdict))
        incidents = incidents_for(new, self.hostname, now)
        judged = Judged(now, self.hostname, verdict, samples, events, tuple(new), tuple(incidents))
        # record
        problems: list[str] = []
        self._record(judged, problems)
        # act
        self._act(judged)
        if isinstance(self.act, _Reports):
            problems += self.act.problems()
        if not samples:
            problems.append("no telemetry: every GPU is unknown")
        self.history.add(samples)
        published = time.time()
        self.tally.observe_latency(new, published, time.monotonic() - t0)
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

    def _act(self, judged: Judged) -> None:
        try:
            self.act(judged)
        except Exception:  # remediation failing must not stop the node being watched
            log.exception("agent act step failed")
            with self.tally.lock:
                self.tally.errors["act"] += 1

    def _record(self, judged: Judged, problems: list[str]) -> None:
        """Counters, the store (through the retry queue) and the kernel-log cursor."""
        failed = sum(self.agent.failures.values())
        self.tally.count_tick(judged.new, judged.events, self.agent.gpu_of, failed - self._failed)
        if failed > self._failed:
            problems.append(f"a detector failed: {', '.join(sorted(self.agent.failures))} (see the log)")
        self._failed = failed
        self._pending.extend(judged.incidents)
        dropped = len(self._pending) - MAX_PENDING
        for _ in range(max(0, dropped)):
            self._pending.popleft()
        if dropped > 0:
            with self.tally.lock:
                self.tally.incidents_dropped += dropped
        self._flush(problems)
        self._record_series(judged.time, problems)
        self._record_fleet(judged.verdict, judged.time, problems)
        if not self._pending:  # only then is everything before the cursor safely stored
            self._save_state(problems)

    def _record_series(self, now: float, problems: list[str]) -> None:
        """The series points closed this tick into the store; a failure keeps them to retry."""
        if self.series is None:
            return
        try:
            self.series_record.record(self._open_store, self.series.take_closed(), now)
        except StoreError as exc:
            with self.tally.lock:
                self.tally.errors["series"] += 1
            problems.append(
                f"telemetry series not stored: {exc} ({self.series_record.pending} point(s) kept)"
            )

    def _flush(self, problems: list[str]) -> None:
        if not self._pending:
            return
        try:
            store = self._open_store()
            written = list(self._pending)
            store.add_many(written)  # one transaction a tick; a retry is no duplicate
            self._pending.clear()
            with self.tally.lock:  # counted once written, not when created
                for inc in written:
                    self.tally.incidents[(inc.root_cause.value, inc.action)] += 1
        except StoreError as exc:
            with self.tally.lock:
                self.tally.errors["store"] += 1
            problems.append(f"incident store: {exc} ({len(self._pending)} incident(s) kept to retry)")
            log.warning("cannot write incidents: %s", exc)

    def _save_state(self, problems: list[str]) -> None:
        cursor = getattr(self.node.lines, "cursor", None)
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
                "series_step_s",
                "series_points",
                "predictor",
            )
            if getattr(config, name) != getattr(self.config, name)
        ]
        self.series_record.keep_s = config.series_keep_days * 86400.0
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
        if isinstance(self.act, _Closes):  # its worker may still be writing to the store
            self.act.close()
        self.agent.close()
        if self._store is not None:
            self._store.close()


def with_predictor(config: AgentConfig, thresholds: Thresholds | None) -> list[Detector]:
    """The fixed rules and the failure predictor of ``config.predictor``, checked against the
    series the agent keeps (a ConfigError says what to change; MissingDependency the extra)."""
    from trainguard.detect.detector import fixed_rules
    from trainguard.predictor.detector import FailurePredictor

    model = FailurePredictor.load(config.predictor, config.series_step_s, config.series_points)
    return [*fixed_rules(thresholds), model]


def default_state_dir(environ: dict[str, str] | None = None) -> Path:
    """``$STATE_DIRECTORY`` (set by systemd's StateDirectory=) or ``~/.local/state/trainguard``."""
    env = os.environ if environ is None else environ
    first = env.get("STATE_DIRECTORY", "").split(":")[0]
    return Path(first) if first else Path.home() / ".local" / "state" / "trainguard"
