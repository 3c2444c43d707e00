"""torch's elastic agent as a `Launcher` (``--launcher torch``, the default): the job as torchrun runs it.

Torch-free until it launches: `TorchElastic.check` says how to install torch when it is missing,
`torchrun_argv` is the job's torchrun command line, and `launch` hands both to
`supervisor.elastic.launch` (torch's own ``launch_agent`` with our monitor loop), with warm
standbys (`supervisor.warm`) filling once the first attempt has settled (its first step): the
first start is cold, as torchrun's, and no standby imports torch beside its ranks.
"""

from __future__ import annotations

import importlib.util
import os

from trainguard.errors import MissingDependency
from trainguard.supervisor.config import SupervisorConfig
from trainguard.supervisor.launch import LaunchJob, Monitor

__all__ = ["TorchElastic", "torchrun_argv"]

INSTALL_HINT = "pip install 'trainguard[torch]'"


class TorchElastic:
    """Workers started and restarted by torch's elastic agent (`elastic.GuardedAgent`)."""

    name = "torch"

    def check(self) -> None:
        if importlib.util.find_spec("torch") is None:
            raise MissingDependency(f"trainguard run launches workers with torch: {INSTALL_HINT}")

    def launch(self, job: LaunchJob, monitor: Monitor) -> str | None:
        cfg = job.config
        try:
            from trainguard.supervisor.elastic import launch
            from trainguard.supervisor.logs import make_logs_specs
        except ImportError as exc:
            raise MissingDependency(f"trainguard run needs torch ({exc}): {INSTALL_HINT}") from None
        pool = None
        spares = cfg.launch.nproc_per_node * cfg.standby.sets  # filled once the first attempt settled
        if cfg.standby.enabled:
            from trainguard.supervisor.warm import WarmPool

            pool = WarmPool(
                cfg.standby.preload,
                refill_delay_s=cfg.standby.refill_delay_s,
                refill_nice=cfg.standby.refill_nice,
            )
            if cfg.standby.fill_at_start or cfg.launch.spare:  # they import while the rendezvous runs
                pool.fill(spares)
                spares = 0
        # Workers host a fresh TCPStore per attempt (torch's own opt-out of sharing the agent's):
        # a shared store keeps the dead attempt's gloo addresses, and a restarted rank that reads
        # a stale peer address before the peer rewrites it times out connecting.
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        try:
            return launch(
                torchrun_argv(cfg, job.job_id),
                monitor,
                job.worker_env,
                make_logs_specs(job.attempt_dir),
                pool,
                cfg.launch.kill_grace_s,
                spares=spares if pool is not None else 0,
                hot_spare=cfg.launch.spare,
            )
        finally:
            if pool is not None:
                pool.close()


def torchrun_argv(config: SupervisorConfig, job_id: str) -> list[str]:
    """The torchrun command line this job is (after ``torchrun``)."""
    c = config.launch
    argv = ["--nproc-per-node", str(c.nproc_per_node), "--nnodes", c.nnodes]
    argv += [
        "--max-restarts",
        str(config.recovery.max_restarts),
        "--monitor-interval",
        str(c.monitor_interval),
    ]
    if c.standalone:  # what torchrun's run() does for --standalone
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", job_id]
    else:
        argv += ["--rdzv-backend", c.rdzv_backend, "--rdzv-endpoint", c.rdzv_endpoint]
        argv += ["--rdzv-id", c.rdzv_id or job_id]
    if c.rdzv_conf:
        argv += ["--rdzv-conf", c.rdzv_conf]
    return [*argv, *c.extra_torchrun_args, "--no-python", *c.cmd]
