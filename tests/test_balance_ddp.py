"""Rebalancing under DDP: the same update as uniform DDP at every step, and an exact resume.

Two processes, gloo on CPU, on a simulated node whose GPU 1 runs at a tenth of its speed (the
supervisor's speeds file, as under ``trainguard run --backend sim``): rank 1's compute really
takes longer per sample (torch.sim_gpu), and its peers really wait for it.
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

GLOBAL_BATCH = 16
STEPS = 14
SLOW = 0.1  # GPU 1's speed
HANG_S = 180


@pytest.fixture
def own_tmp():
    path = Path(tempfile.mkdtemp(prefix="tg-test-"))
    yield path
    if not os.environ.get("TG_KEEP"):
        shutil.rmtree(path, ignore_errors=True)


def _setup(rank: int, world: int, out: Path, name: str) -> None:
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out / f'pg-{name}'}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=150),
    )


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def _data():
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _uniform_worker(rank: int, world: int, run_dir: str) -> None:
    """Plain DDP with DistributedSampler: B / W samples per rank, no trainguard."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    out = Path(run_dir)
    _setup(rank, world, out, "uniform")
    data = _data()
    inner = _model()
    model = DDP(inner)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = DistributedSampler(data, world, rank, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)
    weights, step, epoch = [], 0, 0
    while step < STEPS:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            weights.append(_flat(inner))
            step += 1
            if step == STEPS:
                break
        epoch += 1
    if rank == 0:
        torch.save(torch.stack(weights), out / "weights-uniform.pt")
    dist.destroy_process_group()
    _exit_now()


