"""Replica groups that keep training while a failed one heals (torchft + trainguard).

    trainguard run --replica-groups 2 --standalone --nproc-per-node 1 -- \\
        python examples/train_ft.py --steps 200 --checkpoint-dir /tmp/ft-ckpt

Each replica group is a data-parallel copy of the model; torchft's Manager agrees a quorum
through the Lighthouse every step and averages the gradients across the live groups. When a
group dies or hangs, ``trainguard run`` stops and restarts it while the others keep committing
steps; the restarted group heals by copying the weights from a live peer. Only when every group is
down does the job restart from the durable checkpoint, which one group writes at a time.
The lines a user adds to a plain DDP loop are marked ``# trainguard``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainguard.torch import Checkpointer, Guard, TrainState
from trainguard.torch.ft import DistributedDataParallel, manager, replica_group, should_save


def batch(step: int, group: int, rank: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of one step, a function of (step, group, rank): a healed group sees the data it
    would have seen, and no two groups see the same."""
    g = torch.Generator().manual_seed(step * 1_000_003 + group * 1_009 + rank)
    x = torch.randn(size, 16, generator=g)
    return x, x[:, :4].sum(1, keepdim=True) - x[:, 4:8].prod(1, keepdim=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-dir", default=None, help="durable checkpoints (all groups down)")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (demos, tests)")
    p.add_argument(
        "--all-groups-at-end",
        action="store_true",
        help="train past --steps until every replica group commits a step together (demos, tests: "
        "the groups end with the same weights even when one healed late)",
    )
    p.add_argument("--metrics", default=None, help="group rank 0 appends one JSON line per step ({group})")
    p.add_argument(
        "--pg-timeout-s",
        type=float,
        default=None,
        help="collective timeout of the group's process group (gloo's default: 30 min); without "
        "trainguard run's hang watch, what ends a collective that waits on a hung rank",
    )
    p.add_argument("--out", default=None, help="group rank 0 saves the final weights here ({group}: its id)")
    args = p.parse_args()
    t_main = time.time()

    torch.set_num_threads(1)
    torch.manual_seed(0)  # every group starts from the same weights
    if args.pg_timeout_s:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=args.pg_timeout_s))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = TrainState(model, optimizer)  # trainguard
    mgr = manager(state)  # trainguard: torchft's Manager, healing through the TrainState
    ddp = DistributedDataParallel(mgr, model)  # trainguard: torchft's DDP, failed steps discarded
    ckpt = Checkpointer(args.checkpoint_dir) if args.checkpoint_dir else None  # trainguard
    if ckpt is not None and (start := ckpt.resume(state)):  # trainguard: every group was down
        mgr.load_state_dict({"step": start, "batches_committed": start})  # trainguard
    group, groups = replica_group()
    rank = int(os.environ.get("RANK", "0"))
    metrics = open(args.metrics.format(group=group), "a") if args.metrics and rank == 0 else None  # noqa: SIM115
    if metrics is not None:
        metrics.write(json.dumps({"t": time.time(), "group": group, "event": "start", "main": t_main}) + "\n")

    with Guard(None, state, on_nan="skip", on_spike="warn") as guard:  # trainguard
        loss, together = None, not args.all_groups_at_end
        while (step := mgr.current_step()) < args.steps or not together:
            optimizer.zero_grad(set_to_none=True)
            mgr.start_quorum()  # trainguard: runs while the forward pass does
            x, y = batch(step, group, rank)
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            if guard.step(step, loss) != "proceed":  # trainguard: this group discards the step
                mgr.report_error(RuntimeError(f"Guard: step {step} not applied"))
            committed = mgr.should_commit()  # trainguard: False when any part of the step failed
            together = together or (committed and mgr.num_participants() == groups and step + 1 >= args.steps)
            if committed:
                optimizer.step()
                done = mgr.current_step()
                if ckpt is not None and done % args.checkpoint_every == 0 and should_save(mgr):  # trainguard
                    ckpt.save(done, state)
            if metrics is not None:  # one line per step: committed or discarded, by how many groups
                line = {"t": time.time(), "group": group, "step": step, "ok": committed}
                metrics.write(json.dumps({**line, "groups": mgr.num_participants()}) + "\n")
                metrics.flush()
            if args.step_delay:
                time.sleep(args.step_delay)
    if ckpt is not None:
        ckpt.close()
    if args.out and rank == 0:
        torch.save(model.state_dict(), args.out.format(group=group))
    last = "-" if loss is None else f"{loss.item():.4f}"
    print(f"group {group}: {mgr.current_step()} steps committed, loss {last}", flush=True)
    mgr.shutdown(wait=False)


if __name__ == "__main__":
    main()
