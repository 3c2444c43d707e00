"""srun's side of an MPI job, pure: the user's srun options, the command line of an attempt, which
Slurm node states keep a step off a node, and the plan of the next step (Slurm's answers given)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from test_mpi_plan import recorded_starts
from trainguard.errors import ConfigError
from trainguard.incidents.hosts import Host
from trainguard.supervisor.mpi_hosts import HostPlan


def test_srun_options_are_read_and_the_rest_passed_on() -> None:
    from trainguard.supervisor.srun import SrunArgs

    a = SrunArgs.parse(["-n", "4", "-wtg[1-2]", "--exclude=tg3", "--mpi=pmix", "-K", "--gpus-per-task", "1"])
    assert (a.ntasks, a.nodelist, a.exclude) == (4, "tg[1-2]", "tg3")
    assert a.rest == ("--mpi=pmix", "--gpus-per-task", "1")  # -K: trainguard sets it
    with pytest.raises(ConfigError, match="srun -n four: give the number of tasks"):
        SrunArgs.parse(["-n", "four"])
    with pytest.raises(ConfigError, match="srun option --nodelist: needs a value"):
        SrunArgs.parse(["--nodelist"])


def test_each_step_ends_on_a_bad_exit_and_runs_where_the_plan_says() -> None:
    from trainguard.supervisor.srun import SrunArgs, srun_argv, task_file

    plan = HostPlan((Host("tg1", 2), Host("tg2", 1)), 3, {"tg3": "Slurm: drained"})
    argv = srun_argv(SrunArgs.parse(["-n", "6", "--mpi=pmix"]), plan, 3, ["python", "t.py"], ["X"])
    assert argv[:8] == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-n", "3", "-N", "2",
                        "--distribution=arbitrary"]  # fmt: skip
    assert argv[argv.index("--") - 3 :] == [
        sys.executable,
        "-m",
        "trainguard.mpi.rank",
        "--",
        "python",
        "t.py",
    ]
    assert task_file(plan) == "tg1\ntg1\ntg2\n"
    chosen = srun_argv(SrunArgs.parse(["-m", "cyclic", "--export=NONE"]), plan, 3, ["t"], ["X", "Y"])
    assert "--nodelist=tg1,tg2" in chosen and "cyclic" in chosen and "--export=X,Y" in chosen
    alone = srun_argv(SrunArgs.parse(["-x", "tg9"]), None, 2, ["t"], [])
    assert "--exclude=tg9" in alone and "-N" not in alone


@pytest.mark.parametrize(
    ("state", "why"),
    [("drained", "Slurm: drained"), ("draining", "Slurm: draining"), ("down", "Slurm: down"),
     ("allocated*", "Slurm: not responding (allocated)"), ("idle", ""), ("mixed", ""), ("allocated", "")],
)  # fmt: skip
def test_slurm_holds_out_drained_down_and_silent_nodes(state: str, why: str) -> None:
    from trainguard.supervisor.srun import held_out

    assert held_out(state) == why


def test_the_next_step_leaves_out_what_slurm_drained_and_srun_lost(tmp_path: Path, monkeypatch) -> None:
    from trainguard.supervisor import srun
    from trainguard.supervisor.config import LaunchConfig, RecordConfig, SupervisorConfig
    from trainguard.supervisor.launch import LaunchJob

    answers = {  # what Slurm's tools say in a 4-node allocation, two tasks a node
        ("scontrol", "show", "hostnames", "tg[1-4]"): "tg1\ntg2\ntg3\ntg4\n",
        ("sinfo", "-h", "-N", "-n", "tg1,tg2,tg3,tg4", "-o", "%N|%n|%T"):
            "tg1|gpu-a01|allocated\ntg2|gpu-a02|draining\ntg3|gpu-a03|allocated\ntg4|gpu-a04|allocated\n",
    }  # fmt: skip
    monkeypatch.setattr(srun, "_slurm", lambda *argv: answers[argv])
    started = recorded_starts(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "tg[1-4]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x4)")
    monkeypatch.setenv("TRAINGUARD_HOST", "gpu-a01")  # the supervisor runs on tg1
    config = SupervisorConfig(
        LaunchConfig(cmd=("python", "t.py"), nproc_per_node=8, gpus=(0, 1), launcher="srun",
                     launcher_args=("-n", "8", "--mpi=pmix")),
        RecordConfig(db=tmp_path / "none.db"),
    )  # fmt: skip
    attempt = [0]
    job = LaunchJob(config, "j", lambda _lr, env: None, lambda: tmp_path / f"attempt{attempt[0]}")
    workers = srun.SrunWorkers(job, srun.SrunArgs.parse(config.launch.launcher_args))
    workers.start(2)
    (tmp_path / "attempt0" / "srun.log").write_text("srun: error: Node failure on tg4\n")
    attempt[0] = 1
    workers.restart(True, 1)  # GPU 1 of this node excluded: tg1 keeps one task
    (first, _), (second, env1) = started
    assert first[first.index("-n") + 1] == "6" and (tmp_path / "attempt0" / "hostfile").read_text() == (
        "tg1\ntg1\ntg3\ntg3\ntg4\ntg4\n"
    )  # tg2 is draining
    assert second[second.index("-n") + 1] == "3" and second[second.index("-N") + 1] == "2"
    assert (tmp_path / "attempt1" / "hostfile").read_text() == "tg1\ntg3\ntg3\n"  # tg4 lost
    assert env1["SLURM_HOSTFILE"] == str(tmp_path / "attempt1" / "hostfile")
    assert "TRAINGUARD_HOST" not in env1  # each node names itself
    assert "--kill-on-bad-exit=1" in second


def test_srun_takes_its_ranks_from_n_and_a_node_its_gpus_from_the_allocation(monkeypatch) -> None:
    from trainguard.cli.mpi_args import resolve_mpi

    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2)")
    assert resolve_mpi("srun", ["-n", "8", "--mpi=pmix"], 1, ()) == (8, (0, 1, 2, 3))
    assert resolve_mpi("srun", ["-n", "8"], 1, (2, 3)) == (8, (2, 3))  # --gpu-ids wins
