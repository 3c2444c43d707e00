"""Root cause: the earliest causal failure, not the loudest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.actions import Advice
from trainguard.incidents import Evidence, RootCause, first_failure, numerics_root_cause, root_cause_for
from trainguard.records import Category, Event, EventKind, Finding, Health, Severity
from trainguard.rundir import ErrorRecord


def xid(code: int, t: float, sympathetic: bool = False) -> Event:
    text = f"[{t:12.6f}] NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python, test"
    return Event(
        EventKind.XID,
        text,
        time=t,
        xid=code,
        pci="0000:3b:00",
        severity=Severity.ERROR,
        category=Category.GPU_HARDWARE,
        sympathetic=sympathetic,
    )


def nccl_timeout(t: float, rank: int) -> Event:
    text = (
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."
    )
    return Event(
        EventKind.TRAINING, text, time=t, category=Category.NCCL_TIMEOUT_HANG, severity=Severity.FATAL
    )


def test_xid_79_before_nccl_timeouts_on_every_rank_is_a_faulty_gpu():
    evidence = [nccl_timeout(600.0 + r / 10, r) for r in range(64)] + [xid(79, 10.0)]
    assert root_cause_for(evidence) is RootCause.FAULTY_GPU
    first = first_failure(evidence)
    assert first is not None and first.time == 10.0 and first.source == "kernel_log"


def test_nccl_timeouts_alone_are_a_watchdog_timeout():
    assert root_cause_for([nccl_timeout(600.0, r) for r in range(8)]) is RootCause.NCCL_WATCHDOG_TIMEOUT


def test_the_earliest_failure_wins_even_when_a_later_one_is_hardware():
    crash = ErrorRecord(rank=1, time=5.0, exc_type="ValueError", message="shapes (3,4) and (5,6) not aligned")
    assert root_cause_for([xid(79, 50.0), crash]) is RootCause.SOFTWARE_BUG


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (48, RootCause.GPU_HBM_MEMORY),
        (63, RootCause.GPU_HBM_MEMORY),
        (64, RootCause.GPU_HBM_MEMORY),
        (94, RootCause.GPU_HBM_MEMORY),
        (95, RootCause.GPU_HBM_MEMORY),
        (79, RootCause.FAULTY_GPU),
        (119, RootCause.GPU_SYSTEM_PROCESSOR),
        (120, RootCause.GPU_SYSTEM_PROCESSOR),
        (172, RootCause.GPU_SRAM),
        (13, RootCause.SOFTWARE_BUG),
    ],
)
def test_xid_codes_map_to_their_root_cause(code, cause):
    assert root_cause_for([xid(code, 1.0)]) is cause


def test_xid_172_refines_the_xid_48_printed_with_it_to_sram():
    assert root_cause_for([xid(48, 100.0), xid(172, 100.001)]) is RootCause.GPU_SRAM


def test_sympathetic_xid_45_never_names_the_cause():
    assert root_cause_for([xid(45, 1.0, sympathetic=True), xid(95, 1.5)]) is RootCause.GPU_HBM_MEMORY
    assert root_cause_for([xid(45, 1.0), xid(13, 30.0)]) is RootCause.SOFTWARE_BUG


def test_hardware_in_the_same_burst_beats_the_crash_it_caused():
    crash = ErrorRecord(
        rank=3, time=20.2, exc_type="RuntimeError", message="CUDA error: unspecified launch failure"
    )
    assert root_cause_for([crash, xid(79, 20.5)]) is RootCause.FAULTY_GPU


def test_survivors_connection_errors_are_symptoms_of_the_dead_rank():
    survivors = [
        ErrorRecord(rank=r, time=30.0 + r, exc_type="DistBackendError", message="Connection reset by peer")
        for r in range(1, 8)
    ]
    dead = ErrorRecord(rank=0, time=40.0, exc_type="KeyError", message="'labels'")
    assert root_cause_for([*survivors, dead]) is RootCause.SOFTWARE_BUG


def test_thermal_finding_is_gpu_thermal_and_nic_text_names_the_nic():
    hot = Finding(
        "thermal.slowdown",
        Health.DEGRADED,
        Advice.RUN_DIAGNOSTICS,
        "92 C",
        gpu=1,
        time=3.0,
        category=Category.THERMAL_POWER,
    )
    assert root_cause_for([hot]) is RootCause.GPU_THERMAL
    nic = Event(
        EventKind.TRAINING,
        "NCCL WARN NET/IB : mlx5_0:1 port 1 down",
        time=2.0,
        category=Category.NCCL_NETWORK,
    )
    net = Event(
        EventKind.TRAINING,
        "NCCL WARN NET/IB : Got completion from peer with error 12",
        time=2.0,
        category=Category.NCCL_NETWORK,
    )
    assert root_cause_for([nic]) is RootCause.NIC
    assert root_cause_for([net]) is RootCause.NETWORK_SWITCH_CABLE


def test_loss_spike_that_vanishes_after_rollback_is_silent_data_corruption():
    assert numerics_root_cause(reproduced_after_rollback=False) is RootCause.SILENT_DATA_CORRUPTION
    assert numerics_root_cause(reproduced_after_rollback=True) is RootCause.SOFTWARE_BUG
    transient = Finding(
        "numerics.transient",
        Health.DEGRADED,
        Advice.RUN_DIAGNOSTICS,
        "nan did not repeat",
        time=9.0,
        category=Category.GPU_HARDWARE,
    )
    assert root_cause_for([transient]) is RootCause.SILENT_DATA_CORRUPTION


def test_storage_errors_are_a_dependency():
    rec = ErrorRecord(rank=0, time=1.0, exc_type="OSError", message="[Errno 116] Stale file handle")
    assert root_cause_for([rec]) is RootCause.DEPENDENCY


def test_no_evidence_or_only_info_is_unknown():
    info = Event(EventKind.GPU_MAP, "NVRM: GPU at PCI:0000:3b:00: GPU-abc", time=1.0)
    assert root_cause_for([]) is RootCause.UNKNOWN
    assert root_cause_for([info]) is RootCause.UNKNOWN
    assert first_failure([info]) is None


def test_supervisor_built_evidence_is_taken_as_is_and_untimed_counts_last():
    kill = Evidence(
        RootCause.HOST, time=None, text="worker killed by SIGKILL (OOM killer)", source="exit_code"
    )
    gsp = Evidence(RootCause.GPU_SYSTEM_PROCESSOR, time=7.0, source="kernel_log")
    assert root_cause_for([kill, gsp]) is RootCause.GPU_SYSTEM_PROCESSOR
    assert root_cause_for([kill]) is RootCause.HOST


@given(
    st.sampled_from([79, 48, 95, 119, 172, 13]),
    st.lists(st.tuples(st.floats(10.5, 5000), st.integers(0, 511)), max_size=40),
)
@settings(max_examples=100, deadline=None)
def test_symptoms_after_a_causal_failure_never_change_the_cause(code, later):
    alone = root_cause_for([xid(code, 8.0)])
    noisy = (
        [nccl_timeout(t, r) for t, r in later] + [xid(45, t + 0.1) for t, _ in later[:5]] + [xid(code, 8.0)]
    )
    assert root_cause_for(noisy) is alone


def test_real_log_lines_through_the_detect_parsers_give_the_earliest_cause():
    from trainguard.detect.kernel_log import parse_kernel_line
    from trainguard.detect.training_log import classify_training_line

    kernel = [
        "[   10.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
        "[   10.100000] NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python, Ch 00000010",
    ]
    timeout = (
        "[rank{r}]:[E1122 08:00:00.000000 123 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
        "ran for 600011 milliseconds before timing out."
    )
    events = [e for e in map(parse_kernel_line, kernel) if e is not None]
    events += [
        e for r in range(16) if (e := classify_training_line(timeout.format(r=r), now=600.0 + r)) is not None
    ]
    assert len(events) == 18
    assert root_cause_for(events) is RootCause.FAULTY_GPU
    assert root_cause_for(events[2:]) is RootCause.NCCL_WATCHDOG_TIMEOUT
