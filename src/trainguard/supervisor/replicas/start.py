"""How the replica loop starts a group: a ``trainguard run`` of its own, from the job's config.

A group's config is the job's (`SupervisorConfig`) with what makes it one group: one node of its
own (standalone) on its GPUs, its job id and run directory under the job's, its result file,
its chaos faults, a hang floor below torchft's timeouts, and at least as many GPUs as it started
with (fewer: it exits NO_CAPACITY and the loop gives it a spare). The command line is that
config's `SupervisorConfig.to_argv`, so every option of the job reaches every group; the
environment (`group_env`) is the job's plus the replica group's and torchft's variables.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from trainguard.procs import parent_death
from trainguard.rundir import replica_group_env
from trainguard.supervisor.config import SupervisorConfig
from trainguard.supervisor.replicas.lighthouse import LighthouseConfig

__all__ = [
    "PEER_WAIT_MARGIN_S",
    "ReplicaConfig",
    "group_config",
    "group_env",
    "group_hang_floor",
    "start_group",
]

PEER_WAIT_MARGIN_S = 5.0  # after a collective timeout: the vote, the next quorum, one step
# `trainguard.torch.site`: a folder, not imported (its sitecustomize runs in the workers)
SITE_DIR = str(Path(__file__).resolve().parents[2] / "torch" / "site")
STOP_WAIT_S = 60.0  # a group's supervisor stops its workers on SIGTERM within this


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    groups: int = 2
    lighthouse: LighthouseConfig = field(default_factory=LighthouseConfig)
    timeout_s: float = 10.0  # torchft's collective/commit timeout (TORCHFT_TIMEOUT_SEC)
    quorum_timeout_s: float = 30.0  # TORCHFT_QUORUM_TIMEOUT_SEC
    quorum_retries: int = 20  # a group survives this many failed quorums (the Lighthouse restarting)
    job_restarts: int = 1  # every group down: restart them all from the checkpoint this often


def group_hang_floor(floor: float, replicas: ReplicaConfig) -> float:
    """A group's hang timeout floor: ``floor`` (``--hang-timeout-floor``), raised past torchft's
    collective timeout and capped at half its quorum timeout. A healthy group waits on a hung or
    slow peer in an all-reduce for up to the collective timeout, then discards the step and goes
    on: below that, the healthy group would be taken for hung and restarted for its peer's fault.
    Under the cap, a hung group is stopped before the quorum times out (the raise wins where the
    two cross)."""
    low = replicas.timeout_s + PEER_WAIT_MARGIN_S
    return max(min(floor, replicas.quorum_timeout_s / 2), low)


def group_config(
    config: SupervisorConfig,
    replicas: ReplicaConfig,
    group: str,
    gpus: tuple[int, ...],
    run_dir: Path,
    result_file: Path,
    chaos: Path | None,
) -> SupervisorConfig:
    """The config of group ``group`` (``g0``, ``g1``...) of the job ``config`` describes."""
    k = config.launch.nproc_per_node
    launch = replace(  # one node with a private rendezvous, as `--standalone` resolves
        config.launch,
        standalone=True,
        nnodes="1:1",
        rdzv_endpoint="localhost:0",
        rdzv_id="none",  # torchrun's "not given"
        rdzv_backend="c10d",
        rdzv_conf="",
        gpus=gpus,
    )
    record = replace(
        config.record,
        job_id=f"{config.resolved_job_id()}.{group}",
        runs_root=run_dir / "groups",
        db=config.resolved_db(),
        result_file=result_file,
    )
    watch = replace(
        config.watch, hang_timeout_floor=group_hang_floor(config.watch.hang_timeout_floor, replicas)
    )
    recovery = replace(config.recovery, min_nproc=k)
    return replace(
        config, launch=launch, record=record, watch=watch, recovery=recovery, chaos=chaos, replica_groups=0
    )


def group_env(
    config: SupervisorConfig, replicas: ReplicaConfig, index: int, lighthouse: str
) -> dict[str, str]:
    """The environment of group ``index``'s ``trainguard run``: the job's, the workers' extra
    variables, the replica group's (`rundir.replica_group_env`) and torchft's, and
    `trainguard.torch.site` first on ``PYTHONPATH``: a worker that imports torchft gets
    `trainguard.torch.ft.patch_torchft` without a line of trainguard in its script."""
    env = {**os.environ, **config.launch.env}
    path = [SITE_DIR, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(path),
        **replica_group_env(index, replicas.groups),
        "TORCHFT_LIGHTHOUSE": lighthouse,
        "TORCHFT_TIMEOUT_SEC": f"{replicas.timeout_s:g}",
        "TORCHFT_QUORUM_TIMEOUT_SEC": f"{replicas.quorum_timeout_s:g}",
        "TORCHFT_QUORUM_RETRIES": str(replicas.quorum_retries),
        "TRAINGUARD_JOB_ID": config.resolved_job_id(),
    }


def start_group(config: SupervisorConfig, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start one group's ``trainguard run`` (SIGTERMed if this process dies: it then stops its
    workers), its output appended to ``log_path``."""
    argv = [sys.executable, "-m", "trainguard.cli", "run", *config.to_argv()]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=parent_death(signal.SIGTERM),
        )


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM a group's ``trainguard run`` (its supervisor stops its workers, then exits)."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
