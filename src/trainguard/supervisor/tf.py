"""``--framework tf``: TensorFlow jobs, as TensorFlow's own launchers start them (no TF imported here).

    trainguard run --framework tf --nproc-per-node 2 -- python train.py                 # 2 workers
    trainguard run --framework tf --nproc-per-node 1 --gpu-ids 0,1,2,3 -- python train.py  # 1 process

``--nproc-per-node N`` (N > 1): N workers of a ``MultiWorkerMirroredStrategy`` job. Worker R gets
``TF_CONFIG`` (the cluster and its task, as torchrun gives RANK), its own GPU only
(``CUDA_VISIBLE_DEVICES``: TensorFlow takes every GPU it sees) and ports fresh for every start:
each a private port (`supervisor.ports`: below the ephemeral range, free when chosen) that no
earlier start of this job used, so a restarted cluster never waits on a port a dying worker
holds or a closed one left in TIME_WAIT. A lost worker restarts every worker (the supervisor's
policy restarts the node's group; TF's collectives cannot go on with fewer), from the newest
valid checkpoint.

``--nnodes N`` (N > 1): the cluster spans N nodes, each running this launcher; their addresses
are exchanged on torch's c10d rendezvous before every start (`supervisor.tf_cluster`), and a
worker lost on any node restarts every node's workers together.

``--nproc-per-node 1``: one process over every GPU of the job (``MirroredStrategy``; across
nodes, one ``MultiWorkerMirroredStrategy`` worker per node over its GPUs), with no TF_CONFIG on one
node (one in the supervisor's own environment describes another cluster and is dropped). A
GPU the policy excludes after a fault is left out of ``CUDA_VISIBLE_DEVICES`` (PCI order, NVML's
numbering) at the next start; its findings name no GPU of their own (``TRAINGUARD_GPU`` is
unset): the process runs on all of them.

    >>> json.loads(tf_config([5001, 5002], 1))["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainguard.errors import MissingDependency
from trainguard.supervisor.launch import LaunchJob, WorkerEnv
from trainguard.supervisor.local import LocalLauncher, LocalWorkers
from trainguard.supervisor.ports import private_port

if TYPE_CHECKING:
    from trainguard.supervisor.launch import Monitor
    from trainguard.supervisor.tf_cluster import TfRendezvous

__all__ = ["TfLauncher", "TfWorkers", "cluster_config", "fresh_ports", "tf_config"]

TF_CONFIG = "TF_CONFIG"


def tf_config(ports: list[int], index: int, host: str = "127.0.0.1") -> str:
    """The TF_CONFIG of worker ``index`` of a one-node cluster on ``ports``."""
    return cluster_config([f"{host}:{p}" for p in ports], index)


def cluster_config(workers: list[str], index: int) -> str:
    """The TF_CONFIG of task ``index`` of the cluster of ``workers`` (host:port each)."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def option(extra: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` (``--node-rank``, ``--local-addr``) among the resolved launcher
    options (None: not given)."""
    return next((v for f, v in itertools.pairwise(extra) if f == flag), None)


def fresh_ports(n: int, used: set[int], rng: random.Random | None = None) -> list[int]:
    """``n`` distinct free private ports, none of them in ``used`` (which they are added to)."""
    rng = rng or random.Random()
    out: list[int] = []
    for _ in range(64 * n):
        if len(out) == n:
            break
        port = private_port(rng)
        if port not in used and port not in out:
            out.append(port)
    if len(out) < n:
        raise RuntimeError(f"found {len(out)} of {n} free ports for the TensorFlow workers")
    used.update(out)
    return out


class TfWorkers(LocalWorkers):
    """`LocalWorkers` that start a TensorFlow job's processes (see the module docstring)."""

    def __init__(self, job: LaunchJob) -> None:
        self.one_process = job.config.launch.nproc_per_node == 1
        self.ports: list[int] = []
        self.used: set[int] = set()  # every port an earlier start gave out (or saw a peer node use)
        self.cluster: list[str] = []  # the last start's workers, every node's, in task order
        self.first = 0  # this node's first task in it
        self.group = 0  # this node's place among the cluster's nodes (GROUP_RANK)
        self.rdzv = rendezvous(job)
        super().__init__(replace(job, worker_env=self._env(job)), self._rank_env, None)

    def start(self, local_world_size: int | None = None) -> None:
        """``local_world_size`` is the number of GPUs the supervisor hands out: one worker each,
        or all of them to the one process."""
        n = local_world_size if local_world_size is not None else self.job.config.launch.nproc_per_node
        if self.rdzv is not None:
            from trainguard.supervisor.tf_cluster import cluster_of

            nodes = self.rdzv.join(self._pick, 1 if self.one_process else n)
            self.cluster, firsts = cluster_of(nodes)
            self.first = firsts[self.rdzv.name]
            self.group = [node.name for node in nodes].index(self.rdzv.name)  # its place in the cluster
            self.used.update(int(a.rsplit(":", 1)[1]) for a in self.cluster)
        elif not self.one_process:
            self.ports = fresh_ports(n, self.used)
            self.cluster, self.first = [f"127.0.0.1:{p}" for p in self.ports], 0
        super().start(1 if self.one_process else n)

    def _pick(self, n: int, avoid: set[int]) -> list[int]:
        self.used |= avoid
        return fresh_ports(n, self.used)

    def _rank_env(self, local_rank: int, world_size: int, env: dict[str, str]) -> None:
        if self.one_process and self.rdzv is None:
            env.pop(TF_CONFIG, None)
            return
        env[TF_CONFIG] = cluster_config(self.cluster, self.first + local_rank)
        if self.rdzv is not None:  # torchrun's variables, for the whole cluster
            env.update(RANK=str(self.first + local_rank), WORLD_SIZE=str(len(self.cluster)),
                       GROUP_RANK=str(self.group))  # fmt: skip

    def ranks(self) -> dict[int, int]:
        return {lr: self.first + lr for lr in self._procs}

    def world_size(self) -> int:
        return len(self.cluster) if self.rdzv is not None else super().world_size()

    def nodes_waiting(self) -> int:
        return self.rdzv.nodes_waiting() if self.rdzv is not None else 0

    def peers(self) -> tuple[str | None, dict[str, tuple[int, ...]]]:
        if self.rdzv is None:
            return None, {}
        from trainguard.supervisor.tf_cluster import cluster_of

        _, firsts = cluster_of(self.rdzv.nodes)
        others = {
            n.name: tuple(range(firsts[n.name], firsts[n.name] + len(n.ports))) for n in self.rdzv.nodes
        }
        others.pop(self.rdzv.name, None)
        return self.rdzv.name, others

    def _env(self, job: LaunchJob) -> WorkerEnv:
        supervisor_env = job.worker_env

        def env(local_rank: int, values: dict[str, str]) -> None:
            supervisor_env(local_rank, values)  # the run dir, the attempt, the job's GPUs
            gpu = values.get("TRAINGUARD_GPU", "")
            if self.one_process:
                if "," in values.get("CUDA_VISIBLE_DEVICES", ""):
                    values.pop("TRAINGUARD_GPU", None)  # the process runs on all of them
            elif gpu.isdigit():
                values["CUDA_VISIBLE_DEVICES"] = gpu  # TF takes every GPU it sees: this one only
                values["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # numbered as NVML numbers them

        return env


class TfLauncher(LocalLauncher):
    """``--framework tf`` (see the module docstring)."""

    name = "tf"

    def check(self) -> None:
        """Nothing to import: the workers import TensorFlow, the supervisor never does (they may
        even run another interpreter)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: TfWorkers | None = None  # the workers launch() drives

    def workers(self, job: LaunchJob) -> LocalWorkers:
        self.started = TfWorkers(job)
        return self.started

    def launch(self, job: LaunchJob, monitor: Monitor) -> str | None:
        """As `LocalLauncher.launch`; on a multi-node job this node then leaves the rendezvous
        (after the others finished too, when its workers did)."""
        finished: list[bool] = []

        def watched(workers: Any) -> bool:
            finished.append(monitor(workers))
            return finished[-1]

        try:
            return super().launch(job, watched)
        finally:
            if self.started is not None and self.started.rdzv is not None:
                self.started.rdzv.close(finished == [True])


def rendezvous(job: LaunchJob) -> TfRendezvous | None:
    """The job's rendezvous when it spans nodes (``--nnodes`` above 1), else None."""
    launch = job.config.launch
    if launch.nnodes in ("1", "1:1"):
        return None
    from trainguard.supervisor.tf_cluster import TfRendezvous

    try:
        import torch.distributed  # noqa: F401  (the rendezvous is torch's)
    except ImportError:
        raise MissingDependency(
            "--framework tf --nnodes N exchanges the workers' addresses on torch's c10d rendezvous: "
            "pip install 'trainguard[torch]'"
        ) from None
    extra = launch.extra_torchrun_args
    rank = option(extra, "--node-rank")
    return TfRendezvous(launch.rdzv_endpoint, launch.rdzv_id or job.job_id, launch.nnodes, launch.rdzv_conf,
                        None if rank is None else int(rank), option(extra, "--local-addr"), os.getpid())  # fmt: skip
