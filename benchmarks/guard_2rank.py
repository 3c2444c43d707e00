"""The Guard's overhead with 2 ranks over gloo (used by bench_guard_overhead.py): the packing and
all-reduce of the multi-rank check (every 8 steps, read a step late), on a DDP step.

Each rank alternates blocks of bare DDP steps and guarded DDP steps (A B, then B A); rank 0
reports the per-round ratios of its training thread's CPU time and of wall time, and the CPU
time the Guard's watchdog thread used.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def thread_cpu_s(name: str) -> float | None:
    """CPU seconds (user + system) of this process's thread called ``name``."""
    thread = next((t for t in threading.enumerate() if t.name == name), None)
    if thread is None or thread.native_id is None:
        return None
    try:
        fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rank(rank: int, port: int, rounds: int, block: int, batch: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    from guard_loop import bare_steps, guarded_steps
    from trainguard.demo.train_digits import DigitsCNN
    from trainguard.torch.guard import Guard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(DigitsCNN())
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    data = [(torch.rand(batch, 1, 8, 8), torch.randint(0, 10, (batch,))) for _ in range(16)]

    inside = [0.0]  # thread CPU time inside the Guard's calls (the clock reads, in the bare loop)

    def bare(n: int) -> tuple[float, float]:
        return bare_steps(model, opt, data, n, inside)

    def guarded(guard: Guard, n: int) -> tuple[float, float]:
        return guarded_steps(guard, model, opt, data, n, inside)

    cpu, wall = [], []
    bare_cpu = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-guard-2rank-") as tmp:
        run_dir = Path(tmp)
        (run_dir / "chaos.json").write_text(json.dumps({"faults": []}))
        with Guard(None, None, run_dir=run_dir, on_spike="warn") as guard:  # type: ignore[arg-type]
            bare(block)
            guarded(guard, block)  # warm-up; the Guard picks its multi-rank check mode here
            started, dog0 = time.perf_counter(), thread_cpu_s("trainguard-watchdog")
            inside[0] = 0.0
            for r in range(rounds):
                if r % 2 == 0:
                    before = inside[0]
                    b, clocks = bare(block), inside[0] - before
                    g = guarded(guard, block)
                else:
                    g = guarded(guard, block)
                    before = inside[0]
                    b, clocks = bare(block), inside[0] - before
                inside[0] -= 2 * clocks  # what reading the clocks costs, once in each loop
                cpu.append((g[0] - b[0]) / b[0])
                bare_cpu += b[0]
                wall.append((g[1] - b[1]) / b[1])
            dog1, elapsed = thread_cpu_s("trainguard-watchdog"), time.perf_counter() - started
            mode = (guard.check_every, guard.check_lag)
    dist.destroy_process_group()
    if rank == 0:
        dog = None if dog0 is None or dog1 is None else dog1 - dog0
        out.put(
            {
                "cpu": cpu,
                "wall": wall,
                "direct": inside[0] / bare_cpu,
                "bare_step_ms": bare_cpu / (rounds * block) * 1e3,
                "guard_step_us": inside[0] / (rounds * block) * 1e6,
                "watchdog_cpu_s": dog,
                "elapsed_s": elapsed,
                "mode": mode,
            }
        )


def run(rounds: int, block: int, batch: int) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, port, rounds, block, batch, out), daemon=True) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    try:
        result: dict[str, Any] = out.get(timeout=600)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    return result
