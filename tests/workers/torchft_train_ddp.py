"""torchft's own DDP example (pytorch/torchft ``train_ddp.py``) in its shape, with CPU edits only:
what a torchft user brings to ``trainguard run --replica-groups``. It never imports trainguard.

Kept as torchft writes it: the replica group from ``REPLICA_GROUP_ID`` / ``NUM_REPLICA_GROUPS``,
no ``init_process_group`` (the Manager joins the store at ``MASTER_ADDR:MASTER_PORT``), torchft's
``Manager`` with the script's own ``load_state_dict`` / ``state_dict`` closures, its
``ProcessGroupGloo`` on CPU, its ``PGTransport`` for heals, torchft's ``DistributedSampler``,
``DistributedDataParallel`` and ``Optimizer`` wrapper (``zero_grad`` starts the quorum, ``step``
commits), ``@record``, and the loop that ends at a step count.

The edits (docs/no-restart.md lists them): a synthetic dataset and torch's ``DataLoader`` with no
loader processes (no torchvision download, no torchdata), no 1 GB padding layer and no profiler
(CPU, a small machine), the step count and an optional per-step sleep as arguments, the sampler's
``replica_rank`` keyword (torchft 0.2.0's name), the weights saved at the end, and the end of the
loop: past ``--steps`` it trains on until every group commits a step together, so a group that
was killed has healed from a live one before the job ends (a test's harness, as
examples/train_ft.py's ``--all-groups-at-end``).

    trainguard run --replica-groups 2 --nproc-per-node 1 -- \\
        python tests/workers/torchft_train_ddp.py --steps 60 --out w{group}.pt
"""

import argparse
import os
import sys
import time
from datetime import timedelta

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
os.environ["CUDA_VISIBLE_DEVICES"] = str(REPLICA_GROUP_ID % 4)
os.environ["NCCL_HOSTID"] = str(REPLICA_GROUP_ID)

import torch  # noqa: E402
from torch import nn, optim  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torchft import (  # noqa: E402
    DistributedDataParallel,
    DistributedSampler,
    Manager,
    Optimizer,
    ProcessGroupGloo,
    ProcessGroupNCCL,
)
from torchft.checkpointing.pg_transport import PGTransport  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(3, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.cnn(x), 1))


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--out", default=None, help="the weights at the end ({group}: the group's id)")
    args = p.parse_args()
    group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", 2))

    data = torch.Generator().manual_seed(0)
    images = torch.randn(2048, 3, 32, 32, generator=data)
    trainset = TensorDataset(images, torch.randint(0, 10, (2048,), generator=data))
    sampler = DistributedSampler(
        trainset, replica_rank=group, num_replica_groups=groups, group_rank=0, num_replicas=1, shuffle=True
    )
    trainloader = DataLoader(trainset, batch_size=64, num_workers=0, sampler=sampler)

    def load_state_dict(state_dict):  # type: ignore[no-untyped-def]
        m.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optim"])

    def state_dict():  # type: ignore[no-untyped-def]
        return {"model": m.state_dict(), "optim": optimizer.state_dict()}

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pg = (
        ProcessGroupNCCL(timeout=timedelta(seconds=30))
        if torch.cuda.is_available()
        else ProcessGroupGloo(timeout=timedelta(seconds=5))
    )
    transport = PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device(device))
    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{group}",
        timeout=timedelta(seconds=30),
        checkpoint_transport=transport,
    )

    torch.manual_seed(0)
    m = Net().to(device)
    m = DistributedDataParallel(manager, m)
    optimizer = Optimizer(manager, optim.AdamW(m.parameters()))
    criterion = nn.CrossEntropyLoss()
    print(f"Total number of parameters: {sum(p.numel() for p in m.parameters())}", flush=True)

    while True:
        for inputs, labels in trainloader:
            inputs, labels = inputs.to(device), labels.to(device)
            before = manager.current_step()
            optimizer.zero_grad()
            loss = criterion(m(inputs), labels)
            loss.backward()
            optimizer.step()  # commits the step, or discards it when a group failed in it
            step = manager.current_step()
            if step % 20 == 0:
                print(f"[{step}] loss = {loss.item()}", flush=True)
            time.sleep(args.step_delay)
            if step >= args.steps and step > before and manager.num_participants() == groups:
                if args.out:  # every group commits this step together, so all of them end here
                    torch.save(m.module.state_dict(), args.out.format(group=group))
                sys.exit(0)


if __name__ == "__main__":
    main()
