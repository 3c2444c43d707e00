"""Replica groups of more than one rank are one data-parallel job: ``trainguard run --replica-groups
2 --nproc-per-node 2`` (trainguard's torchft DDP, real Lighthouse and Managers, gloo) follows a
plain torch DDP job of 4 ranks under torchrun on the same global batch, and every rank of every
group holds the same weights after every commit. torchft's own DDP, which never averages within
a group, is refused there with an error naming the script's line and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from real_parts import require_module

require_module("torchft", install="pip install 'trainguard[ft]' (make install does)")
torch = pytest.importorskip("torch")

WORKER = Path(__file__).parent / "workers" / "dp_equal.py"
STEPS = 6
pytestmark = pytest.mark.slow


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=cwd)


def groups(
    tmp: Path, mode: str, *worker_args: str, out: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``trainguard run`` of 2 replica groups x 2 ranks of the worker."""
    argv = [sys.executable, "-m", "trainguard.cli", "run", "--replica-groups", "2", "--standalone"]
    argv += ["--nproc-per-node", "2", "--max-restarts", "0", "--db", str(tmp / "tg.db")]
    argv += ["--runs-dir", str(tmp / "runs"), "--no-tee", "--backoff-base", "0.1", "--"]
    argv += [sys.executable, str(WORKER), "--mode", mode, "--steps", str(STEPS), "--out", str(out or tmp)]
    return run([*argv, *worker_args], tmp)


def shards(out: Path) -> list[dict]:
    return [torch.load(out / f"shard{i}.pt") for i in range(4)]


@pytest.fixture(scope="module")
def plain_ddp(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """torchrun, 4 ranks, torch's own DistributedDataParallel: the reference."""
    out = tmp_path_factory.mktemp("ddp")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    proc = run([*argv, str(WORKER), "--mode", "ddp", "--steps", str(STEPS), "--out", str(out)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return shards(out)


def same_weights(records: list[dict], step: int) -> bool:
    first = records[0]["weights"][step]
    return all(all(torch.equal(r["weights"][step][k], first[k]) for k in first) for r in records[1:])


def follows_plain_ddp(ft: list[dict], plain_ddp: list[dict]) -> None:
    """Every shard committed every step with plain DDP's losses, and after every step the 4
    ranks hold the same weights, plain DDP's."""
    for shard, (ours, ddp) in enumerate(zip(ft, plain_ddp, strict=True)):
        assert ours["steps"] == ddp["steps"] == list(range(STEPS)), shard  # every step committed
        assert ours["losses"] == pytest.approx(ddp["losses"], rel=1e-5, abs=1e-6), shard
    for step in range(STEPS):
        assert same_weights(ft, step), f"the 4 ranks' weights differ after step {step}"
        for name, want in plain_ddp[0]["weights"][step].items():
            torch.testing.assert_close(ft[0]["weights"][step][name], want, rtol=1e-5, atol=1e-6)


def test_two_groups_of_two_ranks_follow_a_plain_ddp_job_of_four(tmp_path, plain_ddp):
    proc = groups(tmp_path, "ft")
    assert proc.returncode == 0, proc.stderr[-3000:]
    follows_plain_ddp(shards(tmp_path), plain_ddp)


def test_a_step_where_groups_heal_leaves_every_rank_with_the_same_weights(tmp_path):
    """torchft's step-0 sync: a group's rank that heals contributes no gradient, and torchft picks
    the group each rank heals from per group rank, so the two ranks of a group average over
    different groups in that step."""
    proc = groups(tmp_path, "ft", "--init-sync")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ft = shards(tmp_path)
    assert any(True in r["healed"] for r in ft), "no rank healed: the case this test is about never ran"
    for step in range(STEPS):
        assert ft[0]["steps"][step] == step
        assert same_weights(ft, step), f"the 4 ranks' weights differ after step {step}"


def test_torchfts_own_ddp_in_a_group_of_two_ranks_is_refused(tmp_path):
    proc = groups(tmp_path, "torchft")
    assert proc.returncode != 0
    logs = "".join(
        p.read_text(errors="replace")
        for p in (tmp_path / "runs").rglob("*")
        if p.is_file() and p.suffix in (".stderr", ".log")
    )
    assert "ConfigError" in logs, proc.stderr[-3000:]
    assert f"{WORKER}:" in logs and "FtDDP(mgr, sgd.model)" in logs  # the script's own line
    assert "never within one: with 2 ranks per group (--nproc-per-node 2)" in logs
    assert "from trainguard.torch.ft import DistributedDataParallel" in logs  # the fix
    assert not list(tmp_path.glob("shard*.pt"))  # no rank trained
