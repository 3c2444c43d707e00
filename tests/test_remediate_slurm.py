"""The Slurm provider against a real slurmctld + slurmd + munged (Debian's slurm-wlm) on loopback:
a failing simulated GPU drains its node with a readable reason, ``sinfo -R`` shows it, and the
node is resumed only after ``trainguard diagnose`` passes."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_cluster import NODE, SlurmCluster, require_slurm
from trainguard.agent import Agent
from trainguard.agent.judge import all_findings, onsets
from trainguard.clock import VirtualClock
from trainguard.incidents.store import IncidentStore
from trainguard.remediate import Remediator, parse_policy
from trainguard.remediate.escalation import EscalationState
from trainguard.remediate.providers import Status, Target
from trainguard.remediate.providers.slurm import MAX_REASON, SlurmProvider, node_state
from trainguard.remediate.resume import diagnose_passes, resume_node
from trainguard.telemetry.sim import SimNode

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRAINGUARD = [sys.executable, "-m", "trainguard.cli"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmProvider]:
    provider = SlurmProvider(slurm_conf=str(cluster.conf))
    yield provider
    provider.apply("resume", Target(NODE))  # each test starts from an idle node
    cluster.wait(lambda: cluster.state() == "idle", 60, "the node did not come back to idle")


def test_failing_gpu_drains_its_node_and_resume_follows_a_passing_diagnose(
    cluster: SlurmCluster, slurm: SlurmProvider, tmp_path: Path
) -> None:
    clock = VirtualClock()
    kmsg = tmp_path / "kmsg.log"
    fleet = SimNode(n_gpus=4, clock=clock, kmsg_path=kmsg, hostname=NODE)
    policy = parse_policy(
        {"remediation": {"enforce": True, "actions": {"xid": "drain", "gpu_lost": "drain"}}}
    )
    with IncidentStore(tmp_path / "tg.db") as store, Agent(fleet, kernel_log=kmsg, clock=clock) as agent:
        _, active = onsets(Counter(), all_findings(agent.tick()))
        fleet.now().xid(79, gpu=3)
        clock.advance(1)
        new, _ = onsets(active, all_findings(agent.tick()))
        r = Remediator(policy, NODE, store, state_dir=tmp_path, providers={"node": slurm}, clock=clock.time)
        (rec,) = r.act(new)
        assert rec.resolved and rec.resolution.startswith("done"), rec
        assert cluster.state() == "drained"
        reason = node_state(slurm._run("show", "node", "-o", NODE).stdout)["Reason"]
        assert reason.startswith("trainguard: ") and "GPU 3" in reason and f"inc {rec.id}" in reason
        assert len(reason) < 100
        assert f"inc {rec.id}" in cluster.reasons()  # what an operator sees in `sinfo -R`
        # idempotent: the same finding again changes nothing and says so
        again = slurm.apply("drain", Target(NODE, 3, "trainguard: xid GPU 3 inc 999"))
        assert again.status is Status.ALREADY
        assert "inc 999" not in cluster.reasons()

    # a failing diagnostic leaves it drained; a passing one resumes it
    failed, said = diagnose_passes([*TRAINGUARD, "diagnose", "--backend", "sim", "--scenario", "nope"])
    assert not failed
    assert resume_node(slurm, NODE, passed=failed, evidence=said).status is Status.FAILED
    assert cluster.state() == "drained"
    passed, said = diagnose_passes([*TRAINGUARD, "diagnose", "--backend", "sim", "--gpu-ids", "0,1"])
    assert passed, said
    assert resume_node(slurm, NODE, passed=passed, evidence=said).ok
    cluster.wait(lambda: cluster.state() == "idle", 60, "resume did not put the node back")
    assert cluster.reasons().strip() == ""


def test_node_in_hardware_inspection_is_never_resumed(cluster: SlurmCluster, slurm: SlurmProvider) -> None:
    assert slurm.apply("hardware_inspection", Target(NODE, None, "trainguard: xid GPU 1 inc 7")).ok
    esc = EscalationState(inspection=((NODE, None, "Xid 79 three times this week"),))
    out = resume_node(slurm, NODE, passed=True, evidence="diagnose passed", escalation=esc)
    assert out.status is Status.FAILED and "set-healthy" in out.detail
    assert cluster.state() == "drained" and "inspection" in cluster.reasons()


def test_reboot_asap_is_requested_once(cluster: SlurmCluster, slurm: SlurmProvider) -> None:
    first = slurm.apply("reboot_node", Target(NODE, 2, "trainguard: xid GPU 2 inc 5"))
    second = slurm.apply("reboot_node", Target(NODE, 2, "trainguard: xid GPU 2 inc 5"))
    assert first.status is Status.DONE and second.status is Status.ALREADY
    flags = node_state(slurm._run("show", "node", "-o", NODE).stdout)["State"]
    assert "REBOOT" in flags  # REBOOT_REQUESTED (or _ISSUED once slurmctld sends it)


def test_unknown_node_is_a_definite_failure_not_retried(slurm: SlurmProvider) -> None:
    out = slurm.apply("drain", Target("no-such-node", None, "trainguard: test"))
    assert out.status is Status.FAILED and not out.retry


def test_long_reasons_are_clipped_below_100_characters() -> None:
    from trainguard.remediate.providers.slurm import clip_reason

    text = clip_reason('trainguard: "xid" ' + "x" * 300)
    assert len(text) <= MAX_REASON < 100 and '"' not in text


def test_trainguard_check_drains_as_slurm_health_check_program(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """slurmd runs `trainguard check --slurm-drain` as its HealthCheckProgram: a failed verdict drains
    the node with the check's reason; slurmd runs it at start and every HealthCheckInterval."""
    require_slurm()
    root = tmp_path_factory.mktemp("slurm-hc")
    script = root / "healthcheck.sh"
    script.write_text(
        # slurmd gives the program a bare environment: a real node reads /etc/slurm/slurm.conf
        f"#!/bin/sh\nexport SLURM_CONF={root}/slurm.conf\nexec {sys.executable} -m trainguard.cli check --backend sim --scenario xid79 --gpus 4 "
        f"--slurm-drain > {root}/hc.out 2>&1\n"
    )
    script.chmod(0o755)
    extra = f"HealthCheckProgram={script}\nHealthCheckInterval=5\nHealthCheckNodeState=ANY"
    with SlurmCluster(root, extra_conf=extra) as c:
        c.wait(lambda: c.state() == "drained", 120, "the health check never drained the node")
        assert "trainguard check" in c.reasons(), c.reasons()


