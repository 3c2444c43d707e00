"""Training-log classification against golden output of failing PyTorch/NCCL jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.detect.training_log import ElasticRootCause, classify_training_line, parse_elastic_root_cause
from trainguard.records import Action, Category, EventKind, Severity

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
              "application_bug", "driver_software", "node_host"}  # fmt: skip
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
    assert (event.category, event.action) == (Category.CUDA_OOM, Action.RESTART_APP)


def test_uncorrectable_ecc_calls_for_a_gpu_reset():
    event = classify_training_line("RuntimeError: CUDA error: uncorrectable ECC error encountered")
    assert event is not None and (event.severity, event.action) == (Severity.FATAL, Action.RESET_GPU)


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
