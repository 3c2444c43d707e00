"""torch's elastic agent under the supervisor: torchrun's own code path, with our monitor loop.

The torch half of the ``torch`` launcher (`supervisor.torchrun.TorchElastic`); its agent is the
`Workers` handle the monitor loop drives (`supervisor.launch`).

`launch` parses the torchrun options with torchrun's parser and runs torch's ``launch_agent``
(what ``torchrun`` itself runs), so every option means what it means there: rendezvous,
``--master-addr/--master-port``, ``--start-method``, NUMA binding, log line prefixes,
``--shutdown-timeout``, the local watchdog and health check, ``--signals-to-handle``. The agent
it builds is a `GuardedAgent`, a ``LocalElasticAgent`` with these hooks:

- ``_invoke_run``: the monitor loop is the `Supervisor`'s (heartbeats, logs, node health, policy)
  instead of "restart on any failure until max_restarts";
- ``_set_local_rank_env``: after torch's worker environment, ours (run directory, attempt, the
  GPU mapping after exclusions);
- the process start inside torch's ``_start_workers``: a warm standby takes the rank when one
  can, and every worker gets a parent-death signal (it dies with the supervisor, even a SIGKILLed
  one);
- ``_stop_workers``: failed workers are killed at once (their state is rolled back to the last
  checkpoint anyway) instead of a 30 s SIGTERM grace that a rank stuck in a collective ignores;
  it returns only once they are reaped, so no worker of the stopped attempt outlives it.

A hot spare (``trainguard run --spare``) is the same agent on a node that joins once the job's
first round is complete: torch's c10d rendezvous then keeps it in the round's redundancy list
(no join timeout, not counted by ``num_nodes_waiting``, so it triggers no restart), and admits it
at the next round a participant is missing from. `GuardedAgent.start` waits for that first round
and turns the job's end (a closed rendezvous, or its store gone) into `SpareReleased`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server import local_elastic_agent
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import start_processes
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _remove_participant_epilogue
from torch.distributed.launcher import api as launcher_api
from torch.distributed.run import config_from_args, get_args_parser

from trainguard.procs import DIE_WITH_PARENT_EXEC, stop_signals
from trainguard.supervisor.launch import SpareReleased
from trainguard.supervisor.ports import private_port

log = logging.getLogger(__name__)

SPARE_POLL_S = 1.0  # a spare's look at the rendezvous while the job's first round forms (torch polls 1 s)
DROP_TRIES = 5  # compare-and-set rounds to take a lost node out of the rendezvous
REAP_TIMEOUT_S = 30.0  # after torch's SIGKILL: how long a stopped worker may take to be reaped
EXIT_BARRIER_TIMEOUT_S = 60.0

Monitor = Callable[["GuardedAgent"], bool]  # the loop: True when every worker finished
EnvHook = Callable[[int, dict[str, str]], None]  # (local_rank, env) -> None, edits env in place


class Stopped(Exception):
    """The supervisor's policy stopped the job (crash loop, budget, capacity)."""


