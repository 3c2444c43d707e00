"""A training script that fails the same way before its first step on every try: its config
lacks a key. With ``--record`` its ``main`` carries torch's ``@record``, so torchelastic's error
file holds the traceback (what torch's docs tell users to add); without it, only stderr does.

It never imports trainguard.

    trainguard run --standalone --nproc-per-node 2 tests/workers/startup_config_error.py [--record]
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def load_config() -> dict[str, float]:
    return {"batch_size": 32.0}  # no "lr": the user's bug


def main() -> None:
    dist.init_process_group("gloo")
    config = load_config()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    (record(main) if "--record" in sys.argv else main)()
