"""A tiny DDP trainer for the supervisor tests (no tests in here): a linear model over gloo with
the real Guard and Checkpointer, so every file the supervisor reads is the real thing.

    trainguard run --standalone --nproc-per-node 2 -- python tests/workers/ddp_worker.py \
        --steps 30 --checkpoint-dir CKPT --checkpoint-every 5 [--step-sleep 0.05] [--bug-at 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> int:
    warm = "torch" in sys.modules  # started in a warm standby (trainguard run --warm-standby)
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--bug-at", type=int, default=-1, help="rank 1 raises the same ValueError at this step")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    from trainguard.torch import Checkpointer, TrainState
    from trainguard.torch.guard import Guard, record

    @record
    def run() -> None:
        t0 = time.time()
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        print(f"rank {rank} warm={warm} timing: start {t0:.3f} pg {time.time():.3f}", flush=True)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        state = TrainState(model=model, optimizer=opt)
        ckpt = Checkpointer(args.checkpoint_dir, keep_last=3, async_save=False)
        start = ckpt.resume(state)
        print(f"rank {rank} resumes at step {start} at {time.time():.3f}", flush=True)
        with Guard(ckpt, state, checkpoint_every=args.checkpoint_every, watchdog=False) as guard:
            for step in guard.range(start, args.steps):
                if step == args.bug_at and rank == 1:
                    raise ValueError(f"bad batch at step {step}")
                g = torch.Generator().manual_seed(step * 7 + rank)
                x = torch.randn(16, 4, generator=g)
                loss = ((model(x) - 1.0) ** 2).mean()
                loss.backward()
                if guard.step(step, loss) == "proceed":
                    opt.step()
                opt.zero_grad()
                time.sleep(args.step_sleep)
        ckpt.close()
        print(f"rank {rank} done, pid {os.getpid()}", flush=True)
        dist.destroy_process_group()

    run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
