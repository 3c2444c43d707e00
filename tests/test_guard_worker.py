"""A tiny guarded training process that the Guard's subprocess tests start (no tests in here).

    python tests/test_guard_worker.py --run-dir RUN --steps 50 [--hang-at 10] [--raise-at 5] ...

With ``--ckpt-dir`` it checkpoints through a minimal file checkpointer with the Checkpointer's
save/resume/wait API (the Guard only needs those three).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


class FileCheckpointer:
    """save(step, state) / resume(state) -> step / wait(): one torch.save file per step."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, state: Any) -> None:
        import torch

        blob = {"step": step, "model": state.model.state_dict(), "optimizer": state.optimizer.state_dict()}
        tmp = self.directory / f".step{step}.tmp"
        torch.save(blob, tmp)
        tmp.replace(self.directory / f"step{step:08d}.pt")

    def wait(self) -> None:
        pass

    def resume(self, state: Any) -> int:
        import torch

        files = sorted(self.directory.glob("step*.pt"))
        if not files:
            return 0
        blob = torch.load(files[-1])
        state.model.load_state_dict(blob["model"])
        state.optimizer.load_state_dict(blob["optimizer"])
        return int(blob["step"])


class State:
    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--ckpt-dir", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--hang-floor", type=float, default=120.0)
    p.add_argument("--hang-factor", type=float, default=10.0)
    p.add_argument("--preempt-wait", type=float, default=None)
    p.add_argument("--on-nan", default="rollback")
    p.add_argument("--record-outside", action="store_true", help="raise after the with block")
    args = p.parse_args()

    import torch

    from trainguard.torch.guard import Guard, record

    @record
    def run() -> None:
        torch.manual_seed(0)
        model: Any = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        state = State(model, opt)
        if "LOCAL_RANK" in os.environ:  # under torchrun: DDP over gloo
            torch.distributed.init_process_group("gloo")
            model = torch.nn.parallel.DistributedDataParallel(model)
        ckpt_dir = args.ckpt_dir
        if ckpt_dir is not None and "LOCAL_RANK" in os.environ:  # replicated state: one copy per rank
            ckpt_dir = ckpt_dir / f"rank{os.environ['RANK']}"
        ckpt = FileCheckpointer(ckpt_dir) if ckpt_dir else None
        start = ckpt.resume(state) if ckpt else 0
        steps_run: list[int] = []
        with Guard(
            ckpt,
            state,
            run_dir=args.run_dir,
            on_nan=args.on_nan,
            checkpoint_every=args.checkpoint_every,
            hang_floor_s=args.hang_floor,
            hang_factor=args.hang_factor,
            **({"preempt_wait_s": args.preempt_wait} if args.preempt_wait is not None else {}),
            first_step_s=max(args.hang_floor, 30.0),  # startup on a loaded machine is slow
        ) as guard:
            for step in guard.range(start, args.steps):
                steps_run.append(step)
                if step == args.hang_at:
                    time.sleep(600)  # stuck, like a rank waiting in a collective forever
                if step == args.raise_at:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")
                x = torch.randn(16, 4)
                loss = ((model(x) - 1.0) ** 2).mean()
                loss.backward()
                if guard.step(step, loss) == "proceed":
                    opt.step()
                opt.zero_grad()
                if args.step_sleep:
                    time.sleep(args.step_sleep)
        if os.environ.get("RANK", "0") == "0":  # ranks share torchrun's stdout: lines could interleave
            print(json.dumps({"start": start, "steps_run": steps_run}), flush=True)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        if args.record_outside:
            raise ValueError("after the block")

    run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
