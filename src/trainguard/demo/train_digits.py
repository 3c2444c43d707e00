"""Fault-tolerant DDP training of a small CNN on scikit-learn's bundled digits (8x8 images, no download).

    torchrun --nproc-per-node 2 examples/train_digits.py --steps 300 --checkpoint-dir /tmp/digits-ckpt

CPU/gloo here; on GPUs the same command uses CUDA/NCCL (one GPU per LOCAL_RANK). Kill it at any
moment and start it again with the same ``--checkpoint-dir``: it resumes from the newest valid
checkpoint and finishes. Under ``trainguard run`` (``$TRAINGUARD_RUN_DIR`` set) the Guard also
writes heartbeats, error files and findings, and applies chaos drills. The trainguard lines are
marked ``# trainguard``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from typing import TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainguard.torch import Checkpointer, Guard, ResumableSampler, ShareSampler, TrainState


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def digits(test_fraction: float = 0.2) -> tuple[TensorDataset, TensorDataset]:
    """The 1797 digits, scaled to [0, 1], split 80/20 with a fixed seed (same on every rank)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def batches(loader: DataLoader, sampler: ResumableSampler | ShareSampler) -> Iterator[list[torch.Tensor]]:
    """Endless batches from the sampler's current position (it moves to the next epoch itself)."""
    while True:
        sampler.set_epoch(sampler.epoch)
        yield from loader


def open_metrics(path: str) -> TextIO:
    """Append to the metrics of earlier attempts (after a kill, the last line may be torn)."""
    f = open(path, "a+")  # noqa: SIM115 (closed at the end of main)
    if f.tell() > 0:
        f.seek(f.tell() - 1)
        if f.read(1) != "\n":
            f.write("\n")
    return f


def setup() -> tuple[torch.device, int, int]:
    if "LOCAL_RANK" not in os.environ:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu"), 0, 1
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        device = torch.device("cuda", local_rank)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    return device, dist.get_rank(), dist.get_world_size()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--checkpoint-dir", default=None, help="resume from / save to here")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--metrics", default=None, help="rank 0 appends one JSON line per step")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (demos)")
    p.add_argument(
        "--balance", action="store_true", help="split each global batch by measured speed (uneven GPUs)"
    )
    p.add_argument(
        "--deterministic", action="store_true", help="bitwise-reproducible kernels (exact-resume checks)"
    )
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if args.deterministic:  # cuBLAS reads its workspace setting when CUDA starts, below
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    device, rank, world = setup()
    train_set, test_set = digits()
    model: nn.Module = DigitsCNN().to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler: ResumableSampler | ShareSampler
    if args.balance:  # trainguard: each rank's share of the global batch follows its speed
        sampler = ShareSampler(train_set, global_batch=args.batch_size * world, seed=args.seed)
        loader = DataLoader(train_set, batch_sampler=sampler, generator=torch.Generator())
    else:
        sampler = ResumableSampler(train_set, shuffle=True, seed=args.seed)  # trainguard
        loader = DataLoader(
            train_set, batch_size=args.batch_size, sampler=sampler, generator=torch.Generator()
        )
    state = TrainState(model, optimizer, sampler=sampler)  # trainguard
    ckpt = Checkpointer(args.checkpoint_dir) if args.checkpoint_dir else None  # trainguard
    start = ckpt.resume(state) if ckpt else 0  # trainguard
    if rank == 0 and start:
        print(f"resumed from step {start}", flush=True)
    metrics = open_metrics(args.metrics) if args.metrics and rank == 0 else None

    with Guard(
        ckpt, state, checkpoint_every=args.checkpoint_every, balance=args.balance
    ) as guard:  # trainguard
        data = batches(loader, sampler)
        for step in guard.range(start, args.steps):  # trainguard
            if guard.restored:  # trainguard: rolled back, the sampler position was restored
                data = batches(loader, sampler)
            x, y = (t.to(device) for t in next(data))
            # trainguard: chaos "nan" hook; the weight (1.0 unless balancing) keeps uneven shares the same update
            weight = guard.weight(len(y))
            loss = guard.loss(F.cross_entropy(model(x), y) * weight)
            loss.backward()
            if guard.step(step, loss) == "proceed":  # trainguard
                optimizer.step()
                if metrics:  # this step's loss: one device sync per step, only when asked for
                    metrics.write(json.dumps({"step": step, "loss": loss.item() / weight}) + "\n")
                    metrics.flush()
            optimizer.zero_grad(set_to_none=True)
            if args.step_delay:
                time.sleep(args.step_delay)
    if ckpt:
        ckpt.close()
    if metrics:
        metrics.close()

    model.eval()
    with torch.no_grad():
        x, y = (t.to(device) for t in test_set.tensors)
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    if rank == 0:
        print(
            f"test accuracy: {accuracy:.4f} ({len(y)} images, {args.steps} steps, {world} ranks)", flush=True
        )
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
