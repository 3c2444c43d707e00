"""The Guard's automatic windows grow with short steps, from the step time the ranks agreed on, so
every rank launches the same windows at the same steps (they are collectives)."""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainguard.detect.numerics import NumericsMonitor
from trainguard.torch.agreement import Window
from trainguard.torch.checks import AUTO_EVERY, MAX_AUTO_EVERY, LossWindow, window_size


def _agreed(step_s: float | None) -> Window:
    return Window((0, 1), (1.0, 1.0), (False, False), (0.1, 0.1), (0.0, 0.0), False, ((), ()), step_s)


def _window(check_every: int | None = None) -> LossWindow:
    window = LossWindow(NumericsMonitor(), 2, "gloo", 0, check_every, None)
    window.set_mode(torch.tensor(1.0))
    return window


def test_short_steps_make_the_automatic_window_longer_and_long_steps_keep_eight():
    window = _window()
    assert window.every == AUTO_EVERY
    window._fit(_agreed(0.002))  # 2 ms steps: a window of 0.1 s
    assert window.every == window_size(0.002) == 50
    window._fit(_agreed(0.5))
    assert window.every == AUTO_EVERY
    window._fit(_agreed(1e-6))
    assert window.every == MAX_AUTO_EVERY


def test_a_window_size_the_user_set_is_kept_and_windows_without_peers_are_not_resized():
    window = _window(check_every=8)
    window._fit(_agreed(0.002))
    assert window.every == 8
    auto = _window()
    auto._fit(_agreed(None))  # one process: no agreed arrivals
    assert auto.every == AUTO_EVERY


def _rank(rank: int, out: str) -> None:
    from trainguard.torch.guard import Guard

    faulthandler.dump_traceback_later(120, exit=True)  # a collective mismatch hangs: fail fast
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg", rank=rank, world_size=2, timeout=timedelta(seconds=90)
    )
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sizes = []
    with Guard(None, None, run_dir=Path(out) / "run", watchdog=False) as guard:  # type: ignore[arg-type]
        for step in guard.range(0, 200):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            if guard.step(step, loss) == "proceed":
                opt.step()
            opt.zero_grad()
            sizes.append(guard.check_every)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"sizes": sizes, "checked": guard.last_checked}))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_resize_their_windows_at_the_same_step(tmp_path):
    out = str(tmp_path)
    mp.spawn(_rank, args=(out,), nprocs=2, join=True)
    reports = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0] == reports[1]  # the same size at every step, and the same steps checked
    sizes = reports[0]["sizes"]
    assert sizes[0] == AUTO_EVERY and max(sizes) > AUTO_EVERY  # sub-millisecond steps: longer windows
    assert reports[0]["checked"] == 199  # the last window is checked before the range ends
