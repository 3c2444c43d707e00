"""The supervisor's monitor loop on a virtual clock: fake workers, real observer, store and policy.

No torch and no processes: `FakeWorkers` plays the launcher, a `VirtualClock` gives the time and
its `sleep` only advances it, so the loop's timing rules (backoff, the end of a failure streak,
the teardown grace) are checked exactly.
"""

from __future__ import annotations

import signal
from pathlib import Path

from trainguard.incidents import IncidentStore, IntervalKind
from trainguard.rundir import HeartbeatWriter
from trainguard.supervisor import (
    HealthConfig,
    LaunchConfig,
    RecordConfig,
    RecoveryConfig,
    SupervisorConfig,
    WatchConfig,
)
from trainguard.supervisor.assess import EXIT_GRACE_S, workers_done
from trainguard.supervisor.attempt import Attempt
from trainguard.supervisor.bookkeeping import HEALTHY_AFTER_S
from trainguard.supervisor.health import GpuMap
from trainguard.supervisor.observe import Observation
from trainguard.supervisor.supervisor import Supervisor
from trainguard.supervisor.watch import ProgressView

T0 = 1_000_000.0


class VirtualClock:
    def __init__(self) -> None:
        self.now = T0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return None

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


class FakeWorkers:
    """Two local ranks; ``script(attempt, t)`` says each rank's exit code at virtual time t."""

    def __init__(self, clock: VirtualClock, script, run_dir: Path) -> None:
        self.clock, self.script, self.run_dir = clock, script, run_dir
        self.attempt = 0
        self.starts: list[float] = []
        self.calls: list[tuple[str, int]] = []  # (start | settled, attempt), in order
        self.procs_ = {0: FakeProc(100), 1: FakeProc(101)}

    def start(self, local_world_size: int | None = None) -> None:
        self.starts.append(self.clock.now)
        self.calls.append(("start", self.attempt))

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None:
        self.attempt += 1
        self.start()

    def stop(self) -> None:
        pass

    def ranks(self) -> dict[int, int]:
        return {0: 0, 1: 1}

    def world_size(self) -> int:
        return 2

    def exit_codes(self) -> dict[int, int | None]:
        return self.script(self, self.clock.now - self.starts[-1])

    def procs(self) -> dict[int, FakeProc]:
        return self.procs_

    def pids(self) -> dict[int, int]:
        return {lr: p.pid for lr, p in self.procs_.items()}

    def nodes_waiting(self) -> int:
        return 0

    def peers(self) -> tuple[str | None, dict[str, tuple[int, ...]]]:
        return None, {}  # one node

    def drop_peers(self, nodes) -> list[str]:
        return []

    def interrupted(self) -> None:
        pass

    def standbys(self) -> dict[str, int] | None:
        return None

    def settled(self) -> None:
        self.calls.append(("settled", self.attempt))

    def beat(self, rank: int, step: int, t: float, phase: str = "train") -> None:
        HeartbeatWriter(self.run_dir, rank, self.attempt).beat(step, 1.0, 0.1, phase, now=t)


def supervisor(tmp_path: Path, clock: VirtualClock) -> Supervisor:
    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "train.py"), nproc_per_node=2, standalone=True, monitor_interval=0.5),
        RecordConfig(job_id="vjob", runs_root=tmp_path / "runs", db=tmp_path / "tg.db"),
        WatchConfig(tee=False),
        recovery=RecoveryConfig(max_restarts=5, backoff_base_s=4.0),
    )
    return Supervisor(config, clock=clock.time, sleep=clock.sleep)


