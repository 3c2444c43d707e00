"""trainguard with torchft: replica groups that keep training while a failed one heals.

The only module that imports torchft (``pip install 'trainguard[ft]'``). Under
``trainguard run --replica-groups N`` each group is started with ``REPLICA_GROUP_ID``,
``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE`` set; `manager` builds torchft's `Manager` over
a `TrainState` (a restarted group heals by loading a live peer's state through it), and
`DistributedDataParallel` is torchft's with a communication hook that averages the gradients
across the groups, then within the group, and survives a failed cross-group all-reduce::

    state = TrainState(model=model, optimizer=opt)
    mgr = manager(state)                                  # joins the quorum through the Lighthouse
    ddp = DistributedDataParallel(mgr, model)
    while mgr.current_step() < steps:
        opt.zero_grad(); mgr.start_quorum()
        loss = loss_fn(ddp(x), y); loss.backward()
        if mgr.should_commit():                           # False: the step is discarded
            opt.step()

Within a group of K ranks (``--nproc-per-node K``) the hook averages each gradient bucket across
the groups through the Manager (group rank r with group rank r of every other group), then over
the group's own process group (the default one, as torch's DDP does): the job is a
data-parallel job of G x K ranks. In that order because the Manager decides per group rank which
groups take part in a step (a healing group's rank contributes zeros, and torchft spreads the
heal sources over the group ranks), so only an average within the group after it leaves every
rank of every group with the same gradient. torchft's own DDP reduces across groups only, so the
K ranks of a group would train K different models; `patch_torchft` (applied to every worker
under ``--replica-groups``: `trainguard.torch.site`) refuses it there with K > 1.

The hook: torchft 0.2.0's ``DistributedDataParallel._comm_hook`` asserts on ``fut._fut`` after
``work.wait()``; when the all-reduce fails (a peer group died or stopped mid-step) the wait
reports the error to the Manager and returns without building the future chain, so the
assertion raises inside the reducer and takes the *healthy* group down. Ours returns the bucket
as it is instead: the Manager has the error, ``should_commit`` says False, and the step is
discarded as torchft intends (docs/no-restart.md has the upstream reproduction). `patch_torchft`
gives torchft's own DDP the same hook, so a script written against torchft alone survives too.

And the store: each quorum's reconfiguration connects to the quorum's TCPStore, and PyTorch's
client waits for a stopped store's answer with no deadline; ours gives up after torchft's timeout
(`_store_client_within`; docs/no-restart.md).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
import functools
import logging
import os
import queue
import threading
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

try:
    from torchft import ddp as _ft_ddp
    from torchft import manager as _ft_manager
    from torchft import process_group as _ft_pg
    from torchft.manager import TIMEOUT_SEC_ENV, Manager, get_timeout
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL
except ImportError:  # pragma: no cover - exercised without the extra
    raise ImportError("trainguard.torch.ft needs torchft: pip install 'trainguard[ft]'") from None

from trainguard import rundir
from trainguard.errors import ConfigError
from trainguard.torch.ft_progress import Progress

log = logging.getLogger(__name__)


__all__ = [
    "DistributedDataParallel",
    "Manager",
    "manager",
    "patch_torchft",
    "replica_group",
    "should_save",
]


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
    process group first when needed: the Manager joins the group's TCPStore, the gradients are
    averaged within the group over it, and the Guard agrees on losses over it."""
    record_progress()
    _init_group()
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
    return Manager(
        pg=pg,
        load_state_dict=state.load_state_dict,
        state_dict=state.state_dict,
        min_replica_size=min_replica_size,
        replica_id=f"{job}_{group}",
        **opts,
        **kwargs,
    )


def _init_group() -> None:
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)


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


def should_save(mgr: Manager) -> bool:
    """True in the one group that takes durable checkpoints: the lowest-numbered participant,
    so a checkpoint is written by one group at a time and by a live one."""
    return mgr.participating_rank() == 0


def _group_size() -> int:
    """Ranks in this replica group: the default process group's, else the launcher's
    ``WORLD_SIZE`` (a torchft script need not initialise the default group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def _reduce(state: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a gradient bucket across the groups (the Manager, per group rank), then within the
    group; a cross-group all-reduce that failed discards the step."""
    buffer = bucket.buffer()
    work = state.allreduce(buffer)
    work.wait()
    inner = getattr(work.get_future(), "_fut", None)
    if inner is None:
        if state.errored() is None:  # nothing reported the failure: make sure the step is discarded
            state.report_error(RuntimeError("cross-group all-reduce returned no result"))
        log.warning("cross-group all-reduce failed; step %d is discarded", state.current_step())
    k = dist.get_world_size() if dist.is_initialized() else 1
    if k == 1:
        if inner is not None:
            return inner
    else:  # every rank of the group runs this for every bucket, failed all-reduce or not
        value = buffer if inner is None else inner.wait()
        dist.all_reduce(value)
        buffer = value.div_(k)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


