"""A plain torchrun DDP script for bench_node_loss.py: gloo, a small model, its own snapshot
(model, optimizer, step: torch.save every --save-every steps) it resumes from. It never imports
trainguard.

    torchrun --nnodes 2:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \
        benchmarks/node_loss_ddp.py WORK_DIR

Rank 0 writes ``<time> <step> <pid>`` to WORK_DIR/progress for each step it completed; every
rank writes ``<pid> <rank> <phase> <time> <world size>`` to WORK_DIR/phases at its start (before
importing torch), once its process group is up, once its snapshot is loaded and at its first
step: where a recovery's seconds go.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: a warm standby has them done already

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.05)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world, pid = dist.get_rank(), dist.get_world_size(), os.getpid()

    def phase(name: str, when: float) -> None:
        with open(os.path.join(args.work, "phases"), "a") as f:
            f.write(f"{pid} {rank} {name} {when} {world}\n")

    phase("start", STARTED)
    phase("pg", time.time())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    snapshot = os.path.join(args.work, "snapshot.pt")
    start = 0
    if os.path.exists(snapshot):
        snap = torch.load(snapshot, map_location="cpu")
        model.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optimizer"])
        start = snap["step"]
    phase("loaded", time.time())
    ddp = DDP(model)
    x = torch.randn(64, 256)
    for step in range(start, args.steps):
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        time.sleep(args.step_sleep)
        now = time.time()
        if step == start:
            phase("first_step", now)
        if rank == 0:
            with open(os.path.join(args.work, "progress"), "a") as f:
                f.write(f"{now} {step} {pid}\n")
            if (step + 1) % args.save_every == 0:
                tmp = snapshot + ".tmp"
                torch.save(
                    {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, tmp
                )
                os.replace(tmp, snapshot)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
