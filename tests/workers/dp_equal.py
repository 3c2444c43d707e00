"""One data-parallel rank for tests/test_replicas_dp.py: a small model on a fixed global batch, split
into one shard per rank, the same in every mode, so runs of different shapes can be compared step
by step. Each rank saves its loss and its weights after every committed step.

    torchrun --standalone --nproc-per-node 4 dp_equal.py --mode ddp --out DIR        # plain DDP
    trainguard run --replica-groups 2 --nproc-per-node 2 -- \\
        python dp_equal.py --mode ft --out DIR                                        # trainguard's
    ... python dp_equal.py --mode torchft --out DIR          # torchft alone (no trainguard import)

The shard of a rank is its rank in the job: ``RANK`` under plain DDP, ``group * K + RANK`` in
replica groups of K ranks. Only ``--mode ft`` imports trainguard.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def shard_batch(step: int, shard: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 7919 + shard)
    x = torch.randn(size, 8, generator=g)
    return x, x[:, :2].sum(1, keepdim=True) - x[:, 2:4].prod(1, keepdim=True)


class Sgd:
    """A model, its optimizer and their state for torchft's Manager (heals through it)."""

    def __init__(self) -> None:
        torch.manual_seed(0)  # every rank starts from the same weights
        self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])


def done(args: argparse.Namespace, step: int, k: int) -> bool:
    """Past the last step: --steps, or with --stop-file the step the file names once it exists.
    The group's ranks agree (one may read the file a step before the other), so they stop at the
    same step."""
    if not args.stop_file:
        return step >= args.steps
    try:
        with open(args.stop_file) as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = None
    flag = torch.tensor([float(last is not None and step >= last)])
    if k > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def progress(out: str, shard: int, step: int) -> None:
    """The shard's last committed step, for a test to watch (written whole: temp file, rename)."""
    path = os.path.join(out, f"progress{shard}")
    with open(path + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(path + ".tmp", path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "ft", "torchft"], required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out", required=True)
    p.add_argument("--init-sync", action="store_true", help="--mode ft: torchft heals at step 0")
    p.add_argument("--min-replicas", type=int, default=2, help="--mode ft: groups a step needs")
    p.add_argument(
        "--stop-file",
        default="",
        help="--mode ft: train until this file exists and names a step reached (not --steps)",
    )
    p.add_argument("--step-sleep", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank, k = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    sgd = Sgd()
    if args.mode == "ddp":
        dist.init_process_group("gloo")
        shard, model, mgr = rank, nn.parallel.DistributedDataParallel(sgd.model), None
    elif args.mode == "ft":
        from trainguard.torch.ft import DistributedDataParallel, manager, replica_group

        group, _ = replica_group()
        shard = group * k + rank
        # Every step has both groups (none trains alone), and without --init-sync none heals at step
        # 0: the groups start from the same seed (a group that heals in a step leaves its batch out
        # of it, as torchft does).
        mgr = manager(sgd, min_replica_size=args.min_replicas, init_sync=args.init_sync)
        model = DistributedDataParallel(mgr, sgd.model)
    else:
        from torchft import Manager, ProcessGroupGloo
        from torchft.ddp import DistributedDataParallel as FtDDP

        group = int(os.environ["REPLICA_GROUP_ID"])
        shard = group * k + rank
        mgr = Manager(
            pg=ProcessGroupGloo(timedelta(seconds=30)),
            load_state_dict=sgd.load_state_dict,
            state_dict=sgd.state_dict,
            min_replica_size=2,
            replica_id=f"g{group}",
        )
        model = FtDDP(mgr, sgd.model)
    record: dict[str, list[Any]] = {"steps": [], "losses": [], "weights": [], "healed": []}
    step = 0
    while not done(args, step, k):
        sgd.opt.zero_grad()
        if mgr is not None:
            mgr.start_quorum()
        x, y = shard_batch(step, shard)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        healed = mgr is not None and not mgr.is_participating()  # this step loads a peer's state
        if mgr is None or mgr.should_commit():
            sgd.opt.step()
            # a rank that healed in this step committed the peer's step, not its own count
            done_step = step if mgr is None else mgr.current_step() - 1
            record["steps"].append(done_step)
            record["losses"].append(loss.item())
            record["healed"].append(healed)
            record["weights"].append({n: t.clone() for n, t in sgd.model.state_dict().items()})
            progress(args.out, shard, done_step)
        step = step + 1 if mgr is None else mgr.current_step()
        time.sleep(args.step_sleep)
    torch.save(record, os.path.join(args.out, f"shard{shard}.pt"))
    if mgr is not None:
        mgr.shutdown(wait=False)
    else:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