class DistributedDataParallel(_ft_ddp.DistributedDataParallel):
    """torchft's DDP averaging across the groups and then within the replica group, and
    discarding a step whose cross-group all-reduce failed instead of raising (see the module
    docstring). The group's ranks start from group rank 0's parameters and buffers, as torch's
    DDP broadcasts them."""

    def __init__(self, manager: Manager, module: torch.nn.Module, **kwargs: Any) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _init_group()
        if _group_size() > 1:
            with torch.no_grad():
                for tensor in module.state_dict().values():
                    dist.broadcast(tensor, 0)
        super().__init__(manager, module, **kwargs)

    @staticmethod
    def _comm_hook(state: Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return _reduce(state, bucket)


# -- torchft's own classes, for scripts written against torchft alone -----------------------------

_patched: set[str] = set()


def patch_torchft() -> None:
    """Make torchft's own classes safe under ``trainguard run --replica-groups`` (idempotent):
    its DDP gets the hook that discards a failed step instead of raising; its DDP wrappers are
    refused in a group of more than one rank (they do not average within the group:
    `ddp_refusal`); and every Manager records its steps (`record_progress`)."""
    record_progress()
    if "ddp" in _patched:
        return
    _patched.add("ddp")
    _ft_ddp.DistributedDataParallel._comm_hook = staticmethod(_reduce)
    for upstream in (_ft_ddp.DistributedDataParallel, _ft_ddp.PureDistributedDataParallel):
        upstream.__init__ = _refused_in_groups(upstream.__init__)


def record_progress() -> None:
    """Every torchft Manager records the steps its group discards and, where no Guard writes
    heartbeats, beats once per committed step (`ft_progress.Progress`), so the supervisor sees a
    torchft script's steps (idempotent)."""
    if "manager" in _patched:
        return
    _patched.add("manager")
    _ft_manager.Manager.start_quorum = _around_quorum(_ft_manager.Manager.start_quorum)
    _ft_manager.Manager.should_commit = _around_commit(_ft_manager.Manager.should_commit)


def _refused_in_groups(init: Any) -> Any:
    @functools.wraps(init)
    def checked_init(self: Any, manager: Manager, module: torch.nn.Module, **kwargs: Any) -> None:
        if not isinstance(self, DistributedDataParallel) and _group_size() > 1:
            raise ConfigError(ddp_refusal(type(self).__name__, _group_size(), _caller()))
        init(self, manager, module, **kwargs)

    return checked_init


def ddp_refusal(name: str, k: int, where: str) -> str:
    """The error for torchft's own DDP wrapper ``name`` in a replica group of ``k`` > 1 ranks."""
    return (
        f"{where}: torchft's {name} averages gradients across replica groups only, "
        f"never within one: with {k} ranks per group (--nproc-per-node {k}) each rank would train a "
        "model of its own. Use trainguard's, which also averages within the group and takes the "
        "same arguments: `from trainguard.torch.ft import DistributedDataParallel` in place of "
        "torchft's (or run one rank per group: --nproc-per-node 1)"
    )


def _caller() -> str:
    """The script's line that built the DDP (the first frame outside torch and torchft)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace(os.sep, "/")
        if "/torch/" not in name and "/torchft/" not in name and "/trainguard/" not in name:
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return "DistributedDataParallel(manager, model)"


_progress: dict[int, Progress] = {}  # id(Manager) -> what trainguard records of its steps


def _of(mgr: Any) -> Progress:
    found = _progress.get(id(mgr))
    if found is None or found.owner() is not mgr:
        found = _progress[id(mgr)] = Progress(mgr)
    return found


def _around_quorum(start_quorum: Any) -> Any:
    @functools.wraps(start_quorum)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        _of(self).quorum()
        start_quorum(self, *args, **kwargs)

    wrapped.__wrapped__ = start_quorum
    return wrapped


def _around_commit(should_commit: Any) -> Any:
    @functools.wraps(should_commit)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> bool:
        step = self.current_step()
        ok = bool(should_commit(self, *args, **kwargs))
        _of(self).verdict(step, ok)
        return ok

    wrapped.__wrapped__ = should_commit
    return wrapped