def _balanced_worker(rank: int, world: int, run_dir: str, stop_at: int, phase: str) -> None:
    """DDP with the Guard balancing, rank 1 slow; stops (the process exits) after ``stop_at``."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    from trainguard.balance import LadderConfig
    from trainguard.torch import Checkpointer, Guard, ShareSampler, TrainState

    out = Path(run_dir)
    _setup(rank, world, out, phase)
    # a simulated node: each rank on its GPU, whose speed the supervisor publishes
    os.environ.update(TRAINGUARD_SIM_SPEEDS=str(out / "sim-gpus.json"), TRAINGUARD_GPU=str(rank))
    data = _data()
    inner = _model()
    model = DDP(inner)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = ShareSampler(data, GLOBAL_BATCH, shuffle=True, seed=5)
    loader = DataLoader(data, batch_sampler=sampler, generator=torch.Generator())
    state = TrainState(model, opt, sampler=sampler)
    ckpt = Checkpointer(out / "ckpt", async_save=False)
    start = ckpt.resume(state)
    ladder = LadderConfig(persist=1)
    log = []
    with Guard(ckpt, state, run_dir=out, balance=ladder, balance_every=2, checkpoint_every=4) as guard:

        def batches():
            while True:
                sampler.set_epoch(sampler.epoch)
                yield from loader

        data_iter = batches()
        for step in guard.range(start, STEPS):
            x, y = next(data_iter)
            loss = torch.nn.functional.cross_entropy(model(x), y) * guard.weight(len(y))
            loss.backward()
            if guard.step(step, loss) == "proceed":
                opt.step()
            opt.zero_grad()
            log.append({"step": step, "n": len(y), "shares": list(sampler.shares_at(sampler.produced - 1))})
            torch.save(_flat(inner), out / f"w-{phase}-{step}-rank{rank}.pt")
            if step + 1 == stop_at:  # interrupted: exits without saving again
                ckpt.wait()
                _write(out / f"log-{phase}-rank{rank}.json", log, guard)
                dist.destroy_process_group()
                _exit_now()
        _write(out / f"log-{phase}-rank{rank}.json", log, guard)
    ckpt.close()
    dist.destroy_process_group()
    _exit_now()


def _write(path: Path, log: list, guard) -> None:
    moves = [m.to_dict() for m in guard.balancer.moves]
    path.write_text(json.dumps({"log": log, "moves": moves}))


def _spawn(fn, *args) -> None:
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "trainguard.torch"])
    mp.start_processes(fn, args=(2, *args), nprocs=2, join=True, start_method="forkserver")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rebalanced_run_matches_uniform_ddp_at_every_step_and_resumes(own_tmp):
    (own_tmp / "sim-gpus.json").write_text(json.dumps({"gpus": {"0": 1.0, "1": SLOW}}))
    _spawn(_uniform_worker, str(own_tmp))
    _spawn(_balanced_worker, str(own_tmp), 9, "first")  # checkpoint at 8, killed after 9
    _spawn(_balanced_worker, str(own_tmp), -1, "resumed")
    uniform = torch.load(own_tmp / "weights-uniform.pt", weights_only=True)

    first = json.loads((own_tmp / "log-first-rank0.json").read_text())
    resumed = json.loads((own_tmp / "log-resumed-rank0.json").read_text())
    # the slow rank was found and its share moved, with the evidence
    assert first["moves"] and first["moves"][0]["verb"] == "rebalance" and first["moves"][0]["rank"] == 1
    moved = first["moves"][0]["shares"]
    assert moved[1] < GLOBAL_BATCH // 2 and sum(moved) == GLOBAL_BATCH
    assert any(e["shares"] != [8, 8] for e in first["log"])
    # the resumed run started at the checkpoint (step 8) with the shares in effect there
    assert resumed["log"][0]["step"] == 8
    at_8 = next(e for e in first["log"] if e["step"] == 8)
    assert resumed["log"][0]["shares"] == at_8["shares"] != [8, 8]
    # the same update as uniform DDP at every step, before and after the restart
    for phase, steps in (("first", range(9)), ("resumed", range(8, STEPS))):
        for step in steps:
            got = torch.load(own_tmp / f"w-{phase}-{step}-rank0.pt", weights_only=True)
            assert torch.allclose(got, uniform[step], rtol=1e-4, atol=1e-5), f"{phase} step {step}"
    findings = [json.loads(line) for line in (own_tmp / "findings" / "rank0.jsonl").read_text().splitlines()]
    rebalances = [f for f in findings if f["rule"] == "balance.rebalance"]
    assert rebalances and "rank 1" in rebalances[0]["reason"]
    evidence = json.loads(rebalances[0]["evidence"][0])
    assert evidence["rank"] == 1 and evidence["gpus"] == [0, 1]
    assert evidence["speeds"][1] < 0.5 * evidence["speeds"][0]  # its compute measured, waiting not


# Shares that change at fixed steps: the interrupted run must be bitwise the uninterrupted one.
MOVES = {2: (12, 4), 8: (3, 13)}  # after step s: these shares from the next global batch


def _scheduled_worker(rank: int, world: int, run_dir: str, stop_at: int, phase: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    from trainguard.torch import Checkpointer, ShareSampler, TrainState

    out = Path(run_dir)
    _setup(rank, world, out, f"{phase}-{stop_at}")
    data = _data()
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 3)
        )
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
    sampler = ShareSampler(data, GLOBAL_BATCH, shuffle=True, seed=5)
    loader = DataLoader(data, batch_sampler=sampler, generator=torch.Generator())
    state = TrainState(model, opt, sched, sampler=sampler)
    ckpt = Checkpointer(out / "ckpt", async_save=phase != "ref")
    step = ckpt.resume(state)
    seen = open(out / f"seen-{phase}-rank{rank}.jsonl", "a")  # noqa: SIM115
    while step < STEPS:
        sampler.set_epoch(sampler.epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y) * sampler.weight(len(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            record = {"step": step, "n": len(y), "loss": loss.item().hex(), "x": x.sum().item().hex()}
            seen.write(json.dumps(record) + "\n")
            if step in MOVES:  # every rank, before it hands out the next batch
                sampler.schedule(step + 1, MOVES[step])
            step += 1
            if step % 3 == 0 and phase != "ref":
                ckpt.save(step, state)
            if step == stop_at:
                seen.close()
                ckpt.wait()
                dist.destroy_process_group()
                _exit_now()
            if step == STEPS:
                break
    seen.close()
    ckpt.close()
    if rank == 0:
        torch.save(model.module.state_dict(), out / f"final-{phase}.pt")
    dist.destroy_process_group()
    _exit_now()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_and_resumed_rebalanced_job_ends_bitwise_like_an_uninterrupted_one(own_tmp):
    ref, run = own_tmp / "ref", own_tmp / "run"
    ref.mkdir()
    run.mkdir()
    _spawn(_scheduled_worker, str(ref), -1, "ref")
    # killed after 7 steps (checkpoint at 6, after the first move, mid-epoch 1), then after 13
    # (checkpoint at 12, after the second move); each time resumed from the checkpoint
    for stop_at in (7, 13, -1):
        _spawn(_scheduled_worker, str(run), stop_at, "run")
    for rank in range(2):
        expected = {
            r["step"]: r
            for r in map(json.loads, (ref / f"seen-ref-rank{rank}.jsonl").read_text().splitlines())
        }
        seen = [json.loads(line) for line in (run / f"seen-run-rank{rank}.jsonl").read_text().splitlines()]
        assert len(seen) == STEPS + 2  # steps 6 and 12 ran twice
        for r in seen:  # every run of a step: the same samples, the same loss bits
            assert r == expected[r["step"]], f"rank {rank} step {r['step']}"
        sizes = [expected[s]["n"] for s in range(STEPS)]
        assert sizes == [8, 8, 8] + [(12, 4)[rank]] * 6 + [(3, 13)[rank]] * 5
    a = torch.load(ref / "final-ref.pt", weights_only=True)
    b = torch.load(run / "final-run.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
