"""GPU reset on the simulated node (the GPU comes back, or stays lost for a hardware fault) and
intrusion detection from the running-process list."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from trainguard.agent import Agent
from trainguard.agent.judge import all_findings, onsets
from trainguard.clock import VirtualClock
from trainguard.incidents.store import IncidentStore
from trainguard.records import Health
from trainguard.remediate import Remediator, parse_policy
from trainguard.remediate.intrusion import RULE, unexpected_processes
from trainguard.remediate.providers import Status, Target
from trainguard.remediate.providers.gpu_reset import GpuResetProvider, SimGpuControl
from trainguard.remediate.providers.sim import SimScheduler
from trainguard.telemetry.procinfo import describe
from trainguard.telemetry.sim import SimNode

ENFORCE = parse_policy(
    {"remediation": {"enforce": True, "actions": {"gpu_lost": "reset_gpu", "xid": "reset_gpu"}}}
)


def _node(tmp_path: Path) -> tuple[VirtualClock, SimNode, Agent]:
    clock = VirtualClock()
    sim = SimNode(n_gpus=4, clock=clock, kmsg_path=tmp_path / "kmsg", hostname="n1")
    return clock, sim, Agent(sim, kernel_log=tmp_path / "kmsg", clock=clock)


def _fault(clock: VirtualClock, agent: Agent, inject: object) -> list:  # type: ignore[type-arg]
    _, active = onsets(Counter(), all_findings(agent.tick()))
    inject()  # type: ignore[operator]
    clock.advance(1)
    return onsets(active, all_findings(agent.tick()))[0]


def test_reset_brings_a_gpu_with_a_double_bit_error_back(tmp_path: Path) -> None:
    clock, sim, agent = _node(tmp_path)
    control = SimGpuControl(sim)
    new = _fault(clock, agent, lambda: sim.now().dbe(gpu=2))
    with IncidentStore(tmp_path / "tg.db") as store, agent:
        r = Remediator(ENFORCE, "n1", store, state_dir=tmp_path, clock=clock.time,
                       providers={"gpu": GpuResetProvider(control), "node": SimScheduler(["n1"])},
                       on_reset=agent.gpu_was_reset)  # fmt: skip
        (rec,) = r.act(new)
        assert rec.action == "reset_gpu" and rec.resolved, rec
        assert control.resets == [2]
        assert control.persistence(2) is True  # turned off for the reset, back on after
        clock.advance(1)
        assert agent.tick().gpus[2].health is Health.OK  # the reset cleared it


def test_a_gpu_that_fell_off_the_bus_stays_lost_and_a_reboot_is_requested(tmp_path: Path) -> None:
    clock, sim, agent = _node(tmp_path)
    sched = SimScheduler(["n1"])
    new = _fault(clock, agent, lambda: sim.now().xid(79, gpu=1))
    with IncidentStore(tmp_path / "tg.db") as store, agent:
        r = Remediator(ENFORCE, "n1", store, state_dir=tmp_path, clock=clock.time,
                       providers={"gpu": GpuResetProvider(SimGpuControl(sim)), "node": sched})  # fmt: skip
        reset, reboot = r.act(new)
    assert not reset.resolved and "does not answer after its reset" in reset.resolution
    assert reboot.action == "reboot_node" and reboot.resolved
    assert sched.state("n1")[0] == "reboot_requested"
    assert sim.sample()[1].lost  # a reset does not bring it back; only the reboot would


def test_a_gpu_in_use_is_never_reset(tmp_path: Path) -> None:
    _, sim, agent = _node(tmp_path)
    agent.close()
    control = SimGpuControl(sim)
    sim.start_process(3, 777, "python train.py", user="alice", job="12345")
    out = GpuResetProvider(control).apply("reset_gpu", Target("n1", 3))
    assert out.status is Status.FAILED and "in use by pid 777" in out.detail and not out.retry
    assert control.resets == []


def test_the_sim_refuses_a_reset_while_persistence_mode_holds_the_gpu(tmp_path: Path) -> None:
    _, sim, _ = _node(tmp_path)
    control = SimGpuControl(sim)
    ok, why = control.reset(0)  # called without turning persistence off first
    assert not ok and "persistence" in why


def test_a_stranger_process_is_an_unexpected_gpu_process_finding(tmp_path: Path) -> None:
    _, sim, _ = _node(tmp_path)
    sim.start_process(0, 1001, "python train.py", user="alice", job="12345")
    sim.start_process(2, 4242, "xmrig -o stratum+tcp://pool:3333", user="mallory")
    sim.start_process(3, 555, "/usr/bin/dcgm-exporter", user="root")
    procs = [p for k in range(4) for p in sim.processes(k)]
    (f,) = unexpected_processes(procs, 5.0, known_jobs=["12345"], allowed_commands=["/usr/bin/dcgm-exporter"])
    assert f.rule == RULE and f.gpu == 2 and f.health is Health.DEGRADED
    assert "pid 4242" in f.reason and "mallory" in f.reason and "xmrig" in f.reason
    assert "user=mallory" in f.evidence
    # a job this node does not run is unexpected too
    (g,) = unexpected_processes(procs[:1], 5.0, known_jobs=["999"])
    assert "job 12345, not one of this node's" in g.reason
    assert unexpected_processes(procs, 5.0, allowed_users=["mallory", "root"], known_jobs=["12345"]) == []


def test_intrusion_goes_through_the_policy(tmp_path: Path) -> None:
    _, sim, _ = _node(tmp_path)
    sim.start_process(1, 4242, "xmrig", user="mallory")
    findings = unexpected_processes(sim.processes(1), 1.0)
    policy = parse_policy({"remediation": {"actions": {RULE: "webhook"}}})
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(policy, "n1", store, state_dir=tmp_path).act(findings)
    assert rec.action == "webhook" and rec.resolution == "dry_run: would webhook" and rec.gpu == 1


def test_procinfo_reads_user_command_and_slurm_job(tmp_path: Path) -> None:
    me = describe(os.getpid(), 0)
    assert (me.command and "python" in me.command.lower()) or "pytest" in (me.command or "")
    fake = tmp_path / "proc" / "77"
    fake.mkdir(parents=True)
    (fake / "status").write_text("Name:\tx\nUid:\t0\t0\t0\t0\n")
    (fake / "cmdline").write_bytes(b"python\0train.py\0")
    (fake / "environ").write_bytes(b"HOME=/root\0")
    (fake / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0\n")
    p = describe(77, 1, 10.0, proc=tmp_path / "proc")
    assert (p.user, p.command, p.job) == ("root", "python train.py", "4711")
    (fake / "environ").write_bytes(b"SLURM_JOB_ID=99\0")  # the process's own claim: not read
    assert describe(77, 1, proc=tmp_path / "proc").job == "4711"
    gone = describe(78, 1, proc=tmp_path / "proc")
    assert gone.job is None and not gone.job_known  # nothing known, no crash


def test_nvml_running_processes_become_gpu_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's running-process list, with /proc filling in user and command (here: this process)."""
    import types

    from trainguard.records import Gpu
    from trainguard.telemetry import nvml

    class NVMLError(Exception):
        pass

    entry = types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * 2**30)
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlDeviceGetComputeRunningProcesses=lambda h: [entry] if h == "h1" else []
    )
    monkeypatch.setattr(nvml, "pynvml", fake)
    backend = object.__new__(nvml.NvmlBackend)
    backend._handles, backend._gpus = ["h0", "h1"], [Gpu(0), Gpu(1)]
    assert backend.processes(0) == []
    (p,) = backend.processes(1)
    assert (p.pid, p.gpu, p.used_mib) == (os.getpid(), 1, 3072.0) and p.command and p.user


@pytest.mark.gpu
def test_a_cuda_process_outside_any_job_is_flagged_on_a_real_gpu() -> None:
    """On a GPU machine: a CUDA process this test starts (no Slurm job) shows up as unexpected."""
    import subprocess
    import sys

    from trainguard.errors import BackendUnavailable
    from trainguard.telemetry.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except BackendUnavailable:
        pytest.skip("no NVIDIA driver or GPU on this machine")
    code = "import torch,sys,time; x=torch.ones(1,device='cuda'); print('up',flush=True); time.sleep(60)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        with backend:
            procs = [p for g in backend.gpus() for p in backend.processes(g.index)]
        assert procs, "NVML lists no compute process while one holds a CUDA context"
        ours = [p for p in procs if p.pid == child.pid]
        # In a container without the host's pid namespace NVML reports host pids: /proc then knows
        # nothing of them, and a process of no known job is still unexpected.
        flagged = unexpected_processes(ours or procs, 0.0)
        assert flagged and (not ours or f"pid {child.pid}" in flagged[0].reason)
    finally:
        child.kill()
        child.wait()
