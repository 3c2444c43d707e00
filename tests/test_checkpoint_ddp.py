"""Two DDP ranks: only rank 0 writes, and a failed save raises on every rank (nobody hangs)."""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HANG_S = 180  # a rank stuck this long prints every thread's stack and exits (fails fast)
COLLECTIVE_TIMEOUT = timedelta(seconds=150)  # a rank waits this long for its peer in a collective


def _fail_fast_on_hang() -> None:
    """Stacks on a hang (then exit 1), on mp.spawn's SIGTERM and on a fatal signal."""
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def _exit_now() -> None:
    """Exit without the runtime's teardown beside live gloo threads (see test_checkpoint_sharded.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker(rank: int, out: str) -> None:
    from trainguard.errors import CheckpointError
    from trainguard.torch import Checkpointer, TrainState

    _fail_fast_on_hang()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg", rank=rank, world_size=2, timeout=COLLECTIVE_TIMEOUT
    )
    state = TrainState(torch.nn.Linear(4, 4))
    report: dict[str, object] = {}
    with Checkpointer(Path(out) / "ckpt") as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        report["latest"] = ckpt.latest_step
        report["writer"] = ckpt._writer is not None and ckpt._writer.alive
    blocked = Path(out) / "blocked"  # a file where the directory should be: rank 0's write fails
    if rank == 0:
        blocked.write_text("x")
    dist.barrier()
    for async_save in (True, False):
        ckpt = Checkpointer(blocked, async_save=async_save)
        try:
            ckpt.save(1, state)
            ckpt.wait()
            report[f"error_{async_save}"] = None
        except CheckpointError as exc:
            report[f"error_{async_save}"] = str(exc).splitlines()[0]
        ckpt._shutdown()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    _exit_now()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rank_zero_writes_and_a_failed_save_raises_on_every_rank():
    out = Path(tempfile.mkdtemp(prefix="tg-test-"))
    try:
        mp.spawn(_worker, args=(str(out),), nprocs=2, join=True)
        reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        assert [r["latest"] for r in reports] == [1, 1]  # rank 1 learns the durable step at wait()
        assert [r["writer"] for r in reports] == [True, False]  # only rank 0 runs a writer process
        for report in reports:
            assert "NotADirectoryError" in report["error_True"]
            assert "NotADirectoryError" in report["error_False"]
    finally:
        shutil.rmtree(out, ignore_errors=True)
