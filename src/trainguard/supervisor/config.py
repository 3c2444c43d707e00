"""Supervisor configuration and exit codes (stdlib only, so the CLI parses without torch).

`SupervisorConfig` is one frozen value in sections, each a small frozen dataclass:

    launch    how the workers come to life: the command, torchrun's options, the launcher
    record    where the run is recorded: job id, run directories, incident store, result file
    watch     when a rank counts as hung: hang, startup and idle timeouts; the console tee
    health    the node's health: telemetry backend, the node agent, thresholds, pre-flight
    recovery  the policy's limits: restart budget, crash loop, backoff, fewest workers
    standby   warm standby interpreters for fast restarts

``to_argv()`` gives the ``trainguard run`` flags that rebuild the same value (thresholds through
``--set``, the settings file through ``--config``, everything else as flags; a test parses them
back for every flag of ``trainguard run``): the replica loop starts each group with it.

    >>> c = SupervisorConfig(LaunchConfig(cmd=("python", "train.py"), nproc_per_node=2))
    >>> c.to_argv()[:6]
    ['--nproc-per-node', '2', '--nnodes', '1:1', '--monitor-interval', '0.1']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from trainguard.detect.thresholds import Thresholds

__all__ = [
    "ExitCode",
    "HealthConfig",
    "LaunchConfig",
    "RecordConfig",
    "RecoveryConfig",
    "StandbyConfig",
    "SupervisorConfig",
    "WatchConfig",
    "checkpoint_dir_from_cmd",
]


class ExitCode(IntEnum):
    """Exit codes of `trainguard run` (documented in docs/supervisor.md).

    Schedulers should requeue on FAILED and NO_CAPACITY (elsewhere), never on CRASH_LOOP.
    """

    OK = 0  # every worker finished successfully
    FAILED = 1  # the restart budget is used up (or an unrecoverable launcher error)
    USAGE = 2  # bad flags, plan or configuration (the message says what to fix)
    CRASH_LOOP = 3  # the same application error repeated: a bug, do not requeue
    NO_CAPACITY = 4  # too few healthy GPUs/nodes left on this node to continue
    INTERRUPTED = 130  # SIGINT / SIGTERM to the supervisor: workers were stopped


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """How the workers come to life. ``cmd`` is the worker command (``python train.py ...``)."""

    cmd: tuple[str, ...]
    nproc_per_node: int = 1
    nnodes: str = "1:1"  # MIN:MAX nodes (or N), as torchrun
    standalone: bool = False  # single node, private rendezvous on a free port (torchrun's)
    rdzv_endpoint: str = ""  # host:port of the c10d rendezvous
    rdzv_id: str = ""  # shared by every node of the job; also the default job id
    rdzv_backend: str = "c10d"
    rdzv_conf: str = ""  # torchrun's key=value,... rendezvous options (e.g. join_timeout=60)
    monitor_interval: float = 0.1  # seconds between looks at the workers
    extra_torchrun_args: tuple[str, ...] = ()  # any other torchrun flag, passed through
    launcher: str = "torch"  # torch: torch's elastic agent; local: N plain processes (no torch); mpirun
    launcher_args: tuple[str, ...] = ()  # mpirun's own options, as written (-np 4 --hostfile h ...)
    gpus: tuple[int, ...] = ()  # the physical GPUs local ranks use (default 0..nproc-1)
    kill_grace_s: float = 0.0  # SIGTERM grace before SIGKILL when stopping failed workers
    # the exit code of the script's own save-on-SIGTERM (TF's PreemptionCheckpointHandler: 42 off GCP):
    # an exit with it is a preempted save, restarted free, not a crash; None: no such handler
    preemption_exit_code: int | None = None
    spare: bool = False  # a hot spare node: waits, warm, until a round of the job lacks a node
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the workers


@dataclass(frozen=True, slots=True)
class RecordConfig:
    """Where the run is recorded."""

    job_id: str = ""  # default: rdzv_id, else a timestamp
    runs_root: Path = Path("runs")  # run directories: <runs_root>/<job_id>/
    db: str | Path | None = None  # incident store (path or URL); default $TRAINGUARD_DB or ./trainguard.db
    checkpoint_dir: Path | None = None  # default: the worker command's --checkpoint-dir
    result_file: Path | None = None  # the run's result as JSON (`RunResult.to_dict`), at the end


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """When a rank counts as hung, and what the console shows."""

    hang_timeout_floor: float = 30.0  # never call a hang sooner than this many seconds
    hang_step_factor: float = 5.0  # ... nor sooner than this many slowest recent steps
    startup_timeout: float = 300.0  # first heartbeat of an attempt must come within this
    idle_timeout: float = 600.0  # no heartbeats: hung when every rank shows no work this long
    tee: bool = True  # copy worker output to the console with rank prefixes


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """The node's health: where the verdict comes from and how it is judged."""

    backend: str = "none"  # node health telemetry: nvml | sim | none
    kernel_log: Path | None = None  # kernel log for the agent (sim: the simulated node's own file)
    health_interval: float = 0.5  # seconds between node-health ticks
    agent_url: str = ""  # the node agent's API; "" = http://127.0.0.1:9410 when its token is readable (nvml)
    agent_token_file: Path | None = None  # the agent's token; default <agent state dir>/agent.token
    thresholds: Thresholds | None = None  # node-health thresholds (default: Thresholds())
    config_file: Path | None = None  # the settings file given with --config (else $TRAINGUARD_CONFIG)
    preflight: bool = True  # diagnostics (level 1 + SDC) on the GPUs before each (re)start


