"""`trainguard logs explain`: the causal rank of a failed multi-rank job, whatever the log layout.

The generated jobs put the causal rank where a naive reader would not look first: not rank 0,
not the first file, and (in the interleaved file) not the first failure line in file order.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.detect.training_log import classify_training_line
from trainguard.incidents import JobFinding, explain_job
from trainguard.incidents.joblogs import job_findings, nccl_identities, rank_of_path

RANKS, HOST = 4, "node07"
BUS = ["18000", "3b000", "5e000", "86000"]
CAUSAL = 2
_E = "[rank{r}]:[E1124 10:{mm}:{ss}.{us} 4242 ProcessGroupNCCL.cpp:{n}] "
_PG = "[PG ID 0 PG GUID 0(default_pg) Rank {r}] "
_WORK = "WorkNCCL(SeqNum=18331, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000)"
FAULTS = {
    "ecc": ["[rank{r}]: Traceback (most recent call last):", "[rank{r}]:     loss.backward()",
            "[rank{r}]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
            "[rank{r}]: CUDA kernel errors might be asynchronously reported at some other API call.",
            "[rank{r}]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            _E + _PG + "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC error "
            "encountered"],
    "ima": ["[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered",
            "[rank{r}]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            _E + _PG + "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access "
            "was encountered"],
}  # fmt: skip
TIMEOUT = [
    _E
    + "[Rank {r}] Watchdog caught collective operation timeout: "
    + _WORK
    + " ran for 600042 milliseconds.",
    _E
    + _PG
    + "Exception (either an error or timeout) detected by watchdog at work: 18331, last enqueued NCCL "
    "work: 18331, last completed NCCL work: 18330.",
    _E
    + "[Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
    "subsequent GPU operations might run on corrupted/incomplete data.",
    _E + "[Rank {r}] To avoid data inconsistency, we are taking the entire process down.",
    _E
    + _PG
    + "Process group watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective "
    "operation timeout: " + _WORK + " ran for 600042 milliseconds before timing out.",
    "[rank{r}]: torch.distributed.DistBackendError: NCCL communicator was aborted on rank {r}. Original reason for "
    "failure was: [Rank {r}] Watchdog caught collective operation timeout: " + _WORK + " ran for 600042 ms.",
]


def _rank_lines(r: int, fault: str | None) -> tuple[list[str], list[str]]:
    """(lines before the failure, failure lines) of rank ``r``; the causal rank fails at 10:14:02,
    the others time out ten minutes later."""
    pid = 4240 + r
    head = [f"{HOST}:{pid}:{pid} [{r}] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>",
            f"{HOST}:{pid}:{pid} [{r}] NCCL INFO comm 0x55d3c8a{r} rank {r} nranks {RANKS} cudaDev {r} nvmlDev {r} "
            f"busId {BUS[r]} commId 0x9c1b - Init COMPLETE"]  # fmt: skip
    head += [f"{HOST}:{pid}:{pid + 9} [{r}] NCCL INFO Channel {c:02d}/0 : {r}[{r}] -> {(r + 1) % RANKS}[{(r + 1) % RANKS}] "
             "via P2P/CUMEM/read" for c in range(8)]  # fmt: skip
    head += [f"[rank{r}]: step {s} | loss 2.{s:03d} | 412 TFLOP/s" for s in range(1, 40)]
    if fault is not None:
        fields = dict(r=r, mm="14", ss="02", us=f"{512000 + r:06d}", n=1895)
        return head, [t.format(**fields) for t in FAULTS[fault]]
    fields = dict(r=r, mm="24", ss="02", us=f"{600000 + 1000 * r:06d}", n=632)
    return head, [t.format(**fields) for t in TIMEOUT]


def _job(tmp_path: Path, layout: str, fault: str = "ecc") -> list[Path]:
    ranks = {r: _rank_lines(r, fault if r == CAUSAL else None) for r in range(RANKS)}
    if layout == "interleaved":
        # heads in rank order, then the consequences before the causal error (stdout buffering)
        order = [r for r in range(RANKS) if r != CAUSAL] + [CAUSAL]
        lines = [ln for r in range(RANKS) for ln in ranks[r][0]] + [ln for r in order for ln in ranks[r][1]]
        path = tmp_path / "train.log"
        path.write_text("\n".join(lines) + "\n")
        return [path]
    for r, (head, tail) in ranks.items():
        if layout == "torchrun":
            folder = tmp_path / "logs" / "ddp_x1y2" / "attempt_0" / str(r)
            folder.mkdir(parents=True)
            (folder / "stdout.log").write_text("\n".join(head) + "\n")
            (folder / "stderr.log").write_text("\n".join(tail) + "\n")
        else:  # slurm --output=job-%j-%t.out
            (tmp_path / f"job-5512-{r}.out").write_text("\n".join(head + tail) + "\n")
    return [tmp_path / "logs"] if layout == "torchrun" else sorted(tmp_path.glob("job-*.out"))


@pytest.mark.parametrize("layout", ["torchrun", "slurm", "interleaved"])
def test_explain_names_the_causal_rank_whatever_the_layout(tmp_path, layout, capsys):
    paths = _job(tmp_path, layout)
    assert main(["logs", "explain", "--json", *map(str, paths)]) == 0
    out = json.loads(capsys.readouterr().out)
    root = out["root_cause"]
    assert (root["rank"], root["host"], root["category"]) == (CAUSAL, HOST, "gpu_memory_ecc")
    assert "uncorrectable ECC error" in root["text"] and root["line_no"] > 1
    assert out["cause"] == "gpu_hbm_memory" and out["action"] == "reset_gpu" and out["confidence"] == "high"
    # every other rank failed as a consequence, each timeout event counted once
    assert {(c["rank"], c["category"], c["count"]) for c in out["consequences"]} == {
        (r, "nccl_timeout_hang", 1) for r in range(RANKS) if r != CAUSAL
    }


def test_explain_table_names_rank_gpu_and_action(tmp_path, capsys):
    assert main(["logs", "explain", str(_job(tmp_path, "torchrun")[0])]) == 0
    out = capsys.readouterr().out
    assert f"root cause: rank {CAUSAL} on {HOST} GPU 0000:5e:00" in out
    assert "action: reset_gpu" in out and "consequences: 3 other rank(s)" in out
    assert "nccl_timeout_hang      3 rank(s): 0-1, 3" in out  # every other rank, as ranges


def test_illegal_address_without_hardware_or_driver_evidence_is_unknown_with_suspects(tmp_path, capsys):
    paths = _job(tmp_path, "slurm", fault="ima")
    assert main(["logs", "explain", "--json", *map(str, paths)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["root_cause"]["rank"] == CAUSAL and out["root_cause"]["category"] == "unknown"
    assert out["cause"] == "unknown" and out["confidence"] == "medium"
    note = next(line for line in out["evidence"] if "no Xid or ECC event on GPU 0000:5e:00" in line)
    assert "unknown; suspects: software_bug (the driver" in note and "faulty_gpu" in note


def test_illegal_address_with_an_xid_on_that_gpu_is_the_gpus(tmp_path, capsys):
    paths = _job(tmp_path, "slurm", fault="ima")
    dmesg = tmp_path / "dmesg.log"
    dmesg.write_text("2026-11-24T10:14:01,900000+00:00 NVRM: Xid (PCI:0000:5e:00): 79, pid=4242, name=python, "
                     "GPU has fallen off the bus.\n")  # fmt: skip
    assert main(["logs", "explain", "--json", *map(str, paths), str(dmesg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cause"] == "faulty_gpu" and out["root_cause"]["rank"] == CAUSAL
    assert out["root_cause"]["path"] == str(dmesg) and out["action"] == "reboot_node"


def test_only_timeouts_is_a_low_confidence_hang():
    def timeout(rank: int, t: float) -> JobFinding:
        event = classify_training_line(
            f"[rank{rank}]: [Rank {rank}] Watchdog caught collective operation timeout"
        )
        assert event is not None
        return JobFinding(replace(event, time=t), rank)

    ex = explain_job([timeout(1, 20.0), timeout(0, 10.0)])
    assert ex.root is not None and ex.root.rank == 0 and ex.confidence == "low"
    assert ex.cause.value == "nccl_watchdog_timeout"


def test_rank_of_path_reads_the_common_layouts():
    assert rank_of_path(Path("logs/run_1/attempt_0/3/stderr.log")) == 3
    assert rank_of_path(Path("job-5512-12.out")) == 12
    assert rank_of_path(Path("rank7.stdout")) == 7
    assert rank_of_path(Path("slurm-5512.out")) is None  # a job id, not a task id


def test_nccl_init_lines_give_host_and_gpu_of_each_rank():
    head = (f"{HOST}:1:1 [1] NCCL INFO comm 0x1 rank 1 nranks 2 cudaDev 1 busId 3b000 commId 0x2 - Init COMPLETE\n"
            f"{HOST}:1:1 [1] NCCL INFO comm 0x3 rank 0 nranks 1 cudaDev 1 busId 3b000 commId 0x4 - Init COMPLETE\n")  # fmt: skip
    assert nccl_identities(head) == {1: (HOST, "0000:3b:00"), 0: (HOST, "0000:3b:00")}


def test_a_missing_path_is_an_input_error(tmp_path, capsys):
    assert main(["logs", "explain", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_job_findings_fold_each_watchdog_event_into_one(tmp_path):
    paths = _job(tmp_path, "interleaved")
    per_rank = [f.rank for f in job_findings(paths)]
    assert sorted(per_rank) == sorted([0, 1, 3, CAUSAL])


def test_a_hang_where_one_rank_is_silent_points_at_that_rank(tmp_path, capsys):
    for r in range(RANKS):
        head, tail = _rank_lines(r, None)
        (tmp_path / f"job-5512-{r}.out").write_text("\n".join(head + ([] if r == CAUSAL else tail)) + "\n")
    assert main(["logs", "explain", "--json", *map(str, sorted(tmp_path.glob("*.out")))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["confidence"] == "low" and out["cause"] == "nccl_watchdog_timeout"
    assert any(line.startswith(f"rank(s) {CAUSAL} logged no failure") for line in out["evidence"])
