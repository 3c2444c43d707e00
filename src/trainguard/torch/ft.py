"""trainguard with torchft: replica groups that keep training while a failed one heals.

The only module that imports torchft (``pip install 'trainguard[ft]'``). Under
``trainguard run --replica-groups N`` each group is started with ``REPLICA_GROUP_ID``,
``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE`` set; `manager` builds torchft's `Manager` over
a `TrainState` (a restarted group heals by loading a live peer's state through it), and
`DistributedDataParallel` is torchft's, with a communication hook that survives a failed
cross-group all-reduce::

    state = TrainState(model=model, optimizer=opt)
    mgr = manager(state)                                  # joins the quorum through the Lighthouse
    ddp = DistributedDataParallel(mgr, model)
    while mgr.current_step() < steps:
        opt.zero_grad(); mgr.start_quorum()
        loss = loss_fn(ddp(x), y); loss.backward()
        if mgr.should_commit():                           # False: the step is discarded
            opt.step()

The hook: torchft 0.2.0's ``DistributedDataParallel._comm_hook`` asserts on ``fut._fut`` after
``work.wait()``; when the all-reduce fails (a peer group died or stopped mid-step) the wait
reports the error to the Manager and returns without building the future chain, so the
assertion raises inside the reducer and takes the *healthy* group down. Ours returns the bucket
as it is instead: the Manager has the error, ``should_commit`` says False, and the step is
discarded as torchft intends (docs/no-restart.md has the upstream reproduction).

And the store: each quorum's reconfiguration connects to the quorum's TCPStore, and PyTorch's
client waits for a stopped store's answer with no deadline; ours gives up after torchft's timeout
(`_store_client_within`; docs/no-restart.md).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
import logging
import os
import queue
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

try:
    from torchft import ddp as _ft_ddp
    from torchft import process_group as _ft_pg
    from torchft.manager import TIMEOUT_SEC_ENV, Manager, get_timeout
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL
except ImportError:  # pragma: no cover - exercised without the extra
    raise ImportError("trainguard.torch.ft needs torchft: pip install 'trainguard[ft]'") from None

from trainguard import rundir
from trainguard.rundir import append_discarded, run_dir_from_env

log = logging.getLogger(__name__)


__all__ = ["DistributedDataParallel", "Manager", "manager", "replica_group", "should_save"]


def replica_group() -> tuple[int, int]:
    """(this group's id, number of groups) from ``trainguard run --replica-groups``; (0, 1) alone."""
    return rundir.replica_group() or (0, 1)


def manager(
    state: Any,
    *,
    min_replica_size: int = 1,
    timeout_s: float | None = None,
    quorum_timeout_s: float | None = None,
    quorum_retries: int | None = None,
    **kwargs: Any,
) -> Manager:
    """torchft's Manager for this replica group, healing through ``state`` (a `TrainState` or
    anything with ``state_dict``/``load_state_dict``). Timeouts default to torchft's environment
    (``TORCHFT_TIMEOUT_SEC``, ``TORCHFT_QUORUM_TIMEOUT_SEC``, ``TORCHFT_QUORUM_RETRIES``, which
    ``trainguard run --replica-groups`` sets), else 60 s. Initialises the group's default
    process group first when needed: the Manager joins the group's TCPStore, and the Guard agrees
    on losses within the group over it."""
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    group, _ = replica_group()
    pg = process_group(timeout_s)
    job = os.environ.get("TRAINGUARD_JOB_ID", "train")
    opts: dict[str, Any] = {}
    if timeout_s is not None:
        opts["timeout"] = timedelta(seconds=timeout_s)
    if quorum_timeout_s is not None:
        opts["quorum_timeout"] = timedelta(seconds=quorum_timeout_s)
    if quorum_retries is not None:
        opts["quorum_retries"] = quorum_retries
    return _Manager(
        pg=pg,
        load_state_dict=state.load_state_dict,
        state_dict=state.state_dict,
        min_replica_size=min_replica_size,
        replica_id=f"{job}_{group}",
        **opts,
        **kwargs,
    )


def process_group(timeout_s: float | None = None) -> ProcessGroupGloo | ProcessGroupNCCL:
    """torchft's reconfigurable process group with the Manager's collective timeout (``timeout_s``,
    else ``TORCHFT_TIMEOUT_SEC``, which wins as it does in the Manager; else 60 s). torchft's own
    default is 60 s whatever the Manager's timeout, and the group waits that long in each quorum's
    reconfiguration too (the store and gloo's rendezvous with every member): a peer that joined
    the quorum and then hung held a healthy group there for a minute, where its all-reduce gives
    up on the peer after the collective timeout."""
    default = timedelta(seconds=60 if timeout_s is None else timeout_s)
    timeout = get_timeout(os.environ.get(TIMEOUT_SEC_ENV), default)
    return ProcessGroupNCCL(timeout) if torch.cuda.is_available() else ProcessGroupGloo(timeout)


def _store_client_within(store_addr: str, timeout: timedelta) -> dist.Store:
    """torchft's store client (``torchft.process_group.create_store_client``), given up on after
    ``timeout``. PyTorch's TCPStore client pings the server once connected and waits for the
    answer with no deadline (torch 2.13: a server whose process is stopped accepts the connection
    and never answers), so a group that joined a quorum behind a peer that then hung waited in its
    reconfiguration for good, where torchft meant ``timeout``. The client is built on a daemon
    thread; one that comes too late is dropped, and the thread ends when the peer's process does."""
    built: queue.Queue[Any] = queue.Queue(maxsize=1)

    def build() -> None:
        try:
            built.put(_create_store_client(store_addr, timeout))
        except Exception as e:  # handed to the caller
            built.put(e)

    threading.Thread(target=build, name=f"store-client {store_addr}", daemon=True).start()
    try:
        store = built.get(timeout=timeout.total_seconds())
    except queue.Empty:
        raise TimeoutError(
            f"the quorum's store at {store_addr} did not answer in {timeout.total_seconds():g}s "
            "(its process is stopped or hung)"
        ) from None
    if isinstance(store, Exception):
        raise store
    return store


# torchft's process groups call the module's function by name (ProcessGroupWrapper.configure);
# a reload of this module wraps torchft's own again, not the wrapper.
_create_store_client = getattr(_ft_pg.create_store_client, "__wrapped__", _ft_pg.create_store_client)
_store_client_within.__wrapped__ = _create_store_client  # type: ignore[attr-defined]
_ft_pg.create_store_client = _store_client_within


class _Manager(Manager):
    """torchft's Manager that writes each step its group discards into the run directory
    (``rundir.append_discarded``, group rank 0), for the job's ledger: ``trainguard run
    --replica-groups`` charges the step's time to lost work and counts it in the report."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tg_run_dir = run_dir_from_env()
        self._tg_rank = int(os.environ.get("RANK", "0"))
        self._tg_since = time.time()  # the current step's try began here (its quorum)

    def start_quorum(self, *args: Any, **kwargs: Any) -> None:
        self._tg_since = time.time()
        super().start_quorum(*args, **kwargs)

    def should_commit(self, *args: Any, **kwargs: Any) -> bool:
        step = self.current_step()
        ok = bool(super().should_commit(*args, **kwargs))
        now = time.time()
        if not ok and self._tg_run_dir is not None and self._tg_rank == 0:
            try:
                append_discarded(self._tg_run_dir, self._tg_rank, step, self._tg_since, now)
            except OSError:
                log.debug("could not record discarded step %d", step, exc_info=True)
        return ok


def should_save(mgr: Manager) -> bool:
    """True in the one group that takes durable checkpoints: the lowest-numbered participant,
    so a checkpoint is written by one group at a time and by a live one."""
    return mgr.participating_rank() == 0


class DistributedDataParallel(_ft_ddp.DistributedDataParallel):
    """torchft's DDP whose communication hook discards a step whose all-reduce failed, instead of
    raising (see the module docstring)."""

    @staticmethod
    def _comm_hook(state: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        work = state.allreduce(buffer)
        work.wait()
        inner = getattr(work.get_future(), "_fut", None)
        if inner is not None:
            return inner
        if state.errored() is None:  # nothing reported the failure: make sure the step is discarded
            state.report_error(RuntimeError("cross-group all-reduce returned no result"))
        log.warning("cross-group all-reduce failed; step %d is discarded", state.current_step())
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buffer)
        return done