def test_a_second_crash_in_a_row_waits_the_backoff_on_the_clock_and_records_it(tmp_path):
    clock = VirtualClock()
    sup = supervisor(tmp_path, clock)

    def script(w: FakeWorkers, t: float) -> dict[int, int | None]:
        if w.attempt < 2:  # attempts 0 and 1 lose rank 1 after 3 s, before any step
            return {0: None, 1: 1 if t >= 3.0 else None}
        return {0: 0, 1: 0}

    workers = FakeWorkers(clock, script, sup.run_dir)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    # no backoff after the first failure; base (4 s) after the second, spent on the virtual clock
    assert 4.0 in clock.sleeps
    assert workers.starts[2] - workers.starts[1] >= 3.0 + 4.0
    assert workers.starts[1] - workers.starts[0] < 3.0 + 1.0
    downtime = [i for i in sup.recorder.intervals if i.kind is IntervalKind.DOWNTIME]
    assert [round(i.end - i.start, 3) for i in downtime] == [4.0]
    assert [i.action for i in sup.recorder.incidents] == ["restart", "restart"]
    assert [i.action for i in IncidentStore(tmp_path / "tg.db").incidents(job="vjob")] == [
        "restart",
        "restart",
    ]


def test_the_launchers_own_slow_start_is_init_in_the_ledger_not_time_no_interval_covers(tmp_path):
    # CI beside two hogs: a plain script's ledger left 2.1 s of 30.9 unaccounted, the launcher's
    # rendezvous, pre-flight and worker start before the first attempt began.
    from trainguard.incidents.goodput import goodput

    clock = VirtualClock()
    sup = supervisor(tmp_path, clock)

    class SlowStart(FakeWorkers):
        def start(self, local_world_size: int | None = None) -> None:
            if not self.starts:
                clock.sleep(2.0)  # a loaded host's launch
            super().start(local_world_size)

    workers = SlowStart(clock, lambda w, t: {0: 0, 1: 0} if t >= 3.0 else {0: None, 1: None}, sup.run_dir)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    ledger = goodput(sup.recorder.intervals, sup.started, clock.now)
    assert ledger.init_s >= 2.0  # from the job's start, not the workers'
    assert ledger.unaccounted_s == 0.0


def test_the_launcher_hears_an_attempt_has_settled_only_after_its_first_step(tmp_path):
    # Warm standbys fill when the launcher hears this: never beside the ranks' own start, and not
    # for an attempt that failed before its first step (its restart stays cold).
    clock = VirtualClock()
    sup = supervisor(tmp_path, clock)
    settled_after: list[float] = []

    class Timed(FakeWorkers):
        def settled(self) -> None:
            settled_after.append(clock.now - self.starts[-1])
            super().settled()

    def script(w: FakeWorkers, t: float) -> dict[int, int | None]:
        if w.attempt == 0:  # rank 1 dies at start-up, before any step
            return {0: None, 1: 1 if t >= 3.0 else None}
        if w.attempt == 1 and t >= 5.0:  # its first step at 5 s; dies after training a while
            w.beat(0, int(t * 10), clock.now)
            w.beat(1, int(t * 10), clock.now)
            return {0: None, 1: 1 if t >= 8.0 else None}
        if w.attempt == 1:
            return {0: None, 1: None}  # importing: no step yet
        return {0: 0, 1: 0}

    workers = Timed(clock, script, sup.run_dir)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert workers.calls == [("start", 0), ("start", 1), ("settled", 1), ("start", 2)]
    assert 5.0 <= settled_after[0] < 8.0  # at the first step, not at the start
    assert [i.action for i in sup.recorder.incidents] == ["restart", "restart"]


def test_without_heartbeats_an_attempt_settles_once_its_workers_have_run_a_while(tmp_path):
    from trainguard.supervisor.bookkeeping import RUNNING_S

    clock = VirtualClock()
    sup = supervisor(tmp_path, clock)
    settled_after: list[float] = []

    class Timed(FakeWorkers):
        def settled(self) -> None:
            settled_after.append(clock.now - self.starts[-1])
            super().settled()

    done = RUNNING_S + 5.0
    workers = Timed(clock, lambda w, t: {0: 0, 1: 0} if t >= done else {0: None, 1: None}, sup.run_dir)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert workers.calls == [("start", 0), ("settled", 0)]
    assert RUNNING_S < settled_after[0] < done  # on the virtual clock: exact, no load in it


