"""Sharded checkpoints (FSDP2 / DTensor parameters) through ``torch.distributed.checkpoint``.

Every rank writes its shards with ``dcp.save`` into the same temporary directory; rank 0 adds
``trainer.pt`` (scheduler, scaler, extra, per-rank RNG and sampler states), checksums every file,
writes the manifest (``kind: "dcp"``, ``sharded: true``) and commits with the same atomic rename
as replicated checkpoints. DCP re-shards on load, so a checkpoint resumes at any world size,
including 1 without a process group. Saves on this path are synchronous.

torch's loader unpickles ``.metadata`` with plain ``pickle`` and non-tensor values with
``torch.load(weights_only=False)``: a checkpoint folder would be code the resume runs. So the
load reads ``.metadata`` only as the bytes the verified manifest lists, through an unpickler that
builds checkpoint-metadata classes and nothing else, loads non-tensor values with
``weights_only``, and reads ``trainer.pt`` checked against the manifest.
"""

from __future__ import annotations

import io
import pickle
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import trainguard
from trainguard.checkpoint import (
    ChecksumFile,
    Manifest,
    apply_retention,
    clean_stale,
    commit,
    describe_files,
    new_tmp_dir,
)
from trainguard.errors import CheckpointCorrupt, CheckpointError
from trainguard.torch import dist
from trainguard.torch.loading import read_checked
from trainguard.torch.state import TrainState

if TYPE_CHECKING:
    from trainguard.torch.checkpoint import Checkpointer

TRAINER_FILE = "trainer.pt"


def is_sharded(state: TrainState) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without distributed
        return False
    return any(isinstance(p, DTensor) for p in state.module.parameters())


def _state_dicts(state: TrainState) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    optimizers = [state.optimizer] if state.optimizer is not None else []
    model_sd, optim_sd = get_state_dict(state.module, optimizers)
    return {"model": model_sd, "optim": optim_sd} if optimizers else {"model": model_sd}


def save(ckpt: Checkpointer, step: int, state: TrainState) -> int:
    import torch.distributed.checkpoint as dcp

    rank, world = dist.rank_and_world()
    tmp_name = None
    if rank == 0:
        clean_stale(ckpt.directory)
        tmp_name = str(new_tmp_dir(ckpt.directory, step))
    tmp = Path(dist.broadcast_object(tmp_name))
    started = time.perf_counter()
    dcp.save(_state_dicts(state), checkpoint_id=tmp)
    local = dist.all_gather_object(state.local_state_dict())
    dist.barrier()  # every rank's shards are on disk
    error = None
    if rank == 0:
        try:
            payload = {
                "trainguard": {"format": 1, "step": step, "world_size": world, "sharded": True},
                **state.global_state_dict(include_model=False),
                "local": local,
            }
            sink = ChecksumFile(tmp / TRAINER_FILE)
            torch.save(payload, sink)  # type: ignore[arg-type]  # any object with write() works
            sink.close()
            _commit(ckpt, tmp, step, world, started)
        except Exception as exc:
            error = f"sharded save of step {step} failed: {exc!r}"
    error = dist.broadcast_object(error)  # the commit is visible (or failed) for every rank
    if error:
        raise CheckpointError(error)
    return step


def _commit(ckpt: Checkpointer, tmp: Path, step: int, world: int, started: float) -> None:
    manifest = Manifest(
        step=step,
        files=describe_files(tmp),
        time=time.time(),
        world_size=world,
        sharded=True,
        kind="dcp",
        torch_version=torch.__version__,
        trainguard_version=trainguard.__version__,
    )
    path = commit(tmp, manifest, ckpt.signing_key())
    ckpt.last_result = {
        "step": step,
        "path": str(path),
        "bytes": sum(e.size for e in manifest.files.values()),
        "write_s": time.perf_counter() - started,
        "deleted": apply_retention(ckpt.directory, step, ckpt.keep_last, ckpt.milestone_every),
    }


def load(path: Path, state: TrainState, manifest: Manifest, weights_only: bool = True) -> None:
    """Load the sharded checkpoint at ``path`` that ``manifest`` (verified) describes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from trainguard.torch.dcp_safe import SafeLoadPlanner, VerifiedReader

    rank, _ = dist.rank_and_world()
    sds = _state_dicts(state)
    signed = manifest.signature is not None
    reader = VerifiedReader(path, manifest)  # reads and checks .metadata: CheckpointCorrupt
    try:
        with warnings.catch_warnings():  # loading without a process group is intended here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(sds, storage_reader=reader, planner=SafeLoadPlanner(weights_only=weights_only))
    except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
        raise CheckpointError(f"could not load sharded checkpoint {path}: {exc}") from exc
    optimizers = [state.optimizer] if state.optimizer is not None else []
    set_state_dict(
        state.module, optimizers, model_state_dict=sds["model"], optim_state_dict=sds.get("optim", {})
    )
    entry = manifest.files.get(TRAINER_FILE)
    if entry is None:
        raise CheckpointCorrupt(f"the manifest of {path} lists no {TRAINER_FILE}")
    data = read_checked(path / TRAINER_FILE, entry, signed)
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    except (pickle.UnpicklingError, RuntimeError) as exc:
        raise CheckpointError(
            f"{path / TRAINER_FILE} passed verification but torch.load failed ({exc}); "
            "if it holds custom objects, use Checkpointer(..., weights_only=False)"
        ) from exc
    state.load_global_state_dict(payload, include_model=False)
    local = payload.get("local") or []
    if local:
        state.load_local_state_dict(local[rank] if rank < len(local) else local[0])
