"""The timed training loops of the Guard benchmarks (bench_guard_overhead.py, guard_2rank.py).

Both loops read the thread's CPU clock at the same places, so the clock reads (each a system
call, right after backward) cost the bare loop what they cost the guarded one. ``inside[0]``
adds up the CPU time spent inside the Guard's calls (around nothing in the bare loop).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F


def bare_steps(model: Any, opt: Any, data: list[Any], n: int, inside: list[float]) -> tuple[float, float]:
    """``n`` training steps; (thread CPU seconds, wall seconds)."""
    t0, w0 = time.thread_time(), time.perf_counter()
    for i in range(n):
        x, y = data[i % len(data)]
        F.cross_entropy(model(x), y).backward()
        g0 = time.thread_time()
        inside[0] += time.thread_time() - g0
        opt.step()
        opt.zero_grad(set_to_none=True)
        g1 = time.thread_time()
        inside[0] += time.thread_time() - g1
    settle(data)
    return time.thread_time() - t0, time.perf_counter() - w0


def guarded_steps(
    guard: Any, model: Any, opt: Any, data: list[Any], n: int, inside: list[float], grads: bool = False
) -> tuple[float, float]:
    """The same steps in the documented loop: ``guard.step`` after backward (``check_grads``
    first when ``grads``), ``guard.end_step`` (what ``guard.range`` runs) after the update."""
    step = guard.last_step + 1 if guard.last_step is not None else 0
    t0, w0 = time.thread_time(), time.perf_counter()
    for i in range(n):
        x, y = data[i % len(data)]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        g0 = time.thread_time()
        if grads:
            guard.check_grads(model)
        action = guard.step(step, loss)
        inside[0] += time.thread_time() - g0
        if action == "proceed":
            opt.step()
        opt.zero_grad(set_to_none=True)
        g1 = time.thread_time()
        step = guard.end_step(step)
        inside[0] += time.thread_time() - g1
    settle(data)
    return time.thread_time() - t0, time.perf_counter() - w0


def settle(data: list[Any]) -> None:
    """On a GPU the block's wall time must include its queued kernels (and any sync the Guard
    forced shows as the difference)."""
    if data and data[0][0].is_cuda:
        torch.cuda.synchronize()
