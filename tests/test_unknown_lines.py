"""A training-log line no rule knows but shaped like an error is reported as ``unknown`` with its
text, never dropped (#23); kernel lines such as "ACPI Error:" stay out."""

from __future__ import annotations

import pytest

from trainguard.detect.training_log import classify_training_line
from trainguard.incidents.taxonomy import RootCause, as_evidence
from trainguard.records import Category

ERRORS = [
    "F1126 10:14:02.123456 1234 op_kernel.cc:1780] FATAL: unexpected state in allocator",
    "ld: fatal error: cannot open output file",
    "F0522 10:14:02.123456 1234 pjrt_stream_executor_client.cc:2113] Check failed: buffer != nullptr",
    "srun: error: node12: task 3: Exited with exit code 1",
    "slurmstepd: error: *** JOB 4242 ON node12 CANCELLED AT 2024-05-22T10:14:02 DUE TO TIME LIMIT ***",
]
NOT_ERRORS = [
    "[    0.512345] ACPI Error: AE_NOT_FOUND, While resolving a named reference package element (20210730/dspkginit-438)",
    "ACPI Error: Aborting method \\_SB.PCI0.LPCB.EC0._Q66 due to previous error (AE_NOT_FOUND)",
    "step 120 loss 2.31 lr 3e-4",
    "the metric Error: is reported below",
    "Traceback (most recent call last):",  # the exception line that closes it is the finding
    "srun: job 4242 queued and waiting for resources",
]


@pytest.mark.parametrize("line", ERRORS)
def test_an_error_shaped_line_no_rule_knows_is_unknown_with_its_text(line: str) -> None:
    ev = classify_training_line(line, now=0.0)
    assert ev is not None and ev.category is Category.UNKNOWN and ev.text == line
    evidence = as_evidence(ev)
    assert evidence is not None and evidence.cause is RootCause.UNKNOWN


@pytest.mark.parametrize("line", NOT_ERRORS)
def test_kernel_and_ordinary_lines_are_not_findings(line: str) -> None:
    assert classify_training_line(line, now=0.0) is None


def test_a_line_a_rule_knows_keeps_its_category() -> None:
    ev = classify_training_line(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", now=0.0
    )
    assert ev is not None and ev.category is Category.CUDA_OOM


@pytest.mark.parametrize("engine", ["stdlib", "hyperscan"])
def test_logs_scan_reports_them_through_the_first_pass(tmp_path, engine: str) -> None:
    if engine == "hyperscan":
        pytest.importorskip("hyperscan")
    from trainguard.detect.scan import scan_file

    chatter = "node1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"
    log = tmp_path / "rank0.log"
    log.write_text("\n".join([chatter] * 20 + ERRORS + NOT_ERRORS + [chatter] * 20) + "\n")
    found = {e.text: e for e in scan_file(log, engine=engine)}
    assert set(found) == set(ERRORS)
    assert all(e.category is Category.UNKNOWN for e in found.values())
    assert found[ERRORS[0]].line_no == 21
