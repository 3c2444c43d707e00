"""Data-parallel SGD with mpi4py and numpy: a plain MPI training script (it never imports trainguard).

    mpirun -np 2 python examples/mpi/train_mpi.py --steps 200 --checkpoint-dir ckpt
    trainguard run --launcher mpirun -np 2 -- python examples/mpi/train_mpi.py --checkpoint-dir ckpt

Each rank takes its shard of a synthetic linear-regression set, computes its gradient, and the
ranks average gradients with ``MPI.Allreduce`` every step, as Horovod and DDP do. Rank 0 saves
``step-<N>.npz`` every ``--checkpoint-every`` steps (a temporary file, fsync, rename) and a start
resumes from the newest one that loads, so a restarted job (with the same or fewer ranks) goes on
where it was. It prints ``done step=<N> loss=<L>`` on rank 0 at the end.

``--progress FILE``: rank 0 appends ``time step pid`` per step (benchmarks read it).
``--heartbeats``: one line per step in trainguard's documented run-directory protocol
(``$TRAINGUARD_RUN_DIR/heartbeat/rank<R>.jsonl``) when that variable is set; the script still
imports nothing of trainguard.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

FEATURES, ROWS = 32, 4096


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, FEATURES))
    y = x @ rng.standard_normal(FEATURES) + 0.01 * rng.standard_normal(ROWS)
    return x, y


def newest_checkpoint(directory: Path) -> tuple[int, np.ndarray] | None:
    """The newest step-<N>.npz that loads whole; an unreadable one is skipped."""
    found = sorted(
        (int(p.stem.split("-")[1]), p) for p in directory.glob("step-*.npz") if p.stem.split("-")[1].isdigit()
    )
    for step, path in reversed(found):
        try:
            with np.load(path) as z:
                return step, z["w"].copy()
        except (OSError, ValueError, KeyError):
            print(f"skipping unreadable checkpoint {path}", flush=True)
    return None


def save(directory: Path, step: int, w: np.ndarray) -> None:
    tmp = directory / f".tmp-step-{step}.npz"
    with open(tmp, "wb") as f:
        np.savez(f, w=w)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / f"step-{step}.npz")


class Heartbeats:
    """trainguard's heartbeat lines, written by hand from its documented format (no import)."""

    def __init__(self, rank: int) -> None:
        run_dir = os.environ.get("TRAINGUARD_RUN_DIR")
        self.rank, self.file = rank, None
        if run_dir:
            (Path(run_dir) / "heartbeat").mkdir(parents=True, exist_ok=True)
            self.file = open(Path(run_dir) / "heartbeat" / f"rank{rank}.jsonl", "a")  # noqa: SIM115
        self.attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "0"))

    def beat(self, step: int, loss: float, step_time: float | None, phase: str = "train") -> None:
        if self.file is None:
            return
        line = {"rank": self.rank, "step": step, "time": time.time(), "loss": loss, "step_time": step_time,
                "pid": os.getpid(), "attempt": self.attempt, "phase": phase}  # fmt: skip
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-dir", type=Path, default=None)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds of simulated compute per step")
    p.add_argument("--heartbeats", action="store_true", help="write trainguard's heartbeat lines")
    p.add_argument("--progress", type=Path, default=None, help="rank 0 appends 'time step pid' per step")
    args = p.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    x, y = data()
    shard = slice(rank * ROWS // size, (rank + 1) * ROWS // size)
    x, y = x[shard], y[shard]

    w, start = np.zeros(FEATURES), 0
    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        found = newest_checkpoint(args.checkpoint_dir) if rank == 0 else None
        found = comm.bcast(found, root=0)
        if found is not None:
            start, w = found
    if rank == 0:
        print(f"rank 0 of {size}: starting at step {start}", flush=True)
    beats = Heartbeats(rank)
    progress = open(args.progress, "a") if args.progress is not None and rank == 0 else None  # noqa: SIM115
    loss, last = float("nan"), None
    for step in range(start + 1, args.steps + 1):
        t0 = time.monotonic()
        err = x @ w - y
        grad = np.empty_like(w)
        comm.Allreduce(x.T @ err / ROWS, grad, op=MPI.SUM)
        w -= args.lr * grad * 2
        loss = comm.allreduce(float(err @ err) / ROWS, op=MPI.SUM)
        if args.step_time:
            time.sleep(args.step_time)
        if args.checkpoint_dir is not None and step % args.checkpoint_every == 0 and rank == 0:
            save(args.checkpoint_dir, step, w)
        last = time.monotonic() - t0
        if args.heartbeats:
            beats.beat(step, loss, last)
        if progress is not None:
            progress.write(f"{time.time():.3f} {step} {os.getpid()}\n")
            progress.flush()
    if args.heartbeats:
        beats.beat(args.steps, loss, last, phase="exit")
    if rank == 0:
        print(f"done step={args.steps} loss={loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
