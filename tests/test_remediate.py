"""Remediation's decisions: policy, breakers, escalation, and the executor's records (no I/O but files)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from trainguard.actions import Advice
from trainguard.agent import Agent
from trainguard.agent.judge import all_findings, onsets
from trainguard.clock import VirtualClock
from trainguard.errors import ConfigError, StoreError
from trainguard.incidents.store import IncidentStore
from trainguard.records import Finding, Health
from trainguard.remediate import (
    BreakerFile,
    JobInfo,
    NodeAction,
    Policy,
    Remediator,
    admit,
    choose,
    parse_policy,
)
from trainguard.remediate import escalation as esc
from trainguard.remediate.breaker import BreakerState, fleet_limit, reset
from trainguard.remediate.policy import BreakerLimits, EscalationLimits, load_policy
from trainguard.remediate.providers import Status, Target
from trainguard.remediate.providers.sim import SimScheduler
from trainguard.telemetry.sim import SimNode

DBE = Finding("ecc_dbe", Health.FAILED, Advice.RESET_GPU, "1 uncorrectable ECC error", gpu=2, time=1.0)
XID79 = Finding("xid", Health.FAILED, Advice.REBOOT_NODE, "Xid 79: GPU has fallen off the bus.", gpu=1)
# What NVML sees of the same fault: a kernel-log finding takes a node out only beside it.
LOST = Finding("gpu_lost", Health.FAILED, Advice.REBOOT_NODE, "GPU stopped answering", gpu=1)

POLICY = """
[remediation]
enforce = true
provider = "slurm"
[remediation.actions]
xid = "drain"
gpu_lost = "drain"
unexpected_gpu_process = "webhook"
[remediation.breaker]
max_nodes = 5
max_fraction = 0.1
fleet_size = 64
[[remediation.group]]
name = "a100"
gpu_model = "A100"
enforce = false
actions = { ecc_dbe = "reboot_node" }
"""


def test_dry_run_is_the_default_and_records_what_it_would_do(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"])
    with IncidentStore(tmp_path / "tg.db") as store:
        r = Remediator(Policy(), "n1", store, state_dir=tmp_path, providers={"node": sched})
        (rec,) = r.act([XID79, LOST])
        assert rec.resolution == "dry_run: would reboot_node"
        assert rec.action == "reboot_node" and rec.gpu == 1 and rec.node == "n1"
        assert "finding xid: Xid 79: GPU has fallen off the bus." in rec.evidence
        assert store.get(rec.id) == rec  # every decision is an incident record
    assert sched.calls == [] and sched.state("n1") == ("idle", "")


def test_enforce_flag_turns_actions_on_and_the_reason_names_the_incident(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"])
    with IncidentStore(tmp_path / "tg.db") as store:
        r = Remediator(Policy(), "n1", store, state_dir=tmp_path, providers={"node": sched}, enforce=True)
        (rec,) = r.act([XID79, LOST])
    assert rec.resolved and rec.resolution.startswith("done")
    assert sched.state("n1") == ("reboot_requested", f"trainguard: xid GPU 1 inc {rec.id}")
    assert any("provider sim: done after 1 call(s)" in e for e in rec.evidence)


def test_policy_file_groups_override_defaults(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    p = load_policy(path)
    assert p.enforce and p.breaker.max_nodes == 5 and p.breaker.fleet_size == 64
    h100 = choose(p, DBE, "n1", "NVIDIA H100 80GB HBM3")
    a100 = choose(p, DBE, "n1", "NVIDIA A100-SXM4-80GB")
    assert (h100.remedy, h100.enforce) == (NodeAction.RESET_GPU, True)
    assert (a100.remedy, a100.enforce, a100.group) == (NodeAction.REBOOT_NODE, False, "a100")
    assert choose(p, XID79, "n1").remedy is NodeAction.DRAIN
    k8s = parse_policy({"remediation": {"provider": "kubernetes", "actions": {"xid": "drain"}}})
    assert choose(k8s, XID79, "n1").remedy is NodeAction.CORDON  # drain means cordon on Kubernetes


def test_healthy_findings_get_no_remedy() -> None:
    ok = Finding("xid", Health.OK, Advice.RESET_GPU, "Xid 63: row remap", gpu=0)
    assert choose(Policy(enforce=True), ok, "n1").remedy is NodeAction.NONE


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"remediation": {"actions": {"xid": "explode"}}}, ["'explode' is not a remedy", "drain"]),
        ({"remediation": {"enforse": True}}, ["unknown setting(s) enforse", "enforce"]),
        ({"remediation": {"provider": "pbs"}}, ["provider = 'pbs'", "slurm, kubernetes, none"]),
        ({"remediation": {"breaker": {"max_nodes": "5"}}}, ["max_nodes must be a int"]),
        ({"remediation": {"enforce": "yes"}}, ["enforce must be true or false"]),
    ],
)
def test_bad_policy_is_a_clear_error(doc: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy(doc)  # type: ignore[arg-type]
    for w in words:
        assert w in str(err.value)


def test_missing_policy_file_says_where_the_example_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"docs/remediation\.md"):
        load_policy(tmp_path / "nope.toml")


def test_breaker_drains_exactly_k_of_a_64_node_fleet_and_holds_the_rest(tmp_path: Path) -> None:
    """A rule that would drain 30% of 64 simulated nodes: K=5 are drained, the other 14 held."""
    policy = load_policy_text(tmp_path, POLICY)
    names = [f"node{i:02d}" for i in range(64)]
    sched = SimScheduler(names)
    clock = VirtualClock()
    shared = tmp_path / "fleet-breaker.json"  # one breaker for the fleet (a shared file)
    bad = names[::3][:19]  # 19 of 64 ≈ 30%
    with IncidentStore(tmp_path / "tg.db") as store:
        records = []
        for name in names:
            kmsg = tmp_path / f"{name}.kmsg"
            fleet = SimNode(n_gpus=2, clock=clock, kmsg_path=kmsg, hostname=name)
            with Agent(fleet, kernel_log=kmsg, clock=clock) as agent:
                _, active = onsets(Counter(), all_findings(agent.tick()))
                if name in bad:
                    fleet.now().xid(79, gpu=1)
                clock.advance(1)
                new, _ = onsets(active, all_findings(agent.tick()))
                r = Remediator(
                    policy, name, store, state_dir=tmp_path / name, breaker_path=shared,
                    providers={"node": sched}, clock=clock.time,
                )  # fmt: skip
                records += r.act(new)
        assert len(records) == 19  # one per node: Xid 79 and the lost GPU are one fault
        done = [r for r in records if r.resolution.startswith("done")]
        held = [r for r in records if r.resolution.startswith("held")]
        assert len(done) == fleet_limit(policy.breaker, 64) == 5
        assert len(held) == 14
        assert [r.node for r in done] == bad[:5]
        assert all("fleet breaker" in r.resolution for r in held)
        drained = [n for n in names if sched.state(n)[0] == "drained"]
        assert drained == bad[:5]
        # held records are in the store too
        assert sum(1 for i in store.incidents() if (i.resolution or "").startswith("held")) == 14
    state = BreakerFile(shared).load()
    assert state.tripped and state.held == 14


def test_breaker_stays_open_after_the_window_until_a_person_resets_it() -> None:
    lim = BreakerLimits(max_nodes=1, max_fraction=1.0, window_s=60)
    ok1, _, s = admit(BreakerState(), lim, "a", None, 0.0, 10)
    ok2, _, s = admit(s, lim, "b", None, 1.0, 10)
    ok3, why, s = admit(s, lim, "c", None, 10_000.0, 10)  # far past the window: still open
    assert (ok1, ok2, ok3) == (True, False, False) and "open" in why
    ok4, _, s = admit(reset(s), lim, "c", None, 10_001.0, 10)
    assert ok4


def test_job_breaker_never_takes_more_than_the_spare_pool() -> None:
    lim = BreakerLimits(max_nodes=100, max_fraction=1.0)
    s = BreakerState()
    got = []
    for node in ["a", "b", "c", "d"]:
        ok, _, s = admit(s, lim, node, "llm-70b", 0.0, 100, job_spares=2)
        got.append(ok)
    ok_other, _, s = admit(s, lim, "e", "other-job", 0.0, 100, job_spares=2)
    assert got == [True, True, False, False] and ok_other
    assert dict(s.jobs_tripped)["llm-70b"]
    assert admit(reset(s, job="llm-70b"), lim, "c", "llm-70b", 1.0, 100, job_spares=3)[0]


def test_job_breaker_holds_through_the_executor(tmp_path: Path) -> None:
    sched = SimScheduler(["n1", "n2"])
    job = JobInfo("llm-70b", spares=1)
    with IncidentStore(tmp_path / "tg.db") as store:
        recs = [
            Remediator(Policy(enforce=True, breaker=BreakerLimits(max_nodes=10, max_fraction=1.0)), n, store,
                       state_dir=tmp_path / n, breaker_path=tmp_path / "b.json", providers={"node": sched},
                       job=lambda: job).act([XID79, LOST])[0]
            for n in ["n1", "n2"]
        ]  # fmt: skip
    assert recs[0].resolution.startswith("done")
    assert recs[1].resolution.startswith("held: job breaker tripped for llm-70b")


def test_dry_run_says_when_the_breaker_would_hold(tmp_path: Path) -> None:
    pol = Policy(breaker=BreakerLimits(max_nodes=0))
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(pol, "n1", store, state_dir=tmp_path).act([XID79, LOST])
    assert "the breaker would hold it" in rec.resolution
    assert BreakerFile(tmp_path / "breaker.json").load() == BreakerState()  # a dry run changes nothing


def test_failures_are_retried_with_backoff(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"], failures=[Status.FAILED, Status.FAILED])
    sleeps: list[float] = []
    with IncidentStore(tmp_path / "tg.db") as store:
        r = Remediator(Policy(enforce=True), "n1", store, state_dir=tmp_path, providers={"node": sched},
                       sleep=sleeps.append)  # fmt: skip
        (rec,) = r.act([XID79, LOST])
    assert rec.resolved and sleeps == [1.0, 2.0] and len(sched.calls) == 3


def test_an_ambiguous_call_is_verified_not_repeated(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"], failures=[Status.AMBIGUOUS])  # the call timed out but took effect
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(Policy(enforce=True), "n1", store, state_dir=tmp_path,
                            providers={"node": sched}).act([XID79, LOST])  # fmt: skip
    assert rec.resolution.startswith("done") and "verified in effect" in rec.resolution
    assert len(sched.calls) == 1


def test_an_ambiguous_call_that_did_not_happen_is_retried(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"], failures=[Status.AMBIGUOUS], applied_after_timeout=False)
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(Policy(enforce=True), "n1", store, state_dir=tmp_path,
                            providers={"node": sched}, sleep=lambda s: None).act([XID79, LOST])  # fmt: skip
    assert rec.resolution.startswith("done") and len(sched.calls) == 2


def test_a_missing_provider_fails_the_action_visibly(tmp_path: Path) -> None:
    with IncidentStore(tmp_path / "tg.db") as store:
        rec, reboot = Remediator(Policy(enforce=True), "n1", store, state_dir=tmp_path).act([DBE])
    assert not rec.resolved and rec.resolution.startswith("failed: no gpu provider")
    # a reset that cannot run escalates to a reboot request (which fails too: no node provider)
    assert reboot.action == "reboot_node" and reboot.resolution.startswith("failed: no node provider")


def test_repeated_remediation_escalates_to_hardware_inspection_never_auto_resumed(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"])
    pol = Policy(enforce=True, escalation=EscalationLimits(max_remediations=2),
                 breaker=BreakerLimits(max_nodes=10))  # fmt: skip
    clock = [0.0]
    with IncidentStore(tmp_path / "tg.db") as store:
        r = Remediator(
            pol, "n1", store, state_dir=tmp_path, providers={"node": sched}, clock=lambda: clock[0]
        )
        got = []
        for _ in range(4):
            clock[0] += 60
            sched.apply("resume", Target("n1"))  # as if someone resumed it between faults
            got += [(i.action, (i.resolution or "").split(":")[0]) for i in r.act([XID79, LOST])]
    assert got == [("reboot_node", "done"), ("reboot_node", "done"), ("hardware_inspection", "done")]
    state = esc.EscalationFile(tmp_path / "escalation.json").load()
    assert esc.in_inspection(state, "n1", 1)
    cleared = esc.set_healthy(state, "n1")
    assert esc.in_inspection(cleared, "n1", 1) is None and cleared.history == ()


def test_one_remedy_per_gpu_per_tick(tmp_path: Path) -> None:
    lost = Finding("gpu_lost", Health.FAILED, Advice.REBOOT_NODE, "GPU stopped answering", gpu=1)
    with IncidentStore(tmp_path / "tg.db") as store:
        recs = Remediator(Policy(), "n1", store, state_dir=tmp_path).act([XID79, lost, DBE])
    assert sorted((r.gpu, r.action) for r in recs) == [(1, "reboot_node"), (2, "reset_gpu")]


def test_rack_with_half_its_nodes_bad_is_one_incident() -> None:
    racks = {"a1": "r1", "a2": "r1", "a3": "r1", "a4": "r1", "b1": "r2", "b2": "r2"}
    assert esc.rack_incidents(["a1", "a2", "b1"], racks) == {"r1": ["a1", "a2"], "r2": ["b1"]}
    assert esc.rack_incidents(["a1"], racks) == {}


def test_per_xid_limit() -> None:
    lim = EscalationLimits(max_remediations=5, per_xid={79: 1})
    s = esc.remember(esc.EscalationState(), "n", 1, "reboot_node", 0.0, xid=79)
    assert esc.needs_inspection(s, lim, "n", 1, 79, 1.0)
    assert not esc.needs_inspection(s, lim, "n", 1, 48, 1.0)
    assert esc.xid_of("Xid 79: GPU has fallen off the bus.") == 79 and esc.xid_of("no xid here") is None


def test_unreadable_breaker_state_refuses_rather_than_forgets(tmp_path: Path) -> None:
    path = tmp_path / "breaker.json"
    path.write_text("{torn")
    with pytest.raises(StoreError, match="fix or remove it"):
        BreakerFile(path).load()


def test_breaker_state_round_trips_through_its_file(tmp_path: Path) -> None:
    f = BreakerFile(tmp_path / "b.json")
    lim = BreakerLimits(max_nodes=1, max_fraction=1.0)
    with f.update() as box:
        for node, job in [("a", "j"), ("b", None)]:
            _, _, box[0] = admit(box[0], lim, node, job, 5.0, 0)
    assert f.load() == box[0] and f.load().tripped and not list(tmp_path.glob(".b.json.*"))


def load_policy_text(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy(path)


def test_a_rack_with_half_its_nodes_bad_is_recorded_once(tmp_path: Path) -> None:
    racks = {f"r1n{i}": "r1" for i in range(4)} | {f"r2n{i}": "r2" for i in range(4)}
    pol = Policy(enforce=True, racks=racks, breaker=BreakerLimits(max_nodes=1, max_fraction=1.0))
    sched = SimScheduler(list(racks))
    got = []
    with IncidentStore(tmp_path / "tg.db") as store:
        for node in ["r1n0", "r2n0", "r1n1", "r1n2"]:  # the breaker holds all but the first
            r = Remediator(pol, node, store, state_dir=tmp_path / node, breaker_path=tmp_path / "b.json",
                           providers={"node": sched})  # fmt: skip
            got += r.act([XID79, LOST])
    rack = [i for i in got if i.job.startswith("rack:")]
    assert [(i.job, i.evidence) for i in rack] == [("rack:r1", ("bad node r1n0", "bad node r1n1"))]
    assert "2 of its 4 nodes bad" in rack[0].summary
    assert sum(1 for i in got if (i.resolution or "").startswith("held")) == 3  # held nodes count as bad


@pytest.mark.parametrize(
    "module",
    ["policy", "breaker", "escalation", "executor", "fleetlog", "intrusion", "providers.sim"],
)
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"trainguard.remediate.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_resume_is_refused_while_one_gpu_of_the_node_is_in_inspection(tmp_path: Path) -> None:
    """The usual inspection is a GPU's (issue 34: `remediate resume` put the node back to idle)."""
    from trainguard.remediate.resume import resume_node

    sched = SimScheduler(["n1"])
    sched.apply("hardware_inspection", Target("n1", 3))
    state = esc.EscalationState((), (("n1", 3, "Xid 79 twice"),))
    out = resume_node(sched, "n1", passed=True, evidence="diagnose passed", escalation=state)
    assert out.status is Status.FAILED and "GPU 3: Xid 79 twice" in out.detail
    assert sched.state("n1")[0] != "idle"
    assert resume_node(sched, "n1", passed=True, evidence="ok", escalation=esc.set_healthy(state, "n1")).ok
