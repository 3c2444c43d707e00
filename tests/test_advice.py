"""Restart or stop per failed attempt (`incidents.advice`, `logs explain --advise`).

Every workload signature has a line shaped as the real program prints it, and a cascade of it
(another rank's communicator abort quoting it, the elastic agent's summary) that must not stop a job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.incidents.advice import EXIT, WORKLOAD, AttemptOutcome, recommend, root_line, workload_bug

REAL = {
    "checkpoint_mismatch": "RuntimeError: Error(s) in loading state_dict for GPT:",
    "shape": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x512 and 768x3072)",
    "argument": "train.py: error: unrecognized arguments: --lr-warmup 100",
    "configuration": "omegaconf.errors.ConfigAttributeError: Key 'optimizer' is not in struct",
    "missing_file": "FileNotFoundError: [Errno 2] No such file or directory: '/data/shards/train_000.bin'",
    "code": "ModuleNotFoundError: No module named 'flash_attn'",
}
CASCADES = (
    "[rank3]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3. Original reason for "
    "failure was: {line}",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED ({line})",
)


def test_every_signature_of_the_table_has_a_real_line() -> None:
    assert {s.name for s in WORKLOAD} == set(REAL)


@pytest.mark.parametrize("name", sorted(REAL))
def test_workload_signature_stops_the_job(name: str) -> None:
    sig = workload_bug(f"[rank1]: {REAL[name]}")
    assert sig is not None and sig.name == name
    rec = recommend([AttemptOutcome(1, REAL[name], step=0)])
    assert rec.verb == "stop" and rec.exit_code == EXIT["stop_workload"] == 3


@pytest.mark.parametrize("name", sorted(REAL))
@pytest.mark.parametrize("cascade", CASCADES)
def test_a_cascade_of_a_workload_line_is_not_its_root_cause(name: str, cascade: str) -> None:
    line = cascade.format(line=REAL[name])
    assert workload_bug(line) is None
    assert recommend([AttemptOutcome(1, line, step=5)]).verb == "restart"
    assert (
        root_line(
            [line, "CUDA kernel errors might be asynchronously reported at some other API call", REAL[name]]
        )
        == REAL[name]
    )


def test_the_same_exception_at_the_same_step_twice_stops() -> None:
    bug = "ValueError: bad batch at 0x7f3a2c"
    h = [AttemptOutcome(1, bug, step=120), AttemptOutcome(2, bug.replace("7f3a2c", "55aa01"), step=120)]
    assert recommend(h[:1]).verb == "restart"
    rec = recommend(h)
    assert rec.verb == "stop" and rec.signature == "repeated" and rec.exit_code == 3


def test_the_same_exception_at_a_later_step_restarts() -> None:
    bug = "RuntimeError: CUDA error: an illegal memory access was encountered"
    rec = recommend([AttemptOutcome(1, bug, step=120), AttemptOutcome(2, bug, step=400)])
    assert rec.verb == "restart" and rec.retries_left == 2  # progress reset the budget


def test_no_progress_spends_the_retry_budget_and_progress_resets_it() -> None:
    hang = "Watchdog caught nothing; step timed out"
    stuck = [AttemptOutcome(i, hang, step=None) for i in range(1, 4)]
    assert recommend(stuck[:2]).verb == "restart"
    rec = recommend(stuck)
    assert rec.verb == "stop" and rec.exit_code == EXIT["stop_budget"] == 1
    moving = [
        AttemptOutcome(1, hang, step=10),
        AttemptOutcome(2, hang, step=20),
        AttemptOutcome(3, hang, step=30),
    ]
    assert recommend(moving).verb == "restart"


def test_hardware_root_cause_restarts_without_the_gpu() -> None:
    rec = recommend(
        [
            AttemptOutcome(
                1, "RuntimeError: CUDA error: uncorrectable ECC error encountered", 50, gpu="0000:3b:00.0"
            )
        ]
    )
    assert rec.verb == "restart_without" and "0000:3b:00.0" in rec.reason and rec.exit_code == 76


def _torchrun_dir(root: Path, attempts: list[tuple[list[str], list[str]]]) -> Path:
    for n, (rank0, rank1) in enumerate(attempts):
        for r, lines in enumerate((rank0, rank1)):
            d = root / "run" / f"attempt_{n}" / str(r)
            d.mkdir(parents=True)
            (d / "stderr.log").write_text("\n".join(lines) + "\n")
    return root / "run"


def test_explain_advises_each_attempt_and_exits_with_the_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    crash = [
        "step 10 loss 2.1",
        "Traceback (most recent call last):",
        '  File "train.py", line 40, in <module>',
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/val.bin'",
    ]
    peer = [
        "step 10 loss 2.1",
        "[rank1]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.",
    ]
    job = _torchrun_dir(
        tmp_path,
        [
            (
                ["step 40 loss 1.0", "RuntimeError: CUDA error: an illegal memory access was encountered"],
                peer,
            ),
            (crash, peer),
        ],
    )
    assert main(["logs", "explain", str(job), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [a["recommendation"]["verb"] for a in out["attempts"]] == ["restart", "stop"]
    assert out["attempts"][1]["step"] == 10 and "FileNotFoundError" in out["attempts"][1]["root"]
    assert main(["logs", "explain", str(job), "--advise"]) == 3


def test_explain_restarts_when_only_cascades_quote_the_bug(tmp_path: Path) -> None:
    line = "[rank1]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1. Original reason for failure was: FileNotFoundError: [Errno 2] No such file or directory: 'x'"
    job = _torchrun_dir(
        tmp_path,
        [
            (
                ["step 3", "RuntimeError: CUDA error: an illegal memory access was encountered"],
                ["step 3", line],
            )
        ],
    )
    assert main(["logs", "explain", str(job), "--advise"]) == EXIT["restart"]
