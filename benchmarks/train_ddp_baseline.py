"""examples/train_ft.py without torchft: the same model, batches, optimizer and Guard, with torch's
own DistributedDataParallel over the job's gloo process group (the plain DDP job a user runs
today). bench_no_restart.py times its steps against ``--replica-groups 2`` for ``step_cost_vs_ddp``.

    trainguard run --standalone --nproc-per-node 2 -- python benchmarks/train_ddp_baseline.py \\
        --steps 400 --metrics /tmp/m{group}.jsonl

Writes the same metrics lines as train_ft.py (group 0, every step committed, 1 group).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainguard.torch import Guard, TrainState

_spec = importlib.util.spec_from_file_location(
    "train_ft", Path(__file__).resolve().parent.parent / "examples" / "train_ft.py"
)
assert _spec is not None and _spec.loader is not None
_train_ft = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_train_ft)
batch = _train_ft.batch  # the very batches train_ft.py trains on


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--metrics", default=None, help="rank 0 appends one JSON line per step ({group}: 0)")
    args = p.parse_args()
    t_main = time.time()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = TrainState(model, optimizer)
    ddp = DistributedDataParallel(model)
    metrics = open(args.metrics.format(group=0), "a") if args.metrics and rank == 0 else None  # noqa: SIM115
    if metrics is not None:
        metrics.write(json.dumps({"t": time.time(), "group": 0, "event": "start", "main": t_main}) + "\n")
    with Guard(None, state, on_nan="skip", on_spike="warn") as guard:
        for step in range(args.steps):
            optimizer.zero_grad(set_to_none=True)
            x, y = batch(step, 0, rank)
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            if guard.step(step, loss) == "proceed":
                optimizer.step()
            if metrics is not None:
                metrics.write(
                    json.dumps({"t": time.time(), "group": 0, "step": step, "ok": True, "groups": 1}) + "\n"
                )
                metrics.flush()
            if args.step_delay:
                time.sleep(args.step_delay)
    print(f"rank {rank}: {args.steps} steps, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
