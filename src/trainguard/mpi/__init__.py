"""The MPI side of trainguard: what runs with each rank that ``mpirun`` or ``srun`` starts.

Stdlib only (no mpi4py: the rank's own program loads its MPI). `trainguard.mpi.rank` is the
per-rank wrapper the supervisor's MPI launchers put before the worker command; `identity` reads
which rank a process is from the launcher's environment (Open MPI, MPICH/Hydra, Slurm)::

    >>> identity({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    ...           "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    RankIdentity(rank=3, local_rank=1, world_size=4, local_world_size=2, source='Open MPI')
"""

from __future__ import annotations

from trainguard.mpi.identity import RankIdentity, identity

__all__ = ["RankIdentity", "identity"]
