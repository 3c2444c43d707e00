"""Forged Xid lines (issue 34): a user's message that reads like the driver's drained healthy
nodes, tripped the fleet breaker and so held back a real fault. Only the kernel's records count
from /dev/kmsg, and a kernel-log finding takes a node out only with NVML's evidence beside it."""

from __future__ import annotations

from pathlib import Path

from trainguard.actions import Advice
from trainguard.incidents.store import IncidentStore
from trainguard.records import Finding, Health
from trainguard.remediate import Policy, Remediator, parse_policy
from trainguard.remediate.policy import BreakerLimits
from trainguard.remediate.providers.sim import SimScheduler
from trainguard.telemetry.follow import KmsgReader

LINE = "NVRM: Xid (PCI:0000:61:00): 79, pid=1234, GPU has fallen off the bus."
XID79 = Finding("xid", Health.FAILED, Advice.REBOOT_NODE, "Xid 79: GPU has fallen off the bus.", gpu=1)
LOST = Finding("gpu_lost", Health.FAILED, Advice.REBOOT_NODE, "GPU stopped answering", gpu=1)  # NVML


def kmsg(records: list[bytes]) -> KmsgReader:
    queue = list(records)

    def read(fd: int, n: int) -> bytes:
        if not queue:
            raise BlockingIOError
        return queue.pop(0)

    return KmsgReader("/dev/null", read=read)


def test_a_record_a_process_wrote_to_kmsg_is_not_read_as_the_kernels() -> None:
    reader = kmsg(
        [
            f"14,7,100,-;{LINE}".encode(),  # facility 1 (user): `echo "<3>NVRM: Xid..." > /dev/kmsg`
            f"3,8,200,-;{LINE}".encode(),  # facility 0: the driver's printk
        ]
    )
    assert reader.poll() == [f"3,8,200,-;{LINE}"]
    assert reader.untrusted == 1
    reader.close()


def test_forged_lines_on_five_nodes_drain_none_and_a_real_fault_on_a_sixth_is_drained(tmp_path: Path) -> None:
    nodes = [f"node{i}" for i in range(6)]
    sched = SimScheduler(nodes)
    policy = Policy(enforce=True, breaker=BreakerLimits(max_nodes=4, max_fraction=1.0))
    with IncidentStore(tmp_path / "tg.db") as store:
        records = {}
        for node in nodes:
            real = node == "node5"
            r = Remediator(policy, node, store, state_dir=tmp_path / node, breaker_path=tmp_path / "breaker.json",
                           providers={"node": sched})  # fmt: skip
            records[node] = r.act([XID79, LOST] if real else [XID79])
    drained = [n for n in nodes if sched.state(n)[0] != "idle"]
    assert drained == ["node5"], {n: [(i.action, i.resolution) for i in records[n]] for n in nodes}
    assert records["node5"][0].resolution.startswith("done")
    for node in nodes[:5]:
        (rec,) = records[node]
        assert rec.action == "webhook"  # told to a person, never acted on


def test_a_site_may_trust_its_kernel_log_alone(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"])
    policy = parse_policy({"remediation": {"enforce": True, "corroborate": False}})
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(policy, "n1", store, state_dir=tmp_path, providers={"node": sched}).act([XID79])
    assert rec.action == "reboot_node" and rec.resolution.startswith("done")