@dataclass(frozen=True, slots=True)
class RecoveryConfig:
    """The recovery policy's limits (`supervisor.policy.PolicyState`)."""

    max_restarts: int = 3  # restart budget; exclusions and membership changes are free
    crash_loop_after: int = 3  # same app error N times in a row -> exit 3 (before any step: min(2, N))
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    min_nproc: int = 1  # fewest local workers to continue with after excluding GPUs


# Modules standbys import ahead: torch, and torch._dynamo (DDP's constructor imports it: ~3 s).
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "numpy", "trainguard.torch.guard")


@dataclass(frozen=True, slots=True)
class StandbyConfig:
    """Warm standbys: pre-imported spare interpreters that take a restarted rank."""

    enabled: bool = False
    sets: int = 2  # standbys per local rank: restarts in quick succession stay warm
    preload: tuple[str, ...] = PRELOAD
    refill_delay_s: float = 2.0  # seconds after a start before the pool replaces what it gave
    refill_nice: int = 19  # standbys of a fill import at this nice value (0: the job's)
    fill_at_start: bool = False  # fill at launch, not once the first attempt settled (its first step)


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    """Everything `Supervisor` needs, in sections (see the module docstring)."""

    launch: LaunchConfig
    record: RecordConfig = field(default_factory=RecordConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    standby: StandbyConfig = field(default_factory=StandbyConfig)
    chaos: Path | None = None  # chaos plan (TOML)
    replica_groups: int = 0  # N > 0: N torchft replica groups under one Lighthouse (supervisor.replicas)
    replica_group_id: int | None = None  # this node runs its share of group G, which spans nodes
    lighthouse: str = ""  # with replica_group_id: the job's torchft Lighthouse (http://HOST:PORT)

    def resolved_db(self) -> str | Path:
        from trainguard.incidents.backend import default_db

        return self.record.db if self.record.db is not None else default_db()

    def resolved_job_id(self) -> str:
        if self.record.job_id:
            return self.record.job_id
        rdzv_id = self.launch.rdzv_id
        if rdzv_id and rdzv_id != "none":
            return rdzv_id
        import time

        return time.strftime("job-%Y%m%d-%H%M%S")

    def resolved_checkpoint_dir(self) -> Path | None:
        if self.record.checkpoint_dir is not None:
            return self.record.checkpoint_dir
        return checkpoint_dir_from_cmd(self.launch.cmd)

    def to_argv(self) -> list[str]:
        """The ``trainguard run`` arguments (after ``run``) that rebuild this value. The workers'
        extra ``launch.env`` is not a flag: it travels in the environment of the process started
        with these arguments."""
        c, launch, record, watch, health = self, self.launch, self.record, self.watch, self.health
        argv = ["--nproc-per-node", str(launch.nproc_per_node), "--nnodes", launch.nnodes]
        argv += ["--monitor-interval", _num(launch.monitor_interval)]
        if launch.launcher != "torch":
            argv += ["--launcher", launch.launcher]
        argv += [f"--launcher-arg={a}" for a in launch.launcher_args]
        if launch.standalone:
            argv.append("--standalone")
        elif launch.launcher == "torch":
            argv += ["--rdzv-backend", launch.rdzv_backend]
            argv += ["--rdzv-endpoint", launch.rdzv_endpoint] if launch.rdzv_endpoint else []
        elif launch.rdzv_endpoint:  # --framework tf across nodes
            argv += ["--rdzv-endpoint", launch.rdzv_endpoint]
        if launch.spare:
            argv.append("--spare")
        for flag, value in (("--rdzv-id", launch.rdzv_id), ("--rdzv-conf", launch.rdzv_conf)):
            if value and value != "none":  # torchrun's default id
                argv += [flag, value]
        argv += [*launch.extra_torchrun_args, "--kill-grace", _num(launch.kill_grace_s)]
        if launch.preemption_exit_code is not None:
            argv += ["--preemption-exit-code", str(launch.preemption_exit_code)]
        if launch.gpus:
            argv += ["--gpu-ids", ",".join(map(str, launch.gpus))]
        argv += ["--job-id", record.job_id, "--runs-dir", str(record.runs_root)]
        for flag, path in (
            ("--db", record.db),
            ("--checkpoint-dir", record.checkpoint_dir),
            ("--json", record.result_file),
            ("--kernel-log", health.kernel_log),
            ("--agent-token-file", health.agent_token_file),
            ("--config", health.config_file),
            ("--chaos", c.chaos),
        ):
            if path is not None:
                argv += [flag, str(path)]
        argv += ["--hang-timeout-floor", _num(watch.hang_timeout_floor)]
        argv += ["--hang-step-factor", _num(watch.hang_step_factor)]
        argv += ["--startup-timeout", _num(watch.startup_timeout), "--idle-timeout", _num(watch.idle_timeout)]
        argv += [] if watch.tee else ["--no-tee"]
        argv += ["--backend", health.backend, "--health-interval", _num(health.health_interval)]
        argv += ["--agent-url", health.agent_url] if health.agent_url else []
        argv += [f"--set={item}" for item in _settings(health)]
        argv += [] if health.preflight else ["--no-preflight"]
        r = c.recovery
        argv += ["--max-restarts", str(r.max_restarts), "--crash-loop-after", str(r.crash_loop_after)]
        argv += ["--backoff-base", _num(r.backoff_base_s), "--backoff-max", _num(r.backoff_max_s)]
        argv += ["--min-nproc", str(r.min_nproc)]
        s = c.standby
        argv += ["--warm-standby" if s.enabled else "--no-warm-standby", "--warm-standby-sets", str(s.sets)]
        argv += ["--warm-standby-preload", ",".join(s.preload)]
        argv += ["--warm-refill-delay", _num(s.refill_delay_s), "--warm-refill-nice", str(s.refill_nice)]
        argv += ["--warm-fill-at-start" if s.fill_at_start else "--no-warm-fill-at-start"]
        if c.replica_groups:
            argv += ["--replica-groups", str(c.replica_groups)]
        if c.replica_group_id is not None:
            argv += ["--replica-group-id", str(c.replica_group_id)]
        if c.lighthouse:
            argv += ["--lighthouse", c.lighthouse]
        # A first word that is a .py file would be read as torchrun's script: say it is a command.
        script_first = bool(launch.cmd) and launch.cmd[0].endswith(".py")
        return [*argv, *(["--no-python"] if script_first else []), "--", *launch.cmd]


def _num(value: float) -> str:
    return repr(float(value))


def _settings(health: HealthConfig) -> list[str]:
    """``thresholds.NAME=VALUE`` for each threshold that the settings file and the environment
    (what the rebuilt value reads too) would not set to the same value."""
    if health.thresholds is None:
        return []
    from trainguard.config import load
    from trainguard.errors import ConfigError

    try:
        base = load(Thresholds, "thresholds", path=health.config_file)
    except ConfigError:  # the file is gone: every threshold that is not the default
        base = Thresholds()
    out = []
    for f in dataclasses.fields(Thresholds):
        value = getattr(health.thresholds, f.name)
        if value != getattr(base, f.name):
            text = (
                ",".join(map(str, value))
                if isinstance(value, tuple)
                else str(value).lower()
                if isinstance(value, bool)
                else repr(value)
            )
            out.append(f"thresholds.{f.name}={text}")
    return out


def checkpoint_dir_from_cmd(cmd: tuple[str, ...] | list[str]) -> Path | None:
    """The ``--checkpoint-dir X`` / ``--checkpoint-dir=X`` of a worker command, if any."""
    for i, arg in enumerate(cmd):
        for flag in ("--checkpoint-dir", "--checkpoint_dir"):
            if arg == flag and i + 1 < len(cmd):
                return Path(cmd[i + 1])
            if arg.startswith(flag + "="):
                return Path(arg.split("=", 1)[1])
    return None
