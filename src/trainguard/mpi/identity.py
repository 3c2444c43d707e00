"""Which rank this process is, from the environment its MPI launcher gave it (pure).

    Open MPI     OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE, _LOCAL_SIZE
    MPICH/Hydra  PMI_RANK, MPI_LOCALRANKID, PMI_SIZE, MPI_LOCALNRANKS (Intel MPI too)
    Slurm srun   SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_STEP_TASKS_PER_NODE + SLURM_NODEID

The first launcher whose rank variable is set wins (mpirun inside a Slurm allocation sets both:
mpirun's numbering is the job's). Also the GPU a local rank uses: ``gpu_list`` reads the GPU
list the supervisor hands every node, with per-host lists where a host lost a GPU::

    >>> gpu_list("0,1,2,3", "n2=0,2,3;n3=1", "n2.cluster")
    (0, 2, 3)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankIdentity", "gpu_list", "identity", "tasks_per_node"]

_SOURCES = (
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH", "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE", "MPI_LOCALNRANKS"),
    ("Slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", ""),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RankIdentity:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int | None  # None: the launcher does not say
    source: str


def identity(env: Mapping[str, str]) -> RankIdentity | None:
    """This process's rank, or None when no known MPI launcher started it."""
    for source, rank, local, size, local_size in _SOURCES:
        if not env.get(rank, "").isdigit():
            continue
        n_local: int | None = None
        if local_size and env.get(local_size, "").isdigit():
            n_local = int(env[local_size])
        elif source == "Slurm":
            counts = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "")))
            node = env.get("SLURM_NODEID", "")
            n_local = counts[int(node)] if node.isdigit() and int(node) < len(counts) else None
        return RankIdentity(
            rank=int(env[rank]),
            local_rank=int(env[local]) if env.get(local, "").isdigit() else 0,
            world_size=int(env[size]) if env.get(size, "").isdigit() else int(env[rank]) + 1,
            local_world_size=n_local,
            source=source,
        )
    return None


_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]`` ([] when unreadable)."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        m = _COUNT.match(part.strip())
        if m is None:
            return []
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def gpu_list(default: str, per_host: str, host: str) -> tuple[int, ...]:
    """The GPUs this host's local ranks use, in local-rank order: ``per_host``'s entry for
    ``host`` (``name=0,2;other=1``; the full name or its first label), else ``default``."""
    short = host.split(".", 1)[0]
    chosen = default
    for item in filter(None, per_host.split(";")):
        name, _, gpus = item.partition("=")
        if name.strip() in (host, short):
            chosen = gpus
            break
    return tuple(int(g) for g in chosen.split(",") if g.strip().isdigit())
