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

``--nproc-per-node 1``: one process over every GPU of the job (``MirroredStrategy``), with no
TF_CONFIG (one in the supervisor's own environment describes another cluster and is dropped). A
GPU the policy excludes after a fault is left out of ``CUDA_VISIBLE_DEVICES`` (PCI order, NVML's
numbering) at the next start; its findings name no GPU of their own (``TRAINGUARD_GPU`` is
unset): the process runs on all of them.

    >>> json.loads(tf_config([5001, 5002], 1))["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

from trainguard.supervisor.launch import LaunchJob, WorkerEnv
from trainguard.supervisor.local import LocalLauncher, LocalWorkers
from trainguard.supervisor.ports import private_port

__all__ = ["TfLauncher", "TfWorkers", "fresh_ports", "tf_config"]

TF_CONFIG = "TF_CONFIG"


def tf_config(ports: list[int], index: int, host: str = "127.0.0.1") -> str:
    """The TF_CONFIG of worker ``index`` of a one-node cluster on ``ports``."""
    cluster = {"worker": [f"{host}:{p}" for p in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


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
        self.used: set[int] = set()  # every port an earlier start gave out
        super().__init__(replace(job, worker_env=self._env(job)), self._rank_env, None)

    def start(self, local_world_size: int | None = None) -> None:
        """``local_world_size`` is the number of GPUs the supervisor hands out: one worker each,
        or all of them to the one process."""
        n = local_world_size if local_world_size is not None else self.job.config.launch.nproc_per_node
        if not self.one_process:
            self.ports = fresh_ports(n, self.used)
        super().start(1 if self.one_process else n)

    def _rank_env(self, local_rank: int, world_size: int, env: dict[str, str]) -> None:
        if self.one_process:
            env.pop(TF_CONFIG, None)
        else:
            env[TF_CONFIG] = tf_config(self.ports, local_rank)

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

    def workers(self, job: LaunchJob) -> LocalWorkers:
        return TfWorkers(job)
