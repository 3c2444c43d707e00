"""One rank of bench_rebalance.py: a DDP job on simulated GPUs of uneven speed (gloo, CPU).

The simulated GPU (`SimGpuModel`, the same in every arm) spends ``cost_s`` seconds of device time
per sample at full speed and ``cost_s / speed`` at ``speed``: a sleep inside the forward, so the
rank's compute really takes that long and its peers really wait for it, while the host's CPU
stays free (a busy 2-core host must not decide who is slow). The real arithmetic (a small MLP)
runs too. Its ``clock`` is the device's: the thread's CPU time plus the simulated time, what a
GPU's CUDA events would tell; the rebalancing arm reads its compute time there.

Arms (``arm``): ``ddp`` plain DDP + DistributedSampler, B / W samples per rank (no trainguard
import); ``balance`` the Guard with ``balance=True`` + ShareSampler + the loss weight. Every arm
trains on the same global batches in the same order (the dataset is a multiple of the global
batch, so DistributedSampler pads nothing), so the final losses compare like for like.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

IN, HIDDEN, CLASSES = 32, 64, 10


class SimGpuModel(nn.Module):
    """A model on a simulated GPU: each forward costs ``cost_s`` per sample of device time."""

    def __init__(self, inner: nn.Module, cost_s: float, speed: float) -> None:
        super().__init__()
        self.inner, self.cost_s, self.speed = inner, cost_s, speed
        self.simulated_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        if torch.is_grad_enabled():
            took = x.shape[0] * self.cost_s / self.speed
            self.simulated_s += took
            time.sleep(took)
        return out

    def clock(self) -> float:
        return time.thread_time() + self.simulated_s


def data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` inputs (drawn with ``seed``) labelled by one fixed linear map: train and eval agree."""
    w = torch.randn(IN, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, IN, generator=torch.Generator().manual_seed(seed))
    return x, (x @ w).argmax(1)


def main(rank: int, world: int, rendezvous: str, cfg: dict[str, Any], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    model = SimGpuModel(inner, cfg["cost_s"], cfg["speeds"][rank])
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y = data(cfg["samples"])
    dataset = torch.utils.data.TensorDataset(x, y)
    steps, global_batch = cfg["steps"], cfg["global_batch"]
    run = _balanced if cfg["arm"] == "balance" else _plain
    if cfg["arm"] == "balance":  # imported before the clock starts, as torch is in every arm
        import trainguard.torch  # noqa: F401
    dist.barrier()
    t0, cpu0, sim0 = time.perf_counter(), time.thread_time(), model.simulated_s
    moves = run(ddp, model, opt, dataset, steps, global_batch, rank, world, cfg)
    cpu_s = time.thread_time() - cpu0  # the training thread's own work (the simulated GPU sleeps)
    dist.barrier()
    loop_s = time.perf_counter() - t0
    ex, ey = data(2048, seed=1)
    with torch.no_grad():
        eval_loss = F.cross_entropy(inner(ex), ey).item()
    if rank == 0:
        result = {
            "loop_s": loop_s,
            "cpu_s": cpu_s,
            "simulated_s": model.simulated_s - sim0,
            "samples": steps * global_batch,
            "eval_loss": eval_loss,
            "moves": moves,
        }
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def _epochs(loader: Any, sampler: Any) -> Any:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _plain(
    ddp: Any, model: Any, opt: Any, dataset: Any, steps: int, batch: int, rank: int, world: int, cfg: Any
) -> list[Any]:
    sampler = torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch // world, sampler=sampler)
    it = _epochs(loader, sampler)
    for _ in range(steps):
        xb, yb = next(it)
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return []


def _balanced(
    ddp: Any, model: Any, opt: Any, dataset: Any, steps: int, batch: int, rank: int, world: int, cfg: Any
) -> list[Any]:
    from trainguard.torch import Guard, ShareSampler, TrainState

    sampler = ShareSampler(dataset, batch, world, rank, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator())
    state = TrainState(ddp, opt, sampler=sampler)
    with Guard(None, state, balance=True, run_dir=None) as guard:
        if guard.balancer is not None:  # the simulated GPU's clock, as a GPU's CUDA events
            guard.balancer.device_clock = model.clock
        it = _epochs(loader, sampler)
        for step in guard.range(0, steps):
            xb, yb = next(it)
            loss = F.cross_entropy(ddp(xb), yb) * guard.weight(len(yb))
            loss.backward()
            if guard.step(step, loss) == "proceed":
                opt.step()
            opt.zero_grad()
        return [m.to_dict() for m in guard.balancer.moves] if guard.balancer is not None else []
