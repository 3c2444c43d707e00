"""Training-log classification against golden output of failing PyTorch/NCCL jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.actions import Advice
from trainguard.detect.training_log import ElasticRootCause, classify_training_line, parse_elastic_root_cause
from trainguard.records import Category, EventKind, Severity

DATA = Path(__file__).parent / "data" / "training"


def _golden() -> tuple[list[str], dict[int, tuple[str, str]]]:
    lines = (DATA / "rank_failures.log").read_text(encoding="utf-8").splitlines()
    expected = {}
    for row in (DATA / "rank_failures.expected.tsv").read_text(encoding="utf-8").splitlines():
        if row and not row.startswith("#"):
            no, category, severity = row.split("\t")
            expected[int(no)] = (category, severity)
    return lines, expected


def test_golden_training_log_classifies_exactly_the_failure_lines():
    lines, expected = _golden()
    got = {}
    for no, line in enumerate(lines, 1):
        event = classify_training_line(line)
        if event is not None:
            assert event.kind is EventKind.TRAINING
            assert event.text == line
            got[no] = (event.category.value, event.severity.value)
    assert got == expected


def test_every_training_category_is_covered_by_the_golden_log():
    _, expected = _golden()
    wanted = {"gpu_hardware", "gpu_memory_ecc", "nccl_network", "nccl_timeout_hang", "cuda_oom",
              "application_bug", "driver_software", "node_host", "unknown"}  # fmt: skip
    assert {category for category, _ in expected.values()} == wanted


def test_nccl_watchdog_timeout_is_a_hang():
    line = (
        "[rank3]:[E1122 08:40:07.123 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600042 milliseconds before timing out."
    )
    event = classify_training_line(line)
    assert event is not None and event.category is Category.NCCL_TIMEOUT_HANG


def test_cuda_oom_is_the_jobs_problem_not_the_gpus():
    event = classify_training_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")
    assert event is not None
    assert (event.category, event.action) == (Category.CUDA_OOM, Advice.RESTART_APP)


def test_uncorrectable_ecc_calls_for_a_gpu_reset():
    event = classify_training_line("RuntimeError: CUDA error: uncorrectable ECC error encountered")
    assert event is not None and (event.severity, event.action) == (Severity.FATAL, Advice.RESET_GPU)


def test_generic_traceback_line_is_a_low_severity_application_bug():
    event = classify_training_line("AttributeError: 'NoneType' object has no attribute 'shape'")
    assert event is not None
    assert (event.category, event.severity) == (Category.APPLICATION_BUG, Severity.WARNING)


@pytest.mark.parametrize(
    "line",
    [
        "node1:99:99 [0] NCCL INFO Channel 00/32 :    0   1   2   3",
        "node1:99:99 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB",
        "step 100 loss 1.23",
        "Traceback (most recent call last):",
        "  exitcode  : 0 (pid: 12)",
        "ACPI Error: AE_NOT_FOUND, While resolving a named reference package element",
        "",
    ],
)
def test_chatter_is_not_a_finding(line):
    assert classify_training_line(line) is None


def test_root_cause_block_gives_rank_exitcode_and_signal():
    lines, _ = _golden()
    cause = parse_elastic_root_cause(lines)
    assert cause == ElasticRootCause(
        rank=3, local_rank=3, exitcode=-9, signal="SIGKILL", host="node3", pid=51234
    )


def test_no_root_cause_block_gives_none():
    assert parse_elastic_root_cause(["ChildFailedError:", "nothing here"]) is None


def test_now_is_the_event_time():
    event = classify_training_line("Segmentation fault (core dumped)", now=12.5)
    assert event is not None and event.time == 12.5


def test_every_rule_needle_contains_a_scanner_anchor():
    # the bulk scanner only classifies lines with an anchor; this keeps it equal to line-by-line
    from trainguard.detect.training_log import TRAINING_ANCHORS, rule_needles

    uncovered = [n for n in rule_needles() if not any(anchor in n for anchor in TRAINING_ANCHORS)]
    assert uncovered == []


# --- real-format details (issue #14 point 8, issue #10 fidelity) ------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k)`",
        "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
        "E tensorflow/stream_executor/cuda/cuda_event.cc:29] Error polling for event status: failed to query event: "
        "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
    ],
)
def test_a_cuda_failure_the_driver_or_the_gpu_can_cause_is_unknown_with_both_suspects(line):
    from trainguard.incidents.taxonomy import RootCause, as_evidence

    event = classify_training_line(line)
    assert event is not None and event.category is Category.UNKNOWN and event.action is Advice.RESTART_APP
    evidence = as_evidence(event)
    assert evidence is not None and evidence.cause is RootCause.UNKNOWN and not evidence.symptom
    assert {cause for cause, _ in evidence.suspects} == {RootCause.SOFTWARE_BUG, RootCause.FAULTY_GPU}
    assert "driver" in dict(evidence.suspects)[RootCause.SOFTWARE_BUG]


def test_torch_dsa_hint_is_not_a_finding():
    assert (
        classify_training_line("[rank3]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        is None
    )
    assert (
        classify_training_line("CUDA kernel errors might be asynchronously reported at some other API call")
        is None
    )


def test_glog_stamp_becomes_the_finding_time():
    from datetime import datetime

    now = datetime(2026, 11, 25, 9, 0).timestamp()
    line = (
        "[rank3]:[E1124 10:14:02.123456 4242 ProcessGroupNCCL.cpp:616] [Rank 3] Heartbeat monitor timed out!"
    )
    event = classify_training_line(line, now=now)
    assert event is not None and event.time == pytest.approx(
        datetime(2026, 11, 24, 10, 14, 2, 123456).timestamp()
    )


def test_a_glog_stamp_ahead_of_now_is_last_years():
    from datetime import datetime

    now = datetime(2027, 1, 2).timestamp()
    event = classify_training_line(
        "[E1231 23:59:00.5 1 x.cpp:1] [Rank 0] Watchdog caught collective operation timeout", now=now
    )
    assert event is not None and datetime.fromtimestamp(event.time or 0).year == 2026


def test_mlx5_cable_unplugged_is_a_network_finding_that_drains_the_node():
    line = ("kernel: mlx5_core 0000:5e:00.0: mlx5_port_module_event:1150:(pid 0): Port module event: module 0, "
            "Cable unplugged")  # fmt: skip
    event = classify_training_line(line)
    assert event is not None and (event.category, event.action) == (Category.NCCL_NETWORK, Advice.DRAIN)


def test_communicator_aborted_is_judged_by_the_reason_it_quotes_and_is_sympathetic():
    line = ("[rank1]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1. Original reason "
            "for failure was: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5")  # fmt: skip
    event = classify_training_line(line)
    assert event is not None and event.category is Category.NCCL_NETWORK and event.sympathetic
    assert event.text == line


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("Unable to determine the device handle for GPU 0000:3b:00.0: GPU is lost. Reboot the system", "gpu_hardware"),
        ("Unable to determine the device handle for GPU0000:17:00.0: Unknown Error", "gpu_hardware"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "driver_software"),
        ("No devices were found", "driver_software"),
        ("[ 7063.2] Memory cgroup out of memory: Killed process 63214 (python) total-vm:3149468kB", "node_host"),
        ("RuntimeError: DataLoader worker (pid 1817) is killed by signal: Killed.", "node_host"),
        ("RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: "
         "you tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate memory)", "node_host"),
        ("[rank0]:[E1019 01:04:03.35 1 ProcessGroupNCCL.cpp:1413] [PG ID 0 PG GUID 0(default_pg) Rank 0] Heartbeat "
         "monitor timed out! Process will be terminated after dumping debug info.", "nccl_timeout_hang"),
        ("[rank1]:[E626 06:24:44.90 1 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception "
         "(either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811", "nccl_timeout_hang"),
    ],
)  # fmt: skip
def test_real_formats_get_their_category(line, category):
    event = classify_training_line(line)
    assert event is not None and event.category.value == category


def test_one_watchdog_event_is_one_finding(tmp_path):
    from trainguard.detect.scan import merge_events, scan_file

    e = "[rank3]:[E1124 10:14:02.{} 42 ProcessGroupNCCL.cpp:{}] "
    lines = [
        e.format(1, 632) + "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600042 ms",
        e.format(2, 2168) + "[PG ID 0 PG GUID 0(default_pg) Rank 3] Exception (either an error or timeout) detected by watchdog",
        e.format(3, 684) + "[Rank 3] Some NCCL operations have failed or timed out.",
        e.format(4, 1537) + "[PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with "
        "exception: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600042 ms",
        "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: "
        "[Rank 3] Watchdog caught collective operation timeout",
    ]  # fmt: skip
    path = tmp_path / "rank3.log"
    path.write_text("\n".join(lines) + "\n")
    assert len(list(scan_file(path))) == 5  # every line is a finding on its own...
    assert [ev.line_no for ev in merge_events(scan_file(path))] == [1]  # ...of one event
    other_rank = tmp_path / "two.log"
    other_rank.write_text(
        lines[0] + "\n" + lines[0].replace("rank3", "rank4").replace("Rank 3", "Rank 4") + "\n"
    )
    assert (
        len(list(merge_events(scan_file(other_rank)))) == 2
    )  # the same words on another rank are its own event


def test_without_line_numbers_the_merger_goes_by_time():
    from dataclasses import replace

    from trainguard.detect.merge import EventMerger

    line = "[rank1]: [Rank 1] Watchdog caught collective operation timeout"
    event = classify_training_line(line)
    assert event is not None
    merger = EventMerger()
    stream = [replace(event, time=t) for t in (100.0, 101.0, 130.0)] + [replace(event, time=None)] * 2
    assert [merger.is_new(e) for e in stream] == [True, False, True, True, True]