def test_steady_progress_after_a_restart_ends_the_failure_streak(tmp_path):
    clock = VirtualClock()
    sup = supervisor(tmp_path, clock)

    def script(w: FakeWorkers, t: float) -> dict[int, int | None]:
        if w.attempt == 0:
            return {0: None, 1: 1 if t >= 1.0 else None}
        if w.attempt == 1:  # trains well past HEALTHY_AFTER_S, then crashes again
            if t < HEALTHY_AFTER_S + 5:
                w.beat(0, int(t * 10), clock.now)
                w.beat(1, int(t * 10), clock.now)
                return {0: None, 1: None}
            return {0: None, 1: 1}
        return {0: 0, 1: 0}

    workers = FakeWorkers(clock, script, sup.run_dir)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert 4.0 not in clock.sleeps  # the second crash came after healthy progress: no backoff
    assert sup.history.restarts_used == 2


def test_a_rank_that_said_goodbye_but_lingers_is_ended_only_after_the_grace():
    attempt = Attempt(
        number=0, started=T0, rank_of={0: 0, 1: 1}, gpu_map=GpuMap((0, 1)), resume_step=0, world_size=2
    )
    attempt.exits_seen[0] = T0 + 10

    def look(t: float) -> Observation:
        prog = ProgressView(5, 5, T0, T0, 30.0, False, (), 0.1, 1.0)
        return Observation(time=t, codes={0: 0, 1: None}, progress=prog, phases={0: "exit", 1: "exit"})

    assert workers_done(look(T0 + 10 + EXIT_GRACE_S - 0.1), attempt) is None
    assert workers_done(look(T0 + 10 + EXIT_GRACE_S), attempt) == (1,)
    still_training = Observation(
        time=T0 + 100, codes={0: 0, 1: None}, progress=look(T0).progress, phases={0: "exit", 1: "train"}
    )
    assert workers_done(still_training, attempt) is None


def test_lingering_ranks_are_ended_through_their_process_handles(tmp_path):
    clock = VirtualClock()
    sup = supervisor(tmp_path, clock)

    def script(w: FakeWorkers, t: float) -> dict[int, int | None]:
        w.beat(0, 3, clock.now, "exit")
        w.beat(1, 3, clock.now, "exit")
        return {0: 0 if t >= 1.0 else None, 1: None}

    workers = FakeWorkers(clock, script, sup.run_dir)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert workers.procs_[1].signals == [signal.SIGKILL]
    assert workers.procs_[0].signals == []
    assert clock.now - T0 >= 1.0 + EXIT_GRACE_S


def test_trainguard_run_without_torch_says_which_extra_to_install(tmp_path):
    import subprocess
    import sys

    hide_torch = "import sys; sys.modules['torch'] = None; from trainguard.cli import main; sys.exit(main())"
    args = [
        "run",
        "--standalone",
        "--runs-dir",
        str(tmp_path),
        "--db",
        str(tmp_path / "tg.db"),
        "--",
        "python",
        "x.py",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", hide_torch, *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "pip install 'trainguard[torch]'" in proc.stderr
    assert "Traceback" not in proc.stderr


class ShrinkingWorkers(FakeWorkers):
    """Fake workers whose group has as many local ranks as the supervisor asks for."""

    def __init__(self, clock: VirtualClock, script, run_dir: Path, n: int) -> None:
        super().__init__(clock, script, run_dir)
        self.n = n
        self.sizes: list[int] = []

    def start(self, local_world_size: int | None = None) -> None:
        self.n = local_world_size or self.n
        self.sizes.append(self.n)
        super().start()

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None:
        self.attempt += 1
        self.start(local_world_size)

    def ranks(self) -> dict[int, int]:
        return {lr: lr for lr in range(self.n)}

    def world_size(self) -> int:
        return self.n

    def procs(self) -> dict[int, FakeProc]:
        return {lr: FakeProc(100 + lr) for lr in range(self.n)}


def sim_supervisor(tmp_path: Path, clock: VirtualClock, **health) -> Supervisor:
    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "train.py"), nproc_per_node=3, standalone=True, monitor_interval=0.5),
        RecordConfig(job_id="simjob", runs_root=tmp_path / "runs", db=tmp_path / "tg.db"),
        WatchConfig(tee=False),
        HealthConfig(backend="sim", **health),
    )
    return Supervisor(config, clock=clock.time, sleep=clock.sleep)


