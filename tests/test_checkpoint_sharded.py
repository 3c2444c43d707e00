"""Sharded state (FSDP2 on CPU/gloo): saved by 2 ranks through torch.distributed.checkpoint with
the same manifest and atomic commit, resumed at world size 1."""

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

from trainguard.checkpoint import list_checkpoints, verify
from trainguard.torch import Checkpointer, TrainState

HANG_S = 180  # a rank stuck this long prints every thread's stack and exits (fails fast)
COLLECTIVE_TIMEOUT = timedelta(seconds=150)  # a rank waits this long for its peer in a collective


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.fixture
def own_tmp():
    # Not pytest's tmp_path: with several pytest sessions sharing /tmp/pytest-of-<user>, the
    # worker processes' rendezvous files must not live where another session may prune them.
    path = Path(tempfile.mkdtemp(prefix="tg-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fail_fast_on_hang() -> None:
    """Past HANG_S, print every thread's stack and exit 1; on mp.spawn's SIGTERM (a peer failed),
    print the stacks too; on a fatal signal (SIGABRT...), print the Python stacks of the crash."""
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)


def _exit_now() -> None:
    """End a worker without the interpreter's and the C++ runtime's teardown. FSDP2 and DDP keep the
    gloo process group alive from C++ after destroy_process_group, so its threads (gloo_tcp_loop,
    pt_gloo_runloop x2) still run at exit; and rank 0 of this test once died of SIGABRT "terminate
    called without an active exception" (std::terminate: typically a C++ thread object destroyed while
    its thread runs). Nothing is left to clean up: the group is destroyed and the files are closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker(rank: int, world: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    _fail_fast_on_hang()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT
    )
    model = make_model()
    fully_shard(model)
    assert isinstance(next(model.parameters()), DTensor)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    torch.manual_seed(1 + rank)
    for _ in range(3):
        model(torch.randn(4, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    with Checkpointer(Path(out) / "ckpt") as ckpt:
        ckpt.save(3, TrainState(model, opt, sched, extra={"tokens": 96}))
    params = [p.full_tensor() for p in model.parameters()]
    moments = [opt.state[p]["exp_avg_sq"].full_tensor() for p in model.parameters()]
    if rank == 0:
        torch.save({"params": params, "moments": moments}, Path(out) / "expected.pt")
    dist.destroy_process_group()
    _exit_now()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sharded_checkpoint_from_two_ranks_resumes_at_world_size_one(own_tmp):
    tmp_path = own_tmp
    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    ckpt_dir = tmp_path / "ckpt"
    [info] = list_checkpoints(ckpt_dir)
    result = verify(info.path)
    assert result.ok and result.manifest is not None
    assert (result.manifest.kind, result.manifest.sharded, result.manifest.world_size) == ("dcp", True, 2)
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "trainer.pt"} <= set(result.manifest.files)
    assert json.loads((info.path / "manifest.json").read_text())["step"] == 3

    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = TrainState(model, opt, sched)
    with Checkpointer(ckpt_dir) as ckpt:
        assert ckpt.resume(state) == 3
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected["params"], strict=True))
    moments = [opt.state[p]["exp_avg_sq"] for p in model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(moments, expected["moments"], strict=True))
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.05 / 8)
    assert state.extra == {"tokens": 96}

    shard = info.path / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x04
    shard.write_bytes(bytes(data))
    assert "checksum mismatch in __1_0.distcp" in verify(info.path).reason
    with Checkpointer(ckpt_dir) as ckpt:
        assert ckpt.resume(TrainState(make_model())) == 0