def test_trainguard_check_as_prolog_drains_a_failing_node_before_the_job_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The documented Prolog (docs/health.md): exit 1 on a failed check; slurmd drains the node and
    the job does not run on it. A healthy check lets the job run."""
    require_slurm()
    root = tmp_path_factory.mktemp("slurm-prolog")
    scenario = root / "scenario"
    scenario.write_text("healthy")
    prolog = root / "prolog.sh"
    prolog.write_text(
        f"#!/bin/sh\n{sys.executable} -m trainguard.cli check --backend sim --gpus 4 "
        f'--scenario "$(cat {scenario})" > {root}/prolog.out 2>&1\n'
        "[ $? -eq 2 ] && exit 1\nexit 0\n"
    )
    prolog.chmod(0o755)
    with SlurmCluster(root, extra_conf=f"Prolog={prolog}") as c:
        ran = root / "ran"

        def sbatch(name: str) -> None:
            subprocess.run(["sbatch", "-N1", "-o", "/dev/null", f"--wrap=touch {ran}-{name}"],
                           env=c.env, check=True, capture_output=True)  # fmt: skip

        sbatch("healthy")
        c.wait(lambda: (root / "ran-healthy").exists(), 120, "the job on a healthy node never ran")
        scenario.write_text("xid79")
        sbatch("failing")
        c.wait(lambda: c.state() == "drained", 120, "the failing prolog did not drain the node")
        assert not (root / "ran-failing").exists()
        assert "prolog" in c.reasons().lower(), c.reasons()
