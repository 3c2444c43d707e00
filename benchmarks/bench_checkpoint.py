"""Training stall of an asynchronous checkpoint vs a synchronous torch.save, on a >= 1 GB state.

    python benchmarks/bench_checkpoint.py                 # 0.5 GB state, 3 rounds, 7 loop rounds
    python benchmarks/bench_checkpoint.py --size-gb 1 --rounds 5
    python benchmarks/bench_checkpoint.py --json [--dir /mnt/ckpt]

The state is a model of 4096x4096 linear layers plus Adam's two moments (params x 3), saved
through ``TrainState`` from a real training loop (forward, backward, ``optimizer.step``; one
intra-op thread, standing in for a GPU: the host's other core is the copy's and the writer's).
Measured in one run, interleaved round by round:

* ``stall_s``: how long the checkpoint blocks the training thread: ``Checkpointer.save`` itself
  plus the optimizer's wait for the overlapped snapshot (``last_stall_s``; median of the rounds; the
  first save, which spawns the writer process and allocates the staging buffer, is not counted);
  ``save_call_s`` is ``save`` alone, and ``step_slowdown_s`` the extra wall time of the step after a
  save against a plain step (it adds the copy's and the writer's contention for cores and memory
  bandwidth; ``step_slowdown_overlap_off_s`` is the same without overlap);
* ``stall_overlap_off_s``: the same stall with ``overlap=False`` (every tensor copied inside save);
* ``sync_save_s``: ``torch.save`` of the same state to a file + fsync, the plain baseline;
* ``copy_s``: one ``torch._foreach_copy_`` of the state into already-allocated host memory, the
  floor for any snapshot that copies;
* ``write_mb_s``: the background writer's throughput (bytes / time from temporary directory to
  durable commit, checksum included) for a save with nothing else running, as dd runs, and
  ``dd_mb_s``: the faster of ``dd bs=64M conv=fsync`` and ``dd bs=64M oflag=direct`` (no page
  cache in the way) to the same directory, in the same round (order alternating); disk_ratio is the
  median of per-round ratios. ``step_slowdown_s`` above shows what sharing the host with the writer
  costs the training step on this machine;
* ``loop_overhead_s``: what training really pays, the wall time of N steps with a save every K
  steps minus the same N steps without (K steps take about twice one write), and the same for
  ``torch.distributed.checkpoint.async_save`` with process-based writing and an async
  shared-memory stager (``dcp_async_loop_overhead_s``; see loop_overhead.py); ``backpressure_*``:
  the same with K steps shorter than one write, so every save waits for the previous one. Rounds
  are interleaved (plain, ours, DCP; order reversed every other round) and every figure is a
  median of per-round paired differences with a distribution-free 95% confidence interval from
  its order statistics (``*_ci95_s``; 6 rounds at least); ``ours_minus_dcp_s`` pairs our loop
  with DCP's in the same round. ``overhead_vs_dcp`` is reported only when both overheads are
  resolved (CI above zero); otherwise it is null and ``overhead_vs_dcp_note`` says why.

Keys: stall_ratio = stall / sync save (target <= 0.04), copy_ratio = stall / copy (target
<= 1.5), disk_ratio = write / dd throughput (target >= 0.8), overhead_vs_dcp = our loop overhead /
DCP's (target <= 0.8), plus the raw figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import loop_overhead
from targets import Target, finish
from trainguard.torch import Checkpointer, TrainState

TARGETS = (
    Target("stall_ratio", "<=", 0.04),
    Target("copy_ratio", "<=", 1.5),
    Target("disk_ratio", ">=", 0.8),
    Target("overhead_vs_dcp", "<=", 0.8),
)

LAYER_BYTES = 4096 * 4096 * 4


def make_state(size_gb: float, device: str = "cpu") -> TrainState:
    layers = max(1, math.ceil(size_gb * (1 << 30) / (3 * LAYER_BYTES)))
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # materialise exp_avg / exp_avg_sq
    for p in model.parameters():
        p.grad = None
    return TrainState(model, opt)


def state_tensors(state: TrainState) -> list[torch.Tensor]:
    tensors = [p.detach() for p in state.model.parameters()]
    tensors += [t for s in state.optimizer.state.values() for t in s.values() if t.numel() > 1]
    return tensors


def train_step(state: TrainState, batch: torch.Tensor) -> None:
    state.model(batch).square().mean().backward()
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)


def timed_step(
    state: TrainState, batch: torch.Tensor, ckpt: Checkpointer | None, step: int
) -> tuple[float, float]:
    """Wall time of one training step preceded by ``ckpt.save`` when given (the boundary save),
    and the time of the save call alone."""
    start = time.perf_counter()
    if ckpt is not None:
        ckpt.save(step, state)
    saved = time.perf_counter()
    train_step(state, batch)
    loop_overhead.settle(batch)
    return time.perf_counter() - start, saved - start


def sync_save(state: TrainState, path: Path) -> float:
    payload = {**state.global_state_dict(), "local": [state.local_state_dict()]}
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def dd(path: Path, nbytes: int, flag: str = "conv=fsync") -> float:
    """dd's MB/s writing ``nbytes`` of zeros; 0.0 if the filesystem refuses the flag (O_DIRECT)."""
    count = math.ceil(nbytes / (64 << 20))
    start = time.perf_counter()
    done = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=64M", f"count={count}", flag],
        capture_output=True,
    )
    elapsed = time.perf_counter() - start
    path.unlink(missing_ok=True)
    return count * (64 << 20) / elapsed / 1e6 if done.returncode == 0 else 0.0