def test_the_preflight_before_a_restart_excludes_a_gpu_that_computes_wrong_products(tmp_path):
    clock = VirtualClock()
    sup = sim_supervisor(tmp_path, clock)
    events = []
    sup._on_event = events.append

    def script(w: ShrinkingWorkers, t: float) -> dict[int, int | None]:
        if w.attempt == 0:
            if t >= 2.0:  # GPU 1 turns bad (no telemetry symptom), then a rank crashes
                sup.health.sim.now().wrong_products(gpu=1)
                return {0: None, 1: 1, 2: None}
            return dict.fromkeys(range(w.n))
        return dict.fromkeys(range(w.n), 0)

    workers = ShrinkingWorkers(clock, script, sup.run_dir, 3)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    preflights = [e.data for e in events if e.kind == "preflight"]
    assert [p["gpus"] for p in preflights] == [[0, 1, 2], [0, 1, 2]]  # before the start and the restart
    assert [p["verdict"] for p in preflights] == ["pass", "fail"]
    assert workers.sizes == [3, 2]
    assert sup.gpu_map.gpus == (0, 2)
    crash, caught = sup.recorder.incidents
    assert (crash.action, caught.action) == ("restart", "exclude_gpu")
    assert (caught.gpu, caught.detected_by, caught.root_cause.value) == (
        1,
        "preflight",
        "silent_data_corruption",
    )
    assert caught.resolved
    stored = IncidentStore(tmp_path / "tg.db").incidents(job="simjob")[-1]
    assert any(isinstance(e, dict) and e.get("purpose") == "preflight" for e in stored.evidence)
    assert any(str(e).startswith("diagnostics on GPU 1: sdc fail") for e in stored.evidence)


def test_no_preflight_runs_when_it_is_switched_off(tmp_path):
    clock = VirtualClock()
    sup = sim_supervisor(tmp_path, clock, preflight=False)
    events = []
    sup._on_event = events.append
    sup.health.sim.now().wrong_products(gpu=1)
    workers = ShrinkingWorkers(clock, lambda w, t: dict.fromkeys(range(w.n), 0), sup.run_dir, 3)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert [e for e in events if e.kind == "preflight"] == []
    assert workers.sizes == [3]


def test_a_gpu_that_fails_the_first_preflight_is_never_started_on(tmp_path):
    clock = VirtualClock()
    sup = sim_supervisor(tmp_path, clock)
    sup.health.sim.now().wrong_products(gpu=2)
    workers = ShrinkingWorkers(clock, lambda w, t: dict.fromkeys(range(w.n), 0), sup.run_dir, 3)
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert workers.sizes == [2]
    [incident] = sup.recorder.incidents
    assert (incident.gpu, incident.action, incident.rank) == (2, "exclude_gpu", None)


