"""The plain DDP job of bench_no_restart.py's torchrun and restart arms: examples/train_ft.py's
model, optimizer and batches with torch's own DistributedDataParallel over a gloo process group,
its own torch.save snapshot every --save-every steps it resumes from. It never imports trainguard.

    torchrun --standalone --nproc-per-node 2 benchmarks/nr_ddp.py --steps 300 --work DIR

Rank r trains on train_ft.py's batch of replica group r (``batch(step, r, 0)``), so 2 ranks here
see the global batch of ``--replica-groups 2`` with one rank per group. Rank 0 appends one JSON
line per completed step to DIR/m0.jsonl (``t``, ``step``, ``pid``); every rank writes its pid to
DIR/pid<rank> at its start (where the bench sends a fault).
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def batch(step: int, group: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """examples/train_ft.py's batch, copied (importing that file imports trainguard):
    tests/test_bench_no_restart.py checks the two agree."""
    g = torch.Generator().manual_seed(step * 1_000_003 + group * 1_009 + rank)
    x = torch.randn(size, 16, generator=g)
    return x, x[:, :4].sum(1, keepdim=True) - x[:, 4:8].prod(1, keepdim=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--work", required=True, help="metrics, pid files and the snapshot")
    p.add_argument("--save-every", type=int, default=50, help="as train_ft.py's --checkpoint-every")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="gloo's collective timeout")
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout_s))
    rank, pid = dist.get_rank(), os.getpid()
    with open(os.path.join(args.work, f"pid{rank}"), "w") as f:
        f.write(f"{pid}\n")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    snapshot = os.path.join(args.work, "snapshot.pt")
    start = 0
    if os.path.exists(snapshot):
        snap = torch.load(snapshot, map_location="cpu")
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        start = snap["step"]
    ddp = DistributedDataParallel(model)
    metrics = open(os.path.join(args.work, "m0.jsonl"), "a") if rank == 0 else None  # noqa: SIM115
    if metrics is not None:
        metrics.write(json.dumps({"t": time.time(), "event": "start", "main": STARTED, "pid": pid}) + "\n")
    for step in range(start, args.steps):
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(step, rank, 0)
        F.mse_loss(ddp(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if metrics is not None:
            metrics.write(json.dumps({"t": time.time(), "step": step, "pid": pid}) + "\n")
            metrics.flush()
            if (step + 1) % args.save_every == 0:
                tmp = snapshot + ".tmp"
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
                torch.save(state, tmp)
                os.replace(tmp, snapshot)
        if args.step_delay:
            time.sleep(args.step_delay)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
