"""A plain torchrun script for bench_startup.py: a gloo process group, a small DDP model, a few
training steps; each rank writes when its first step (forward, backward with DDP's all-reduce,
optimizer step) completed. It never imports trainguard.

    torchrun --standalone --nproc-per-node 2 benchmarks/plain_ddp.py OUT_DIR
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for step in range(5):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if step == 0:
            with open(os.path.join(out, f"first_step.{rank}"), "w") as f:
                f.write(f"{time.time()}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
