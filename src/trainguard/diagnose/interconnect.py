"""All-reduce bus bandwidth among the local devices through torch.distributed. Imports torch.

One thread per device, each a rank of its own process group (NCCL on GPUs, gloo on the CPU and
the simulated node) over an in-process store: no processes to start or reap. Bus bandwidth is
nccl-tests' definition for all-reduce: ``busbw = algbw * 2 (n - 1) / n``, ``algbw = bytes / time``,
so figures compare with ``all_reduce_perf`` output and across group sizes.

To name a slow link, every pair of devices is measured, one pair at a time (nccl-tests are run
on pairs the same way to find a bad node): a device's figure is its best pair, so only a
device whose every pair is slow (its own link) looks slow, and one noisy measurement does not.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainguard.diagnose.device import Device

__all__ = ["busbw", "measure_interconnect", "pairs"]

_BLOCKS = 3


def busbw(nbytes: int, seconds: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s (1e9) for one operation of ``seconds``."""
    return nbytes / seconds / 1e9 * (2 * (n - 1) / n)


def pairs(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``n`` devices, in rounds of disjoint pairs (the circle method of a round-robin
    tournament): n - 1 rounds for even n, each device in one pair per round."""
    slots: list[int | None] = [*range(n), *([None] if n % 2 else [])]
    rounds = []
    for _ in range(len(slots) - 1):
        half = len(slots) // 2
        pairs_ = [(slots[k], slots[-1 - k]) for k in range(half)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs_ if a is not None and b is not None])
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def _group_busbw(
    devices: Sequence[Device], nbytes: int, iters: int, timeout_s: float, tag: str, store: dist.Store
) -> float:
    """Run ``iters`` all-reduces of ``nbytes`` among ``devices``; the slowest rank's busbw."""
    n = len(devices)
    times: list[float] = [float("inf")] * n
    errors: list[BaseException] = []
    timeout = datetime.timedelta(seconds=timeout_s)

    def rank(r: int, dev: Device) -> None:
        try:
            prefix = dist.PrefixStore(f"{tag}/", store)
            if dev.kind == "cuda":
                torch.cuda.set_device(dev.torch_device)
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                pg: Any = dist.ProcessGroupNCCL(prefix, r, n, options)
            else:
                pg = dist.ProcessGroupGloo(prefix, r, n, timeout)
            t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev.torch_device)
            dev.all_reduce(pg, t)  # warm-up: connections, buffers
            for _ in range(_BLOCKS):  # the best block: robust to a host busy for a moment
                dev.sync()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dev.all_reduce(pg, t)
                dev.sync()
                took = dev.link_seconds(nbytes, n, (time.perf_counter() - t0) / iters)
                times[r] = min(times[r], took)
        except BaseException as exc:  # reported by the caller as the test's failure
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r, d), daemon=True) for r, d in enumerate(devices)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return busbw(nbytes, max(times), n)


def measure_interconnect(
    devices: Sequence[Device], nbytes: int, iters: int, timeout_s: float
) -> tuple[dict[int, float], float]:
    """({device index: best pairwise busbw}, busbw of the all-device ring), in GB/s."""
    store = dist.HashStore()
    best: dict[int, float] = {d.index: 0.0 for d in devices}
    # One pair at a time: pairs sharing the host's CPU (gloo) would slow each other unevenly.
    for i, j in (p for round_ in pairs(len(devices)) for p in round_):
        bw = _group_busbw([devices[i], devices[j]], nbytes, iters, timeout_s, f"pair-{i}-{j}", store)
        for d in (devices[i], devices[j]):
            best[d.index] = max(best[d.index], bw)
    ring = _group_busbw(devices, nbytes, iters, timeout_s, "ring", store)
    return best, ring
