"""The seam into PyTorch's elastic launcher: a `LocalElasticAgent` whose monitor loop is ours.

torch.distributed.elastic keeps doing what it does well and what every torchrun user relies on:
the c10d rendezvous (membership, MIN:MAX nodes, re-rendezvous on restart), rank assignment, the
worker environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...), process start and teardown.
We override three seams:

- ``_invoke_run``: the monitor loop, handed to the `Supervisor` (heartbeats, logs, node health,
  policy) instead of "restart on any failure until max_restarts";
- ``_start_workers``: the same environment torch builds, plus TRAINGUARD_RUN_DIR,
  TRAINGUARD_ATTEMPT and the GPU mapping after exclusions (CUDA_VISIBLE_DEVICES); processes come
  from a warm standby pool when one is configured;
- ``_stop_workers``: failed workers are killed at once (their state is rolled back to the last
  checkpoint anyway) instead of a 30 s SIGTERM grace that a rank stuck in a collective ignores;
  it returns only once they are reaped, so no worker of the stopped attempt outlives it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import start_processes
from torch.distributed.elastic.utils import macros

from trainguard.supervisor.ports import private_port

log = logging.getLogger(__name__)

REAP_TIMEOUT_S = 30.0  # after torch's SIGKILL: how long a stopped worker may take to be reaped
Loop = Callable[["GuardedAgent"], RunResult]
EnvHook = Callable[[int, dict[str, str]], None]  # (local_rank, env) -> None, edits env in place


class GuardedAgent(LocalElasticAgent):
    def __init__(
        self, spec: Any, logs_specs: Any, loop: Loop, env_hook: EnvHook, pool: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(spec, logs_specs, **kwargs)
        self._loop = loop
        self._env_hook = env_hook
        self._pool = pool  # WarmPool or None
        self.stop_grace_s: float = 0.0

    # -- the three seams ---------------------------------------------------------------------

    def _invoke_run(self, role: str = "default") -> RunResult:
        return self._loop(self)

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        if self.stop_grace_s > 0:  # SIGTERM, then torch's own SIGKILL after the grace
            self._shutdown(signal.SIGTERM, timeout=self.stop_grace_s)  # type: ignore[arg-type]
        else:
            self._shutdown(signal.SIGKILL, timeout=5)
        # torch gives up on a worker that outlives its SIGKILL wait (uninterruptible sleep); the
        # next attempt must not start beside it, so wait longer here before reporting it.
        for local_rank, proc in self.procs().items():
            try:
                proc.wait(REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error(
                    "local rank %s (pid %s) survived SIGKILL; starting without it", local_rank, proc.pid
                )

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        spec = worker_group.spec
        if worker_group.store is None:
            raise AssertionError("rendezvous did not produce a store")
        restart_count = spec.max_restarts - self._remaining_restarts
        master_port = worker_group.master_port
        if worker_group.group_world_size == 1 and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
            master_port = private_port()  # one node: only its own workers use their store
        args: dict[int, tuple[Any, ...]] = {}
        envs: dict[int, dict[str, str]] = {}
        for worker in worker_group.workers:
            local_rank = worker.local_rank
            # The same variables LocalElasticAgent._start_workers sets (torch 2.x).
            env: dict[str, Any] = {
                "RANK": str(worker.global_rank),
                "GROUP_RANK": str(worker_group.group_rank),
                "ROLE_RANK": str(worker.role_rank),
                "ROLE_NAME": spec.role,
                "LOCAL_WORLD_SIZE": str(spec.local_world_size),
                "WORLD_SIZE": str(worker.world_size),
                "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
                "ROLE_WORLD_SIZE": str(worker.role_world_size),
                "MASTER_ADDR": worker_group.master_addr,
                "MASTER_PORT": str(master_port),
                "TORCHELASTIC_RESTART_COUNT": str(restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
                "TORCHELASTIC_USE_AGENT_STORE": str(spec.rdzv_handler.use_agent_store),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            }
            self._set_local_rank_env(env, local_rank, spec)
            if "OMP_NUM_THREADS" in os.environ:
                env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
            self._env_hook(local_rank, env)
            envs[local_rank] = env
            args[local_rank] = tuple(macros.substitute(list(spec.args), str(local_rank)))
        if self._pool is not None and self._pool.can_run(spec.entrypoint, args[0]):
            self._pcontext = self._pool.start(spec.role, spec.entrypoint, args, envs, self._logs_specs)
        else:
            self._pcontext = start_processes(
                name=spec.role,
                entrypoint=spec.entrypoint,
                args=args,
                envs=envs,
                logs_specs=self._logs_specs,
                start_method=self._start_method,
            )
        return self._pcontext.pids()

    # -- primitives the Supervisor's loop uses -------------------------------------------------

    @property
    def group(self) -> WorkerGroup:
        return self._worker_group

    def start_group(self) -> None:
        """Rendezvous, then start this node's workers (torch's own _initialize_workers)."""
        self._initialize_workers(self._worker_group)

    def restart_group(self, counts_as_retry: bool) -> None:
        """Stop, re-rendezvous and start again. Only counted retries use torch's restart budget
        (and bump TORCHELASTIC_RESTART_COUNT); membership changes and exclusions are free."""
        if counts_as_retry and self._remaining_restarts > 0:
            self._remaining_restarts -= 1
        self._restart_workers(self._worker_group)

    def stop_group(self) -> None:
        self._stop_workers(self._worker_group)
        self._worker_group.state = WorkerState.STOPPED

    def exit_codes(self) -> dict[int, int | None]:
        """Exit code per local rank (None while running; negative = killed by that signal)."""
        ctx = self._pcontext
        if ctx is None:
            return {}
        handlers = getattr(ctx, "subprocess_handlers", {})
        return {lr: h.proc.poll() for lr, h in handlers.items()}

    def procs(self) -> dict[int, Any]:
        """Process handle (a Popen) per local rank: signal workers through these, never by pid."""
        ctx = self._pcontext
        handlers = getattr(ctx, "subprocess_handlers", {}) if ctx is not None else {}
        return {lr: h.proc for lr, h in handlers.items()}

    def pids(self) -> dict[int, int]:
        """pid per local rank."""
        return dict(self._pcontext.pids()) if self._pcontext is not None else {}

    def nodes_waiting(self) -> int:
        try:
            return int(self._worker_group.spec.rdzv_handler.num_nodes_waiting())
        except Exception:  # the store may be gone while the job shuts down
            return 0

    def exit_barrier(self) -> None:
        self._exit_barrier()
