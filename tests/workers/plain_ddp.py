"""A plain torchrun DDP script that knows nothing of trainguard: what a user already has.

The shape of the usual tutorial script: an epoch loop over a DataLoader with a
DistributedSampler, its own ``torch.save`` snapshot every few epochs and a resume from it.
CPU/gloo only. It never imports trainguard (a test asserts that).

    torchrun --standalone --nproc-per-node 2 tests/workers/plain_ddp.py --epochs 4 \
        --snapshot snap.pt
    torchrun --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \
        tests/workers/plain_ddp.py --record   # two nodes (pytorch/examples' multinode.py), @record
    trainguard run --standalone --nproc-per-node 2 -- python tests/workers/plain_ddp.py ...
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(
        self, model: torch.nn.Module, data: DataLoader, snapshot: str, save_every: int, sleep: float
    ) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        self.data = data
        self.snapshot = snapshot
        self.save_every = save_every
        self.sleep = sleep
        self.epochs_run = 0
        if os.path.exists(snapshot):
            self._load_snapshot()
        self.ddp = DDP(self.model)

    def _load_snapshot(self) -> None:
        snap = torch.load(self.snapshot, map_location="cpu")
        self.model.load_state_dict(snap["MODEL_STATE"])
        self.epochs_run = snap["EPOCHS_RUN"]
        print(f"[rank {self.rank}] resuming from snapshot at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch: int) -> None:
        tmp = self.snapshot + ".tmp"
        torch.save({"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch}, tmp)
        os.replace(tmp, self.snapshot)
        print(f"[rank {self.rank}] epoch {epoch}: snapshot saved to {self.snapshot}", flush=True)

    def _run_epoch(self, epoch: int) -> float:
        assert isinstance(self.data.sampler, DistributedSampler)
        self.data.sampler.set_epoch(epoch)
        total = 0.0
        for x, y in self.data:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.ddp(x), y)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
            time.sleep(self.sleep)
        return total / max(1, len(self.data))

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            print(
                f"[rank {self.rank}] epoch {epoch} | {len(self.data)} batches | loss {loss:.4f}", flush=True
            )
            if self.rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--save-every", type=int, default=1, help="snapshot every N epochs")
    p.add_argument("--snapshot", default="snapshot.pt")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batch-sleep", type=float, default=0.02, help="seconds per batch (a slower model)")
    p.add_argument("--record", action="store_true", help="main under torch's @record (read at import)")
    args = p.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x = torch.randn(args.samples, 20)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(data))
    trainer = Trainer(torch.nn.Linear(20, 1), loader, args.snapshot, args.save_every, args.batch_sleep)
    trainer.train(args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    # torch's @record, as many scripts carry it: an uncaught exception lands in torchelastic's error file
    (record(main) if "--record" in sys.argv else main)()