class GuardedAgent(LocalElasticAgent):
    def __init__(
        self,
        *,
        monitor: Monitor,
        env_hook: EnvHook,
        pool: Any = None,
        spares: int = 0,
        hot_spare: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._monitor = monitor
        self._hot_spare = hot_spare  # this node waits as a spare until the job needs it
        self._env_hook = env_hook
        self._pool = pool  # WarmPool or None
        self._spares = spares  # standbys the pool is filled with once an attempt has settled
        self.stop_grace_s: float = 0.0
        self._store_port: int | None = None  # this start's MASTER_PORT when not torch's
        # the TCPStore this agent hosts for this start's workers; never torch's own ``_store``
        # (the rendezvous'), which its exit barrier waits on
        self._worker_store: Any = None
        self._agent_store = False  # this start's workers use a store an agent hosts

    # -- torch's hooks -------------------------------------------------------------------------

    def _invoke_run(self, role: str = "default") -> RunResult:
        if not self._monitor(self):
            raise Stopped
        self._exit_barrier()
        return RunResult(
            WorkerState.SUCCEEDED, dict.fromkeys(w.global_rank for w in self._worker_group.workers)
        )

    def _set_local_rank_env(self, worker_env: dict[str, str | None], local_rank: int, spec: Any) -> None:
        super()._set_local_rank_env(worker_env, local_rank, spec)
        if self._store_port is not None:
            worker_env["MASTER_PORT"] = str(self._store_port)
        if self._agent_store:
            worker_env["TORCHELASTIC_USE_AGENT_STORE"] = str(True)
        self._env_hook(local_rank, worker_env)  # type: ignore[arg-type]

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        # the last start's is done
        self._store_port, self._worker_store, self._agent_store = None, None, False
        # Not with a rendezvous whose workers always use the agent's store (static: its TCPStore
        # on --master-port). Otherwise each start's workers get a fresh store, hosted here (node
        # 0's agent): no key of a dead attempt in it, and it is up before any worker, so a
        # process that only connects to it (torchft's Manager, before or without
        # init_process_group) finds it, as under torchrun's shared store. One node: on a
        # private port only its own workers use.
        own_store = not worker_group.spec.rdzv_handler.use_agent_store
        if own_store and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1":
            if worker_group.group_world_size == 1:
                self._store_port = private_port()
            self._agent_store = True
            port = self._store_port or worker_group.master_port
            if worker_group.group_rank == 0 and worker_group.master_addr and port:
                self._worker_store = TCPStore(
                    worker_group.master_addr, port, is_master=True, wait_for_workers=False
                )
        with _swapped(local_elastic_agent, "start_processes", self._start_processes):
            return super()._start_workers(worker_group)

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

    def _start_processes(self, **kwargs: Any) -> Any:
        """torch's ``start_processes`` with every argument torch resolved; a warm standby takes
        the ranks when it can run them as torch would (no NUMA binding, no line prefixes)."""
        entrypoint, args = kwargs["entrypoint"], kwargs["args"]
        plain = kwargs.get("numa_options") is None and not kwargs.get("log_line_prefixes")
        if self._pool is not None and plain and self._pool.can_run(entrypoint, args[0]):
            warm = self._pool.start(kwargs["name"], entrypoint, args, kwargs["envs"], kwargs["logs_specs"])
            if warm is not None:
                return warm
        if isinstance(entrypoint, str) and sys.platform == "linux":  # dies with the supervisor
            wrapped = {
                lr: ("-S", "-c", DIE_WITH_PARENT_EXEC, str(os.getpid()), entrypoint, *a)
                for lr, a in args.items()
            }
            kwargs = {**kwargs, "entrypoint": sys.executable, "args": wrapped}
        return start_processes(**kwargs)

    # -- what the Supervisor's loop uses -------------------------------------------------------

    def start(self, local_world_size: int | None = None) -> None:
        """Rendezvous, then start this node's workers (torch's own _initialize_workers); fewer
        than torchrun's ``--nproc-per-node`` when the pre-flight excluded GPUs."""
        if local_world_size is not None:
            self._worker_group.spec.local_world_size = local_world_size
        if not self._hot_spare:
            self._initialize_workers(self._worker_group)
            return
        try:
            self._wait_for_first_round()
            self._initialize_workers(self._worker_group)  # torch's redundancy list until admitted
        except (RendezvousGracefulExitError, RendezvousClosedError) as exc:
            raise SpareReleased(f"the job's rendezvous closed: {exc}") from None
        except RendezvousConnectionError as exc:  # its host (node 0) is gone: the job ended with it
            raise SpareReleased(f"the job's rendezvous store went away: {exc}") from None

    def _wait_for_first_round(self) -> None:
        """Until the job's first round is complete: a spare that joined a forming round would
        take a node's place in it and leave that node waiting as the spare."""
        handler: Any = self._worker_group.spec.rdzv_handler
        holder = handler._state_holder  # torch's c10d/etcd-v2 handler
        while True:
            holder.sync()
            if holder.state.closed:
                raise RendezvousClosedError
            if holder.state.complete or holder.state.round > 0:
                return
            time.sleep(SPARE_POLL_S)

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None:
        """Re-rendezvous and start again with ``local_world_size`` workers. Only counted retries
        use torch's restart budget (and bump TORCHELASTIC_RESTART_COUNT)."""
        if counts_as_retry and self._remaining_restarts > 0:
            self._remaining_restarts -= 1
        self._worker_group.spec.local_world_size = local_world_size
        self._restart_workers(self._worker_group)

    def stop(self) -> None:
        self._stop_workers(self._worker_group)
        self._worker_group.state = WorkerState.STOPPED

    def ranks(self) -> dict[int, int]:
        """local rank -> global rank of the running group."""
        return {w.local_rank: w.global_rank for w in self._worker_group.workers}

    def world_size(self) -> int:
        workers = self._worker_group.workers
        return workers[0].world_size if workers else 0

    def exit_codes(self) -> dict[int, int | None]:
        """Exit code per local rank (None while running; negative = killed by that signal)."""
        return {lr: proc.poll() for lr, proc in self.procs().items()}

    def procs(self) -> dict[int, Any]:
        """Process handle (a Popen) per local rank: signal workers through these, never by pid."""
        ctx = self._pcontext
        handlers = getattr(ctx, "subprocess_handlers", {}) if ctx is not None else {}
        return {lr: h.proc for lr, h in handlers.items()}

    def pids(self) -> dict[int, int]:
        return {lr: proc.pid for lr, proc in self.procs().items()}

    def interrupted(self) -> None:
        raise_swallowed_signal()

    def standbys(self) -> dict[str, int] | None:
        """How the last start's ranks started (ready/importing/fresh standbys); None: cold."""
        use = self._pool.take_use() if self._pool is not None else None
        return use.to_dict() if use is not None else None

    def settled(self) -> None:
        """Fill the pool, once: its standbys importing torch beside the first start's ranks would
        take the cores those import on (on 2 cores, the job's first step came later than under
        torchrun). Later refills are the pool's own, after each warm start."""
        if self._pool is not None and self._spares:
            self._pool.fill(self._spares)
            self._spares = 0

    def peers(self) -> tuple[str | None, dict[str, tuple[int, ...]]]:
        """This node's rendezvous name and the other nodes' (``<host>_<pid>_<n>``, as torch's
        "Detected dead node" names them) -> their global ranks: the round's participants (node
        rank each) and the local world sizes torch's rank assignment shared in the store.
        (None, {}) for a rendezvous that does not say."""
        group = self._worker_group
        try:
            handler: Any = group.spec.rdzv_handler  # torch's dynamic handler keeps the round private
            participants = handler._state_holder.state.participants  # c10d / etcd-v2 rendezvous
            me = str(handler._this_node)
            if len(participants) < 2:
                return me, {}
            keys = [f"torchelastic/role_info/{i}" for i in range(len(participants))]
            sizes = [json.loads(b)["local_world_size"] for b in cast(Any, group.store).multi_get(keys)]
        except Exception as exc:  # a static rendezvous, or a store gone while the job ends
            log.debug("the rendezvous does not name the other nodes: %s", exc)
            return None, {}
        base = [sum(sizes[:i]) for i in range(len(sizes))]
        out = {
            str(n): tuple(range(base[r], base[r] + sizes[r]))
            for n, r in participants.items()
            if r < len(sizes)
        }
        out.pop(me, None)
        return me, out

    def drop_peers(self, nodes: Sequence[str]) -> list[str]:
        """`drop_from_rendezvous` on this agent's rendezvous: called with the peers this node's
        failed ranks lost their connection to, just before this node re-joins."""
        return drop_from_rendezvous(self._worker_group.spec.rdzv_handler, nodes)

    def nodes_waiting(self) -> int:
        try:
            return int(self._worker_group.spec.rdzv_handler.num_nodes_waiting())
        except Exception:  # the store may be gone while the job shuts down
            return 0


def drop_from_rendezvous(handler: Any, nodes: Sequence[str]) -> list[str]:
    """Remove ``nodes`` (``<host>_<pid>_<n>``) from the handler's rendezvous round, as torch's own
    sweep does once their keep-alive heartbeats expire (``keep_alive_interval *
    keep_alive_max_attempt``, 15 s by default), so the next round forms without waiting for that.
    A node taken out that is in fact alive re-joins the next round (or waits as a spare), as after
    a keep-alive it missed. The write is the store's compare-and-set, retried on a race. The nodes
    it took out; [] for a rendezvous that does not keep this state (its keep-alive decides)."""
    try:
        holder, settings, me = handler._state_holder, handler._settings, handler._this_node
        for _ in range(DROP_TRIES):
            holder.sync()
            state = holder.state
            gone = [n for n in state.participants if str(n) in nodes and n != me]
            if not gone:
                return []
            for n in gone:
                del state.participants[n]
                state.last_heartbeats.pop(n, None)
            _remove_participant_epilogue(state, settings)
            holder.mark_dirty()
            if holder.sync():
                log.info("took lost node(s) %s out of the rendezvous", ", ".join(map(str, gone)))
                return [str(n) for n in gone]
    except Exception as exc:
        log.debug("could not take nodes out of the rendezvous: %s", exc)
    return []


def launch_config(torchrun_argv: list[str]) -> tuple[Any, Any, list[str]]:
    """torchrun's (LaunchConfig, entrypoint, arguments) for ``torchrun TORCHRUN_ARGV``."""
    args = get_args_parser().parse_args(torchrun_argv)
    if args.master_port is None:  # what torchrun's run() does
        args.master_port = 29500
    return config_from_args(args)


def launch(
    torchrun_argv: list[str],
    monitor: Monitor,
    env_hook: EnvHook,
    logs_specs: Any,
    pool: Any = None,
    stop_grace_s: float = 0.0,
    spares: int = 0,
    hot_spare: bool = False,
) -> str | None:
    """Run the job as ``torchrun TORCHRUN_ARGV`` would, with a `GuardedAgent`. Returns None when
    the agent's run ended (finished or stopped by the policy), else the signal that ended it."""
    config, entrypoint, cmd_args = launch_config(torchrun_argv)
    config.logs_specs = logs_specs

    def make_agent(**kwargs: Any) -> GuardedAgent:
        agent = GuardedAgent(
            monitor=monitor, env_hook=env_hook, pool=pool, spares=spares, hot_spare=hot_spare, **kwargs
        )
        agent._exit_barrier_timeout = EXIT_BARRIER_TIMEOUT_S
        agent.stop_grace_s = stop_grace_s
        return agent

    # launch_agent is torchrun's own: it builds the WorkerSpec and agent from every option. Its
    # agent class is the one name we swap, for the duration of this call.
    try:
        with _swapped(launcher_api, "LocalElasticAgent", make_agent), _signals_raise():
            launcher_api.launch_agent(config, entrypoint, list(cmd_args))
    except SignalException as exc:
        return exc.sigval.name
    except Stopped:
        pass
    except Exception as exc:
        signalled = _signal_behind(exc)
        if signalled is None:
            raise
        # torch's own handler raised it where torch's code turns it into another error (a
        # metrics wrapper's finally reads a local the signal kept from being set).
        log.warning("stopping on %s (torch reported it as %r)", signalled.name, exc)
        return signalled.name
    return None


def _signal_behind(exc: BaseException) -> signal.Signals | None:
    """The stop signal an error was raised while handling, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SignalException):
            return signal.Signals(seen.sigval)
        seen = seen.__cause__ or seen.__context__
    return None


_received: list[signal.Signals] = []  # the stop signals raised in the main thread, this launch


def raise_swallowed_signal() -> None:
    """Raise again a stop signal received during this launch: reached from the monitor loop, it
    means a handler that keeps the supervisor alive through a failing diagnostic or classifier
    (``except Exception``) swallowed it, and the job must still stop."""
    if _received:
        sig = _received[-1]
        raise SignalException(f"Process {os.getpid()} got signal: {int(sig)}", sigval=sig)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP raise torch's SignalException in the main thread, so the agent stops
    the workers (torch registers the same only when it starts processes itself; warm standbys
    bypass that)."""

    def _raise(signum: int, _frame: Any) -> None:
        _received.append(signal.Signals(signum))
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    _received.clear()
    with stop_signals(_raise):
        yield


@contextlib.contextmanager
def _swapped(module: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
