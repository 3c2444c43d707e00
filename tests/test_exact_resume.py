"""A DDP run interrupted at step k and resumed is bitwise identical to an uninterrupted one.

Two processes, gloo on CPU, deterministic algorithms, dropout, a shuffling sampler, Adam and an
LR schedule. The interrupted run stops (the processes exit) at several steps, mid-epoch and at
an epoch boundary, right after a checkpoint or a step after it, and resumes each time.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TOTAL = 20  # 40 samples / 2 ranks / batch 4 = 5 steps per epoch
EVERY = 3
# A stuck rank fails the test within minutes, with every rank's stacks in the captured stderr,
# instead of silently using up the test's timeout. Generous: on a loaded host a phase of a worker
# takes up to about a minute (mostly the checkpoint writer process importing torch).
HANG_S = 180
COLLECTIVE_TIMEOUT = timedelta(seconds=150)  # a rank waits this long for its peer in a collective


@pytest.fixture
def own_tmp():
    # Not pytest's tmp_path: with several pytest sessions sharing /tmp/pytest-of-<user>, the
    # worker processes' rendezvous files must not live where another session may prune them.
    path = Path(tempfile.mkdtemp(prefix="tg-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fail_fast_on_hang() -> None:
    """Past HANG_S this process prints every thread's stack and exits 1 (mp.spawn then fails and
    terminates the other rank, which prints its stacks on that SIGTERM); a fatal signal prints the
    Python stacks too."""
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def _exit_now() -> None:
    """Exit as the interrupted phases always did, skipping the interpreter's and C++ runtime's
    teardown beside the gloo threads that DDP keeps alive after destroy_process_group (see
    tests/test_checkpoint_sharded.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker(rank: int, world: int, run_dir: str, stop_at: int, phase: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard.torch import Checkpointer, ResumableSampler, TrainState

    _fail_fast_on_hang()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out = Path(run_dir)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out / f'pg-{phase}-{stop_at}'}",
        rank=rank,
        world_size=world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(40, 8), torch.randint(0, 3, (40,)))
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 3)
        )
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
    sampler = ResumableSampler(data, shuffle=True, seed=11)
    loader = DataLoader(data, batch_size=4, sampler=sampler, generator=torch.Generator())
    state = TrainState(model, opt, sched, sampler=sampler)
    ckpt = Checkpointer(out / "ckpt", keep_last=2, async_save=phase != "ref")
    step = ckpt.resume(state)
    losses = open(out / f"losses-{phase}-rank{rank}.jsonl", "a")  # noqa: SIM115
    epoch = sampler.epoch
    while step < TOTAL:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            losses.write(json.dumps({"step": step, "loss": loss.item().hex()}) + "\n")
            if step % EVERY == 0 and phase != "ref":  # the reference run never saves
                ckpt.save(step, state)
            if step == stop_at:  # interrupted: the process exits here, without saving
                losses.close()
                ckpt.wait()
                dist.destroy_process_group()
                _exit_now()
            if step == TOTAL:
                break
        epoch += 1
    losses.close()
    ckpt.close()
    if rank == 0:
        torch.save(model.module.state_dict(), out / f"final-{phase}.pt")
    dist.destroy_process_group()
    _exit_now()


def _run(run_dir: Path, stop_at: int, phase: str) -> None:
    # Fresh processes for every phase, forked from a server that imported torch once: ten spawned
    # ranks each importing torch made this test outlast its timeout on a loaded host.
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "trainguard.torch"])
    args = (2, str(run_dir), stop_at, phase)
    mp.start_processes(_worker, args=args, nprocs=2, join=True, start_method="forkserver")


def _losses(run_dir: Path, phase: str, rank: int) -> list[tuple[int, str]]:
    lines = (run_dir / f"losses-{phase}-rank{rank}.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_interrupted_ddp_run_resumes_bitwise_identical(own_tmp):
    tmp_path = own_tmp
    reference = tmp_path / "reference"
    interrupted = tmp_path / "interrupted"
    reference.mkdir()
    interrupted.mkdir()
    _run(reference, stop_at=-1, phase="ref")
    # stops at 7 (last checkpoint 6, mid-epoch 1), 12 (right after saving, mid-epoch 2) and
    # 16 (last checkpoint 15, an epoch boundary)
    for stop_at in (7, 12, 16, -1):
        _run(interrupted, stop_at=stop_at, phase="run")

    for rank in range(2):
        expected = dict(_losses(reference, "ref", rank))
        assert sorted(expected) == list(range(1, TOTAL + 1))
        seen = _losses(interrupted, "run", rank)
        # steps 7 and 16 ran twice (before and after a restart): every run of a step matches
        assert len(seen) == TOTAL + 2
        assert {s for s, _ in seen} == set(expected)
        for step, loss in seen:
            assert loss == expected[step], f"rank {rank} step {step}: {loss} != {expected[step]}"

    ref = torch.load(reference / "final-ref.pt", weights_only=True)
    got = torch.load(interrupted / "final-run.pt", weights_only=True)
    assert ref.keys() == got.keys()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
