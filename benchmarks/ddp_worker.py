"""The training job of bench_ettr.py and bench_recovery.py: 2-rank DDP over gloo, trainguard's
``Checkpointer``, the same under ``trainguard run`` and under ``torchrun``.

    torchrun --standalone --nproc-per-node 2 benchmarks/ddp_worker.py WORK --every 20 --sleep 0.02

Rank 0 appends ``<unix time> <step> <pid>`` to WORK/progress for every completed step and the
stall of every save to WORK/ckpt_times; each rank writes its pid to WORK/pid<rank> (the benchmark
injects its faults there). Under ``trainguard run`` each step also beats the heartbeat the hang
watchdog reads. It resumes from the newest checkpoint in WORK/ckpt.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from trainguard import rundir
from trainguard.torch import Checkpointer, TrainState


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work", type=Path)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--sleep", type=float, default=0.02, help="seconds per step besides compute")
    p.add_argument("--steps", type=int, default=100_000_000)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--pg-timeout-s", type=float, default=None, help="collective timeout (gloo: 30 min)")
    args = p.parse_args()

    torch.set_num_threads(1)
    timeout = {"timeout": timedelta(seconds=args.pg_timeout_s)} if args.pg_timeout_s else {}
    dist.init_process_group("gloo", **timeout)
    rank = dist.get_rank()
    (args.work / f"pid{rank}").write_text(str(os.getpid()))
    torch.manual_seed(0)
    w = args.width
    net = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(net, torch.nn.Linear(w, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = TrainState(model, opt)
    ckpt = Checkpointer(args.work / "ckpt", keep_last=2)
    start = ckpt.resume(state)
    run_dir = rundir.run_dir_from_env()
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "0"))
    beats = rundir.HeartbeatWriter(run_dir, rank, attempt) if run_dir else None
    last = time.time()
    saved = False  # the stall of a save is known after the next update (which waits for its copy)
    for step in range(start, args.steps):
        loss = model(torch.randn(64, w)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if saved and rank == 0 and ckpt.last_stall_s is not None:
            with open(args.work / "ckpt_times", "a") as f:
                f.write(f"{ckpt.last_stall_s}\n")
        saved = False
        time.sleep(args.sleep)
        now = time.time()
        if beats:
            beats.beat(step, float(loss), now - last)
        last = now
        if rank == 0:
            with open(args.work / "progress", "a") as f:
                f.write(f"{now} {step} {os.getpid()}\n")
        if (step + 1) % args.every == 0:
            if beats:  # as the Guard does: a save may wait (the writer's start, back-pressure)
                beats.beat(step, phase="checkpoint")
            ckpt.save(step + 1, state)
            last, saved = time.time(), True
    ckpt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