def best_dd(path: Path, nbytes: int) -> float:
    return max(dd(path, nbytes), dd(path, nbytes, "oflag=direct"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--loop-rounds", type=int, default=7, help="rounds of the loop-overhead A/B (>= 6 for a 95%% CI)"
    )
    parser.add_argument("--batch", type=int, default=8, help="training batch (rows of 4096)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--device", default="cpu", help="where the state lives: cpu or cuda (GPU memory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="tg-bench-ckpt-", dir=args.dir))
    try:
        state = make_state(args.size_gb, args.device)
        batch = torch.randn(args.batch, 4096, device=args.device)
        train_step(state, batch)  # warm-up: allocator, first-step optimizer work
        tensors = state_tensors(state)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        # the floor: one copy into already-allocated host memory (pinned for a GPU's state)
        cuda = batch.is_cuda
        floor = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in tensors]
        torch._foreach_copy_(floor, tensors)  # fault the pages in: "already allocated"

        ckpt = Checkpointer(root / "ckpt", keep_last=1)
        plain_ckpt = Checkpointer(root / "plain", keep_last=1, overlap=False)
        for c in (ckpt, plain_ckpt):
            c.save(0, state)  # spawns the writer, allocates and pins the staging buffer
            c.wait()
        # per round: seconds, except writes and dds (MB/s)
        steps: list[float] = []
        stalls: list[float] = []
        calls: list[float] = []
        slowdowns: list[float] = []
        slowdowns_off: list[float] = []
        stalls_off: list[float] = []
        writes: list[float] = []
        dds: list[float] = []
        copies: list[float] = []
        syncs: list[float] = []
        for step in range(1, args.rounds + 1):
            if step % 2:  # alternate the order, so neither always follows the other's flush
                dds.append(best_dd(root / "dd.bin", nbytes))
            start = time.perf_counter()
            torch._foreach_copy_(floor, tensors, non_blocking=cuda)
            loop_overhead.settle(batch)
            copies.append(time.perf_counter() - start)
            plain, _ = timed_step(state, batch, None, step)
            steps.append(plain)
            saving, call = timed_step(state, batch, ckpt, 2 * step - 1)
            assert ckpt.last_stall_s is not None
            stalls.append(ckpt.last_stall_s)
            calls.append(call)
            slowdowns.append(saving - plain)
            ckpt.wait()
            # The writer's own throughput, like dd's: a save with nothing else running.
            ckpt.save(2 * step, state)
            ckpt.wait()
            assert ckpt.last_result is not None
            writes.append(ckpt.last_result["bytes"] / ckpt.last_result["write_s"] / 1e6)
            plain, _ = timed_step(state, batch, None, step)
            saving, _ = timed_step(state, batch, plain_ckpt, step)
            slowdowns_off.append(saving - plain)
            assert plain_ckpt.last_stall_s is not None
            stalls_off.append(plain_ckpt.last_stall_s)
            plain_ckpt.wait()
            if step % 2 == 0:
                dds.append(best_dd(root / "dd.bin", nbytes))
            if step <= 2:
                syncs.append(sync_save(state, root / "sync.pt"))
        ckpt.close()
        plain_ckpt.close()
        loop: dict[str, object] = {}
        pressed: dict[str, object] = {}
        if args.loop_rounds > 0:  # 0: the stall figures alone (a quick check)
            loop, pressed = loop_overhead.measure_both(state, batch, root / "loop", args.loop_rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    stall, copy, sync = statistics.median(stalls), statistics.median(copies), statistics.median(syncs)
    write, dd_rate = statistics.median(writes), statistics.median(dds)
    # the disk's speed drifts (other tenants, host caches): compare each write with its own round's dd
    disk_ratio = statistics.median(w / d for w, d in zip(writes, dds, strict=True))
    result = {
        "state_mb": round(nbytes / 1e6, 1),
        "tensors": len(tensors),
        "stall_s": round(stall, 4),
        "save_call_s": round(statistics.median(calls), 4),
        "stall_overlap_off_s": round(statistics.median(stalls_off), 4),
        "step_s": round(statistics.median(steps), 3),
        "step_slowdown_s": round(statistics.median(slowdowns), 4),
        "step_slowdown_overlap_off_s": round(statistics.median(slowdowns_off), 4),
        "sync_save_s": round(sync, 3),
        "copy_s": round(copy, 4),
        "write_mb_s": round(write, 1),
        "dd_mb_s": round(dd_rate, 1),
        "stall_ratio": round(stall / sync, 4),
        "copy_ratio": round(stall / copy, 3),
        "disk_ratio": round(disk_ratio, 3),
        **loop,
        **{f"backpressure_{k}": v for k, v in pressed.items()},
        "device": args.device,
        "rounds": args.rounds,
        "stalls_s": [round(s, 4) for s in stalls],
        "copies_s": [round(c, 4) for c in copies],
        "writes_mb_s": [round(w, 1) for w in writes],
        "dds_mb_s": [round(d, 1) for d in dds],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"state: {result['state_mb']} MB in {len(tensors)} tensors (model + Adam moments)")
        print(
            f"training step           {result['step_s']:8.3f} s   (forward, backward, Adam; batch {args.batch})"
        )
        print(
            f"async save stall        {stall:8.3f} s   (median of {args.rounds}: save() "
            f"{result['save_call_s']:.3f} s + the optimizer's wait for the snapshot)"
        )
        print(
            f"  without overlap       {result['stall_overlap_off_s']:8.3f} s   "
            f"(everything copied inside save)"
        )
        print(
            f"step after a save vs a plain step: {result['step_slowdown_s']:+.3f} s "
            f"(overlap off: {result['step_slowdown_overlap_off_s']:+.3f} s; both include the writer's "
            "and the copy's contention for this host's cores and memory bandwidth)"
        )
        print(
            f"sync torch.save + fsync {sync:8.3f} s   stall_ratio {result['stall_ratio']:.4f}  (target <= 0.04)"
        )
        print(
            f"copy into host memory   {copy:8.3f} s   copy_ratio  {result['copy_ratio']:.3f}   (target <= 1.5)"
        )
        print(f"background write        {write:8.1f} MB/s")
        print(
            f"dd bs=64M best of fsync/O_DIRECT {dd_rate:8.1f} MB/s disk_ratio {result['disk_ratio']:.3f} (target >= 0.8)"
        )
        for name, r in (("", loop), ("back-pressure: ", pressed)) if loop else ():
            print(
                f"{name}{r['loop_steps']} steps, a save every {r['loop_every']} ({r['loop_plain_s']:.2f} s "
                f"without), medians of {r['loop_rounds']} paired rounds [95% CI]:"
            )
            print(
                f"    trainguard {r['loop_overhead_s']:+.3f} s {r['loop_overhead_ci95_s']}, DCP async_save "
                f"{r['dcp_async_loop_overhead_s']:+.3f} s {r['dcp_async_loop_overhead_ci95_s']}, "
                f"ours - DCP {r['ours_minus_dcp_s']:+.3f} s {r['ours_minus_dcp_ci95_s']}"
            )
            print(
                f"    overhead_vs_dcp {r['overhead_vs_dcp']} (target <= 0.8) {r['overhead_vs_dcp_note'] or ''}"
            )
            print(
                f"    training blocked in the checkpointer per loop: trainguard {r['loop_blocked_s']:.3f} s, "
                f"DCP {r['dcp_async_loop_blocked_s']:.3f} s (blocked_vs_dcp {r['blocked_vs_dcp']})"
            )
    return finish("bench_checkpoint", TARGETS, result, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
