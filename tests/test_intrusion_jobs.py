"""Intrusion check (issue 34): a GPU process belongs to a job only by the scheduler's own record
(its cgroup), never by what its environment says; and a job process the agent cannot see in
/proc (the shipped unit hides other users' processes) is found in the scheduler's cgroup tree.
Both ways: /proc and /sys/fs/cgroup are stand-ins written here (paths are parameters)."""

from __future__ import annotations

from pathlib import Path

from trainguard.remediate.intrusion import unexpected_processes
from trainguard.telemetry.procinfo import describe_all, job_of_cgroup


def fake_proc(root: Path, pid: int, cgroup: str, environ: bytes = b"") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n")
    (d / "cmdline").write_bytes(b"python\0miner.py\0")
    (d / "environ").write_bytes(environ)
    (d / "cgroup").write_text(f"0::{cgroup}\n")


def slurm_tree(root: Path, job: int, pids: list[int]) -> None:
    leaf = root / "system.slice" / "slurmstepd.scope" / f"job_{job}" / "step_0" / "user" / "task_0"
    leaf.mkdir(parents=True)
    (leaf / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def test_a_process_that_claims_a_slurm_job_in_its_environment_is_reported(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    fake_proc(proc, 4242, "/user.slice/user-1000.slice/session-3.scope", b"SLURM_JOB_ID=4711\0")
    slurm_tree(cg, 4711, [100])
    procs = describe_all([(4242, 900.0)], 5, proc, cg)
    assert procs[0].job is None and procs[0].job_known
    (finding,) = unexpected_processes(procs, 0.0)
    assert "pid 4242" in finding.reason and "belongs to no job" in finding.reason


def test_a_job_process_hidden_from_the_agents_proc_is_found_in_slurms_cgroups(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()  # ProtectProc=invisible: no /proc/<pid> of another user's process
    slurm_tree(cg, 4711, [100, 101])
    procs = describe_all([(100, 900.0), (101, 10.0), (102, 5.0)], 0, proc, cg)
    assert [(p.pid, p.job, p.job_known) for p in procs] == [(100, "4711", True), (101, "4711", True),
                                                              (102, None, True)]  # fmt: skip
    assert [f.gpu for f in unexpected_processes(procs, 0.0)] == [0]  # 102 only: in no job's cgroup


def test_nothing_readable_is_unknown_and_reported_as_nothing(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    procs = describe_all([(100, 1.0)], 0, tmp_path / "proc", tmp_path / "no-cgroup-fs")
    assert not procs[0].job_known and unexpected_processes(procs, 0.0) == []


def test_only_the_schedulers_own_cgroups_name_a_job() -> None:
    assert job_of_cgroup("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0") == "4711"
    assert job_of_cgroup("/slurm/uid_1000/job_12/step_batch") == "12"  # cgroup v1
    pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60.slice/cri-containerd-ab.scope"
    assert job_of_cgroup(pod) == "pod:1b2c3d4e_5f60"
    # a user's own delegated cgroup named like a job is not one
    assert job_of_cgroup("/user.slice/user-1000.slice/user@1000.service/app.slice/job_4711") is None