def test_the_diagnosis_after_a_degraded_gpu_is_stored_with_its_incident(tmp_path):
    clock = VirtualClock()
    sup = sim_supervisor(tmp_path, clock, health_interval=0.5)

    def script(w: ShrinkingWorkers, t: float) -> dict[int, int | None]:
        if w.attempt == 0 and t < 30.0:
            if t >= 1.0 and not w.stuck:
                w.stuck = True
                sup.health.sim.now().straggler(gpu=2)  # clocks stuck at half: telemetry degrades
            return dict.fromkeys(range(w.n))
        return dict.fromkeys(range(w.n), 0)

    workers = ShrinkingWorkers(clock, script, sup.run_dir, 3)
    workers.stuck = False
    sup.started = clock.now
    assert sup.monitor(workers) is True
    [incident] = [i for i in sup.recorder.incidents if i.gpu == 2 and i.detected_by == "telemetry"]
    lines = [str(e) for e in incident.evidence if str(e).startswith("diagnostics on GPU 2: ")]
    assert any(
        line.startswith("diagnostics on GPU 2: compute fail") and "% of peers" in line for line in lines
    )
    assert any(line.startswith("diagnostics on GPU 2: sdc pass") for line in lines)
    assert incident.action == "exclude_gpu"  # measured at half its peers' speed
    report = next(
        e for e in incident.evidence if isinstance(e, dict) and e.get("purpose") == "after_incident"
    )
    assert report["suspect_gpu"] == 2


def test_the_watchers_line_says_whether_the_preflight_runs_and_why_not():
    from trainguard.supervisor.watch import watchers

    launch = LaunchConfig(cmd=("python", "x.py"))
    sim = SupervisorConfig(launch, health=HealthConfig(backend="sim"))
    assert "pre-flight diagnostics (level 1 + SDC) before each start" in watchers(sim, heartbeats=True)
    off = SupervisorConfig(launch, health=HealthConfig(backend="sim", preflight=False))
    assert "no pre-flight diagnostics (--no-preflight)" in watchers(off, heartbeats=True)
    none = SupervisorConfig(launch)
    assert "no pre-flight diagnostics (no GPU backend" in watchers(none, heartbeats=False)
    nvml = SupervisorConfig(launch, health=HealthConfig(backend="nvml"))
    assert "no pre-flight diagnostics (the nvml backend did not open)" in watchers(
        nvml, True, backend_open=False
    )


def test_a_degraded_gpu_that_passes_diagnostics_keeps_training_and_asks_for_a_checkpoint(tmp_path):
    from trainguard.control import read_control
    from trainguard.records import Health

    clock = VirtualClock()
    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "train.py"), nproc_per_node=3, standalone=True, monitor_interval=0.5),
        RecordConfig(job_id="simjob", runs_root=tmp_path / "runs", db=tmp_path / "tg.db"),
        WatchConfig(tee=False),
        HealthConfig(backend="sim", health_interval=0.5, preflight=False),
    )
    # Diagnostics measure the GPU as degraded, not failed: it stays in service.
    sup = Supervisor(config, diagnose=lambda gpu: Health.DEGRADED, clock=clock.time, sleep=clock.sleep)
    events = []
    sup._on_event = events.append

    def script(w: ShrinkingWorkers, t: float) -> dict[int, int | None]:
        if w.attempt == 0 and t < 30.0:
            if t >= 1.0 and not w.stuck:
                w.stuck = True
                sup.health.sim.now().straggler(gpu=2)  # clocks stuck at half: telemetry degrades
            return dict.fromkeys(range(w.n))
        return dict.fromkeys(range(w.n), 0)

    workers = ShrinkingWorkers(clock, script, sup.run_dir, 3)
    workers.stuck = False
    sup.started = clock.now
    assert sup.monitor(workers) is True
    assert workers.sizes == [3]  # never restarted, never shrunk
    [incident] = [i for i in sup.recorder.incidents if i.gpu == 2]
    assert incident.action == "continue" and "checkpoint now" in incident.evidence[0]
    control = read_control(sup.run_dir)
    assert control is not None and control.save_now == control.seq and control.attempt == 0
    assert "GPU 2 is degraded" in control.reason
    assert [e.data["seq"] for e in events if e.kind == "checkpoint_requested"] == [control.seq]
