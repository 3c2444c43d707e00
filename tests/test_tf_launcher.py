"""``--framework tf`` without TensorFlow: what each worker is started with (TF_CONFIG, its GPUs,
fresh ports per start), and the one-process MirroredStrategy mode's GPUs after an exclusion."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from trainguard.supervisor import LaunchConfig, RecordConfig, SupervisorConfig, WatchConfig
from trainguard.supervisor.health import GpuMap
from trainguard.supervisor.launch import LaunchJob, launcher_for
from trainguard.supervisor.tf import TfWorkers, fresh_ports, tf_config

# A worker that writes down what it was started with, then exits.
ENV_DUMP = (
    "import json, os, sys; keys = ('TF_CONFIG', 'CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'TRAINGUARD_GPU');"
    "json.dump({k: os.environ.get(k) for k in keys}, open(sys.argv[1] + '/' + os.environ['RANK'] + '-' + "
    "os.environ['TRAINGUARD_ATTEMPT'], 'w'))"
)


class Job:
    """What the supervisor hands a launcher: the job's GPUs and attempt, as `_worker_env` sets them."""

    def __init__(self, tmp_path: Path, nproc: int, gpus: tuple[int, ...]) -> None:
        self.gpu_map, self.attempt, self.out = GpuMap(gpus), 0, tmp_path / "seen"
        self.out.mkdir()
        config = SupervisorConfig(
            LaunchConfig(
                cmd=(sys.executable, "-c", ENV_DUMP, str(self.out)), nproc_per_node=nproc, launcher="tf"
            ),
            RecordConfig(job_id="tf", runs_root=tmp_path / "runs"),
            WatchConfig(tee=False),
        )
        self.job = LaunchJob(config, "tf", self.env, lambda: tmp_path / "logs" / f"attempt{self.attempt}")

    def env(self, local_rank: int, env: dict[str, str]) -> None:
        env["TRAINGUARD_ATTEMPT"] = str(self.attempt)
        env.update(self.gpu_map.cuda_env())
        env["TRAINGUARD_GPU"] = str(self.gpu_map.gpu_of(local_rank))

    def seen(self, workers: TfWorkers, attempt: int) -> dict[int, dict[str, str | None]]:
        deadline = time.monotonic() + 60
        while any(c is None for c in workers.exit_codes().values()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return {
            int(p.name.split("-")[0]): json.loads(p.read_text())
            for p in self.out.iterdir()
            if p.name.endswith(f"-{attempt}")
        }


def test_each_worker_gets_its_task_its_own_gpu_and_ports_no_earlier_start_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["elsewhere:1"]}}')  # the supervisor's own
    job = Job(tmp_path, nproc=2, gpus=(2, 3))
    workers = TfWorkers(job.job)
    workers.start(2)
    first = job.seen(workers, 0)
    configs = {r: json.loads(first[r]["TF_CONFIG"]) for r in (0, 1)}
    assert [c["task"] for c in configs.values()] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    cluster = configs[0]["cluster"]["worker"]
    assert configs[1]["cluster"]["worker"] == cluster and len(set(cluster)) == 2
    assert {r: (first[r]["CUDA_VISIBLE_DEVICES"], first[r]["TRAINGUARD_GPU"]) for r in (0, 1)} == {
        0: ("2", "2"),
        1: ("3", "3"),
    }
    assert first[0]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"

    job.attempt = 1
    workers.restart(True, 2)
    again = json.loads(job.seen(workers, 1)[0]["TF_CONFIG"])["cluster"]["worker"]
    assert not set(again) & set(cluster)  # a dying worker's port, or one in TIME_WAIT, is never reused
    workers.stop()


def test_one_process_runs_on_every_gpu_left_and_drops_a_foreign_tf_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["elsewhere:1"]}}')
    job = Job(tmp_path, nproc=1, gpus=(0, 1, 2, 3))
    workers = TfWorkers(job.job)
    workers.start(4)  # the supervisor hands out four GPUs: all of them to the one process
    assert job.seen(workers, 0) == {
        0: {
            "TF_CONFIG": None,
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "TRAINGUARD_GPU": None,
        }
    }
    job.attempt, job.gpu_map = 1, job.gpu_map.without(2)  # the policy excluded GPU 2
    workers.restart(False, 3)
    assert job.seen(workers, 1)[0]["CUDA_VISIBLE_DEVICES"] == "0,1,3"
    assert list(workers.ranks()) == [0]
    workers.stop()


def test_ports_are_distinct_and_new():
    used = {40000}
    ports = fresh_ports(3, used)
    assert len(set(ports)) == 3 and 40000 not in ports and set(ports) < used
    assert json.loads(tf_config(ports, 2))["cluster"]["worker"][2] == f"127.0.0.1:{ports[2]}"


def test_the_tf_launcher_is_chosen_by_name_and_checks_nothing_the_workers_import():
    launcher = launcher_for("tf")  # (its module imports no third-party module: test_import_boundaries)
    assert launcher.name == "tf"
    launcher.check()  # the workers import TensorFlow, maybe in another interpreter; never the supervisor
