"""Supervisor configuration and exit codes (stdlib only, so the CLI parses without torch).

Launch options mirror torchrun's (they are handed to torchrun's own parser); the rest are the
supervisor's. Precedence: flag > TRAINGUARD_* environment > default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

from trainguard.detect.thresholds import Thresholds


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
class SupervisorConfig:
    """Everything `Supervisor` needs. ``cmd`` is the worker command (``python train.py ...``)."""

    cmd: tuple[str, ...]
    nproc_per_node: int = 1
    nnodes: str = "1:1"  # MIN:MAX nodes (or N), as torchrun
    standalone: bool = False  # single node, private rendezvous on a free port (torchrun's)
    rdzv_endpoint: str = ""  # host:port of the c10d rendezvous
    rdzv_id: str = ""  # shared by every node of the job; also the default job id
    rdzv_backend: str = "c10d"
    rdzv_conf: str = ""  # torchrun's key=value,... rendezvous options (e.g. join_timeout=60)
    max_restarts: int = 3  # restart budget; exclusions and membership changes are free
    monitor_interval: float = 0.1  # seconds between looks at the workers
    extra_torchrun_args: tuple[str, ...] = ()  # any other torchrun flag, passed through
    job_id: str = ""  # default: rdzv_id, else a timestamp
    runs_root: Path = Path("runs")  # run directories: <runs_root>/<job_id>/
    db: str | Path | None = None  # incident store (path or URL); default $TRAINGUARD_DB or ./trainguard.db
    checkpoint_dir: Path | None = None  # default: the worker command's --checkpoint-dir
    hang_timeout_floor: float = 30.0  # never call a hang sooner than this many seconds
    hang_step_factor: float = 5.0  # ... nor sooner than this many slowest recent steps
    startup_timeout: float = 300.0  # first heartbeat of an attempt must come within this
    idle_timeout: float = 600.0  # no heartbeats: hung when every rank shows no work this long
    preflight: bool = True  # diagnostics (level 1 + SDC) on the GPUs before each (re)start
    backend: str = "none"  # node health telemetry: nvml | sim | none
    kernel_log: Path | None = None  # kernel log for the agent (sim: the fleet's own file)
    health_interval: float = 0.5  # seconds between node-health ticks
    agent_url: str = ""  # the node agent's API; "" = http://127.0.0.1:9410 when its token is readable (nvml)
    agent_token_file: Path | None = None  # the agent's token; default <agent state dir>/agent.token
    thresholds: Thresholds | None = None  # node-health thresholds (default: Thresholds())
    chaos: Path | None = None  # chaos plan (TOML)
    crash_loop_after: int = 3  # same application error this many times in a row -> exit 3
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    min_nproc: int = 1  # fewest local workers to continue with after excluding GPUs
    gpus: tuple[int, ...] = ()  # the physical GPUs local ranks use (default 0..nproc-1)
    warm_standby: bool = False  # keep pre-imported spare interpreters for fast restarts
    warm_standby_sets: int = 2  # standbys per local rank: restarts in quick succession stay warm
    warm_refill_delay_s: float = 2.0  # seconds after a start before the pool replaces what it gave
    warm_refill_nice: int = 19  # standbys of a fill import at this nice value (0: the job's)
    # Modules standbys import ahead: torch, and torch._dynamo (DDP's constructor imports it: ~3 s).
    preload: tuple[str, ...] = (
        "torch",
        "torch.distributed",
        "torch._dynamo",
        "numpy",
        "trainguard.torch.guard",
    )
    tee: bool = True  # copy worker output to the console with rank prefixes
    kill_grace_s: float = 0.0  # SIGTERM grace before SIGKILL when stopping failed workers
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the workers

    def resolved_db(self) -> str | Path:
        from trainguard.incidents.store import default_db

        return self.db if self.db is not None else default_db()

    def resolved_job_id(self) -> str:
        if self.job_id:
            return self.job_id
        if self.rdzv_id and self.rdzv_id != "none":
            return self.rdzv_id
        import time

        return time.strftime("job-%Y%m%d-%H%M%S")

    def resolved_checkpoint_dir(self) -> Path | None:
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        return checkpoint_dir_from_cmd(self.cmd)


def checkpoint_dir_from_cmd(cmd: tuple[str, ...] | list[str]) -> Path | None:
    """The ``--checkpoint-dir X`` / ``--checkpoint-dir=X`` of a worker command, if any."""
    for i, arg in enumerate(cmd):
        for flag in ("--checkpoint-dir", "--checkpoint_dir"):
            if arg == flag and i + 1 < len(cmd):
                return Path(cmd[i + 1])
            if arg.startswith(flag + "="):
                return Path(arg.split("=", 1)[1])
    return None
