"""One replica group of one rank for tests/test_ft_ddp.py: torchft's Manager and a DDP wrapper
(trainguard's, or torchft's own with --upstream), and a peer that dies or stops mid-all-reduce,
or stops in the quorum it just joined (``--fault stop-in-quorum``: before its process group's
rendezvous with the healthy peer).

    REPLICA_GROUP_ID=1 TORCHFT_LIGHTHOUSE=http://127.0.0.1:PORT MASTER_ADDR=127.0.0.1 MASTER_PORT=P \\
        RANK=0 WORLD_SIZE=1 python ft_worker.py --steps 300 --fault kill --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.torch import TrainState
from trainguard.torch.ft import DistributedDataParallel, manager


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fault", choices=["none", "kill", "stop", "stop-in-quorum"], default="none")
    p.add_argument("--fault-after", type=int, default=5, help="all-reduces made beside a peer first")
    p.add_argument("--alone-steps", type=int, default=10, help="after a peer is lost: steps, then stop")
    p.add_argument("--upstream", action="store_true", help="torchft's own DistributedDataParallel")
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--out", required=True)
    p.add_argument("--progress", help="write the steps committed so far here, each step")
    p.add_argument(
        "--reconfigure-delay",
        type=float,
        default=0.0,
        help="reach a quorum with a peer this late (a loaded host)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mgr = manager(TrainState(model, opt))
    if args.upstream:
        from torchft.ddp import DistributedDataParallel as Upstream

        ddp: Any = Upstream(mgr, model)
    else:
        ddp = DistributedDataParallel(mgr, model)
    configure = mgr._pg.configure

    def reconfigure(*a: Any, **k: Any) -> None:
        if a[3] > 1:  # a quorum with the peer: reach it late, or stop before meeting it there
            time.sleep(args.reconfigure_delay)
            if args.fault == "stop-in-quorum":
                os.kill(os.getpid(), signal.SIGSTOP)
        configure(*a, **k)

    mgr._pg.configure = reconfigure  # type: ignore[method-assign]
    if args.fault in ("kill", "stop"):
        reduce = mgr.allreduce
        beside = [0]

        def allreduce(tensor: torch.Tensor, *a: Any, **k: Any) -> Any:
            mgr.wait_quorum()
            beside[0] += mgr.num_participants() > 1
            if beside[0] > args.fault_after:  # this peer vanishes mid-all-reduce
                os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
            return reduce(tensor, *a, **k)

        mgr.allreduce = allreduce  # type: ignore[method-assign]
    discarded, peers, alone_since = 0, 0, None
    while mgr.current_step() < args.steps:
        if alone_since is not None and mgr.current_step() >= alone_since + args.alone_steps:
            break
        opt.zero_grad()
        mgr.start_quorum()
        g = torch.Generator().manual_seed(mgr.current_step())
        x = torch.randn(16, 8, generator=g)
        F.mse_loss(ddp(x), x.sum(1, keepdim=True)).backward()
        if mgr.should_commit():
            opt.step()
        else:
            discarded += 1
        peers = max(peers, mgr.num_participants())
        if args.progress:
            with open(args.progress + ".tmp", "w") as f:
                f.write(str(mgr.current_step()))
            os.replace(args.progress + ".tmp", args.progress)
        if (peers > 1 or discarded) and mgr.num_participants() == 1 and alone_since is None:
            alone_since = mgr.current_step()  # the peer is gone: a few steps alone, then done
        time.sleep(args.step_delay)
    with open(args.out, "w") as f:
        json.dump({"committed": mgr.current_step(), "discarded": discarded, "peers": peers}, f)
    mgr.shutdown(wait=False)


if __name__ == "__main__":
    main()
