"""The MPI launcher's pure parts: a rank's identity from its launcher's environment, the GPUs of a
host, where the next attempt runs (hosts, slots, -np), and mpirun's command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.errors import ConfigError
from trainguard.incidents.hosts import NodeState
from trainguard.mpi.identity import gpu_list, identity, tasks_per_node
from trainguard.mpi.rank import rank_env, traceback_of
from trainguard.supervisor.mpi_hosts import plan_hosts


def test_the_rank_comes_from_open_mpi_before_slurm() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}  # fmt: skip
    me = identity(env)
    assert me is not None and (me.rank, me.local_rank, me.world_size, me.local_world_size) == (5, 1, 8, 4)
    assert me.source == "Open MPI"


def test_srun_ranks_and_their_node_share() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "7", "SLURM_NODEID": "2",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2),3"}  # fmt: skip
    me = identity(env)
    assert me is not None and (me.rank, me.local_rank, me.world_size, me.local_world_size) == (5, 1, 7, 3)
    assert tasks_per_node("4(x2),bad") == []
    assert identity({"PATH": "/bin"}) is None


def test_a_host_with_a_lost_gpu_gets_its_own_list() -> None:
    assert gpu_list("0,1,2,3", "n2=0,2,3;n3=1", "n3") == (1,)
    assert gpu_list("0,1,2,3", "n2=0,2,3", "n9.cluster.local") == (0, 1, 2, 3)
    assert gpu_list("", "", "n1") == ()


def test_each_local_rank_gets_its_gpu_and_all_of_the_nodes_in_view() -> None:
    me = identity(
        {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}
    )
    assert me is not None
    env = {"TRAINGUARD_MPI_GPUS": "0,2"}
    assert rank_env(me, (0, 2), env) == []
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("3", "1", "4")
    assert (env["CUDA_VISIBLE_DEVICES"], env["TRAINGUARD_GPU"], env["CUDA_DEVICE_ORDER"]) == (
        "0,2",
        "2",
        "PCI_BUS_ID",
    )
    env = {"TRAINGUARD_MPI_GPUS": "0", "TRAINGUARD_GPU": "7"}
    assert rank_env(me, (0,), env) == ["trainguard: local rank 1 has no GPU of its own (this node's: 0)"]
    assert "TRAINGUARD_GPU" not in env


def test_the_last_traceback_of_a_rank_is_its_error() -> None:
    text = (
        'step 19 loss 0.1\nTraceback (most recent call last):\n  File "a.py", line 1, in <module>\n    x()\n'
        "KeyError: 'k'\n\nDuring handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "train.py", line 6, in step\n    raise ValueError("bad batch 20")\n'
        "ValueError: bad batch 20\n"
    )
    exc, message, tb = traceback_of(text)  # type: ignore[misc]
    assert (exc, message) == ("ValueError", "bad batch 20")
    assert tb.startswith("Traceback") and 'File "train.py", line 6, in step' in tb
    assert traceback_of('Traceback (most recent call last):\n  File "x.py", line 1\n') is None
    assert traceback_of("all fine\n") is None


def here(host: str) -> bool:
    return host == "a"


def test_the_next_attempt_leaves_out_drained_and_lost_hosts() -> None:
    states = {
        "b": NodeState("b", gpus=2, out_of_service="drained by remediate: xid 79"),
        "c": NodeState("c", gpus=2),
    }
    plan = plan_hosts([("a", 2), ("b", 2), ("c", 2), ("d", 2)], 8, states, {"d": "mpirun lost it"}, (0, 1),
                      is_here=here, now=0.0)  # fmt: skip
    assert plan.hostfile() == "a slots=2\nc slots=2\n"
    assert plan.np == 4  # -np 8 cut to the slots left
    assert plan.left_out == {"b": "drained by remediate: xid 79", "d": "mpirun lost it"}


def test_an_excluded_gpu_here_costs_this_node_a_slot() -> None:
    plan = plan_hosts([("a", 4), ("c", 4)], None, {}, {}, (0, 2, 3), is_here=here, now=0.0)
    assert plan.hostfile() == "a slots=3\nc slots=4\n" and plan.np == 7
    gone = plan_hosts([("a", 4)], 4, {}, {}, (), is_here=here, now=0.0)
    assert gone.np == 4  # no GPU list: CPU ranks, as asked
    states = {"c": NodeState("c", gpus=4, failed_gpus=(0, 1, 2, 3), health="failed")}
    out = plan_hosts([("c", 4)], 4, states, {}, (0,), is_here=here, now=0.0)
    assert out.np == 0 and out.left_out == {"c": "no healthy GPU left (failed: 0, 1, 2, 3)"}


def test_mpirun_options_are_read_and_the_rest_passed_on(tmp_path: Path) -> None:
    from trainguard.supervisor.mpirun import MpirunArgs, mpirun_argv

    (tmp_path / "hosts").write_text("n1 slots=2\nn2 slots=2\n")
    args = MpirunArgs.parse(["-np", "4", "--map-by", "slot", f"--hostfile={tmp_path / 'hosts'}", "-H", "n3:1",
                             "-x", "NCCL_DEBUG", "--mca", "btl", "self,tcp"])  # fmt: skip
    assert args.np == 4 and args.hosts == (("n1", 2), ("n2", 2), ("n3", 1))
    assert args.rest == ("--map-by", "slot", "-x", "NCCL_DEBUG", "--mca", "btl", "self,tcp")
    argv = mpirun_argv(args, None, 2, tmp_path / "hf", ["TRAINGUARD_RUN_DIR"], ["python", "t.py"], root=True)
    assert argv[:9] == ["mpirun", "--map-by", "slot", "-x", "NCCL_DEBUG", "--mca", "btl", "self,tcp",
                        "--allow-run-as-root"]  # fmt: skip
    assert argv[9:15] == ["-np", "2", "--hostfile", str(tmp_path / "hf"), "-x", "TRAINGUARD_RUN_DIR"]
    assert argv[-5:] == ["-m", "trainguard.mpi.rank", "--", "python", "t.py"]
    assert "--allow-run-as-root" not in mpirun_argv(args, None, 2, None, [], ["x"], root=False)
    with pytest.raises(ConfigError, match="-np 0: give the number of ranks"):
        MpirunArgs.parse(["-np", "0"])
    with pytest.raises(ConfigError, match="--hostfile /nonexistent"):
        MpirunArgs.parse(["--hostfile", "/nonexistent"])


def recorded_starts(monkeypatch) -> list[tuple[list[str], dict[str, str]]]:  # type: ignore[no-untyped-def]
    """Every process started from now on, as (argv, env), none of them run (each "exits" 0)."""
    import subprocess

    started: list[tuple[list[str], dict[str, str]]] = []

    class Recorded:
        pid, returncode = 0, 0

        def __init__(self, argv: list[str], env: dict[str, str], **_kw: object) -> None:
            started.append((argv, env))

        def poll(self) -> int:
            return 0

        def wait(self, _timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    return started


def test_each_attempt_starts_mpirun_with_the_ranks_env_exported(tmp_path: Path, monkeypatch) -> None:
    from trainguard.supervisor import mpirun
    from trainguard.supervisor.config import LaunchConfig, RecordConfig, SupervisorConfig
    from trainguard.supervisor.launch import LaunchJob

    started = recorded_starts(monkeypatch)

    def worker_env(_lr: int, env: dict[str, str]) -> None:
        env.update(TRAINGUARD_RUN_DIR=str(tmp_path / "run"), CUDA_VISIBLE_DEVICES="0,1,2")

    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "t.py"), nproc_per_node=3, launcher="mpirun",
                     launcher_args=("-np", "3", "--bind-to", "core")),
        RecordConfig(db=tmp_path / "none.db"),
    )  # fmt: skip
    attempt = [0]
    job = LaunchJob(config, "j", worker_env, lambda: tmp_path / f"attempt{attempt[0]}")
    workers = mpirun.MpiWorkers(job, mpirun.MpirunArgs.parse(config.launch.launcher_args))
    workers.start(3)
    attempt[0] = 1
    workers.restart(True, 2)  # GPU 2 excluded: one rank less
    (first, env0), (second, env1) = started
    assert first[first.index("-np") + 1] == "3" and second[second.index("-np") + 1] == "2"
    assert "--bind-to" in second and second[second.index("--bind-to") + 1] == "core"
    exported = {second[i + 1] for i, a in enumerate(second) if a == "-x"}
    assert {
        "TRAINGUARD_RUN_DIR",
        "TRAINGUARD_MPI_LOG_DIR",
        "TRAINGUARD_MPI_GPUS",
        "CUDA_VISIBLE_DEVICES",
    } <= exported
    assert (env0["TRAINGUARD_MPI_GPUS"], env1["TRAINGUARD_MPI_GPUS"]) == ("0,1,2", "0,1")
    assert env1["TRAINGUARD_MPI_LOG_DIR"] == str(tmp_path / "attempt1")
    assert second[-5:] == ["-m", "trainguard.mpi.rank", "--", "python", "t.py"]


def test_a_ranks_exit_is_its_record_else_what_mpirun_says(tmp_path: Path) -> None:
    import json
    import signal

    from trainguard.supervisor.mpi_procs import RankFiles

    (tmp_path / "rank0.proc").write_text(json.dumps({"rank": 0, "host": "here", "pid": 1}))
    (tmp_path / "rank0.exit").write_text(json.dumps({"rank": 0, "code": -15, "signal": 15}))
    (tmp_path / "rank1.proc").write_text(json.dumps({"rank": 1, "host": "elsewhere", "pid": 2}))
    files = RankFiles(tmp_path, 3, lambda h: h == "here")
    assert files.exit_codes(None) == {0: -15, 1: None, 2: None}  # mpirun runs: no record, running
    assert files.exit_codes(1) == {0: -15, 1: -signal.SIGKILL, 2: 1}  # started, gone / never started
    assert files.exit_codes(0) == {0: -15, 1: 0, 2: 0}  # mpirun says every rank finished
    assert set(files.procs()) == {0}  # rank 1's pid is another host's
    (tmp_path / "mpirun.log").write_text("ORTE has lost communication with a remote daemon.\n"
                                         "  Remote daemon: [[4390,0],2] on node nodeB\n")  # fmt: skip
    assert list(files.lost_nodes()) == ["nodeB"]


def test_mpirun_options_are_refused_by_the_other_launchers() -> None:
    from trainguard.cli import build_parser
    from trainguard.cli.run import config_from_args

    def config(*argv: str):  # type: ignore[no-untyped-def]
        return config_from_args(build_parser("run").parse_args(["run", *argv, "--", "python", "t.py"]))

    c = config("--launcher", "mpirun", "-np", "4", "--oversubscribe", "-x", "NCCL_DEBUG")
    assert c.launch.nproc_per_node == 4 and c.launch.launcher_args == (
        "-np",
        "4",
        "--oversubscribe",
        "-x",
        "NCCL_DEBUG",
    )
    with pytest.raises(
        ConfigError, match="-np: an option of mpirun or srun, which --launcher local does not take"
    ):
        config("--launcher", "local", "-np", "4")


@pytest.mark.parametrize(
    "name", ["trainguard.mpi", "trainguard.mpi.identity", "trainguard.supervisor.mpi_hosts"]
)
def test_docstring_examples_run(name: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
