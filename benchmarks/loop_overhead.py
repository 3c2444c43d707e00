"""What checkpointing costs a training loop: wall time of N steps with a save every K steps minus
the same N steps without, for trainguard's ``Checkpointer`` and for PyTorch's own
``torch.distributed.checkpoint.async_save`` (used by bench_checkpoint.py).

DCP is given its best configuration on this host: the process-based executor
(``AsyncCheckpointerType.PROCESS``, the write happens in a daemon process, as ours does) and a
``DefaultStager`` kept for the whole run, staging asynchronously into shared memory (pinned
memory and non-blocking copies need CUDA). Both loops apply the same back-pressure: the next
save waits for the previous one to be durable (DCP's documentation asks for the previous
future to complete before a new async_save; our ``save`` collects the previous write), and
the optimizer's next update waits for the staging copy of the tensors it changes.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainguard.torch import Checkpointer, TrainState


def median_ci95(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free confidence interval of at least 95% for the median: the order
    statistics x(k) and x(n+1-k) with the largest k whose binomial tail P(Bin(n, 1/2) < k) stays
    <= 2.5% (rounds are independent: each is its own paired A/B). None below 6 rounds."""
    n, k = len(values), 0
    while sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 0.025:
        k += 1
    if k == 0:
        return None
    ranked = sorted(values)
    return ranked[k - 1], ranked[n - k]


def summarise(diffs: list[float]) -> tuple[float, tuple[float, float] | None, bool]:
    """(median, its 95% CI, resolved): resolved when the CI lies wholly above zero."""
    ci = median_ci95(diffs)
    return statistics.median(diffs), ci, ci is not None and ci[0] > 0


def init_single_rank_group() -> None:
    """DCP's async save needs a process group (gloo for CPU tensors); one rank, here."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=0, world_size=1)


class DcpSaver:
    """``dcp.async_save`` with process-based writing and a persistent async shared-memory stager."""

    def __init__(self, root: Path) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = torch.cuda.is_available()
        self.root = root
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=True,
                use_async_staging=True,
                use_non_blocking_copy=cuda,
            )
        )
        self.response: Any = None
        self.staging: Any = None  # the staging future the next optimizer update waits for
        self.saves = 0
        self.blocked_s = 0.0  # time save() and the wait for staging blocked training

    def save(self, step: int, state: TrainState) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        started = time.perf_counter()
        self.wait()  # back-pressure: one save in flight
        self.saves += 1  # a fresh directory per save, as ours (loops repeat step numbers)
        self.response = dcp.async_save(
            {"model": state.model.state_dict(), "optim": state.optimizer.state_dict()},
            checkpoint_id=str(self.root / f"save-{self.saves:08d}-step-{step:08d}"),
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            async_stager=self.stager,
        )
        self.staging = getattr(self.response, "staging_completion", None)
        self.blocked_s += time.perf_counter() - started

    def before_update(self) -> None:
        if self.staging is not None:
            started = time.perf_counter()
            self.staging.result()
            self.staging = None
            self.blocked_s += time.perf_counter() - started

    def wait(self) -> None:
        if self.response is None:
            return
        self.before_update()
        upload = getattr(self.response, "upload_completion", self.response)
        upload.result()
        self.response = None
        for old in sorted(self.root.glob("save-*"))[:-1]:  # keep_last=1, as ours
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        self.wait()
        self.stager.close()


class OursSaver:
    """trainguard's ``Checkpointer`` with the time it blocked training summed: ``last_stall_s``
    (``save`` itself plus the optimizer's wait for the overlapped copy) of every save."""

    def __init__(self, ckpt: Checkpointer, state: TrainState) -> None:
        self.ckpt, self.state = ckpt, state
        self.blocked_s = 0.0
        self._open = False

    def save(self, step: int) -> None:
        self._settle()
        self.ckpt.save(step, self.state)
        self._open = True

    def _settle(self) -> None:
        if self._open and self.ckpt.last_stall_s is not None:
            self.blocked_s += self.ckpt.last_stall_s
        self._open = False

    def wait(self) -> None:
        self._settle()
        self.ckpt.wait()


def run_loop(
    state: TrainState,
    batch: torch.Tensor,
    steps: int,
    every: int,
    save: Callable[[], None] | None,
    before_update: Callable[[], None] = lambda: None,
) -> float:
    """Wall seconds of ``steps`` training steps, calling ``save()`` after every ``every``-th
    (not after the last: its write would have the next steps to overlap with)."""
    start = time.perf_counter()
    for step in range(1, steps + 1):
        state.model(batch).square().mean().backward()
        before_update()
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        if save is not None and step % every == 0 and step < steps:
            save()
    settle(batch)
    return time.perf_counter() - start


def settle(batch: torch.Tensor) -> None:
    """On a GPU, wait for the queued work: a wall time must include it."""
    if batch.is_cuda:
        torch.cuda.synchronize()


def steps_per_write(state: TrainState, batch: torch.Tensor, ours: Checkpointer, dcp: DcpSaver) -> int:
    """Training steps that run while one save is written, the slower of the two savers (a write
    competes with training for this host's cores, so it is slower here than on an idle host)."""
    most = 1
    before = ours.last_result
    for save, done in (
        (
            lambda: ours.save(1, state),
            lambda: ours.latest_step is not None and ours.last_result is not before,
        ),
        (lambda: dcp.save(1, state), lambda: dcp.response.upload_completion.done()),
    ):
        save()
        n = 0
        while not done() and n < 1000:
            run_loop(state, batch, 1, 1, None, dcp.before_update)
            n += 1
        most = max(most, n)
    ours.wait()
    dcp.wait()
    return most


def measure_both(
    state: TrainState, batch: torch.Tensor, root: Path, rounds: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(normal, back-pressure): K steps take about twice one write, or about half of one."""
    init_single_rank_group()
    ours = Checkpointer(root / "tg", keep_last=1)
    dcp = DcpSaver(root / "dcp")
    try:
        # First saves start the writer processes and allocate staging memory: not timed.
        ours.save(0, state)
        ours.wait()
        dcp.save(0, state)
        dcp.wait()
        per_write = steps_per_write(state, batch, ours, dcp)
        every = 2 * per_write + 1
        normal = measure(state, batch, ours, dcp, 3 * every, every, rounds)
        tight = max(1, per_write // 2)
        pressed = measure(state, batch, ours, dcp, 4 * tight, tight, rounds)
    finally:
        ours.close()
        dcp.close()
    return {**normal, "steps_per_write": per_write}, pressed


def measure(
    state: TrainState,
    batch: torch.Tensor,
    ours: Checkpointer,
    dcp: DcpSaver,
    steps: int,
    every: int,
    rounds: int,
) -> dict[str, Any]:
    """Interleaved rounds of: no checkpoint, trainguard, DCP async_save. Overheads are medians of
    per-round differences against the same round's plain loop."""
    count = itertools.count((ours.latest_step or 0) + 1)  # fresh, rising steps: no overwrites
    tg = OursSaver(ours, state)
    dcp.blocked_s = 0.0
    plain: list[float] = []
    ours_wall: list[float] = []
    dcp_wall: list[float] = []
    for r in range(rounds):
        order = ("plain", "tg", "dcp") if r % 2 == 0 else ("dcp", "tg", "plain")
        for which in order:
            if which == "plain":
                plain.append(run_loop(state, batch, steps, every, None))
            elif which == "tg":
                ours_wall.append(run_loop(state, batch, steps, every, lambda: tg.save(next(count))))
                tg.wait()
            else:
                save = lambda: dcp.save(next(count), state)  # noqa: E731
                dcp_wall.append(run_loop(state, batch, steps, every, save, dcp.before_update))
                dcp.wait()
    ours_d = [t - p for t, p in zip(ours_wall, plain, strict=True)]
    dcp_d = [d - p for d, p in zip(dcp_wall, plain, strict=True)]
    ours_over, ours_ci, ours_ok = summarise(ours_d)
    dcp_over, dcp_ci, dcp_ok = summarise(dcp_d)
    # ours - DCP in the same round: no plain loop in it, so less noise than either overhead
    gap, gap_ci, _ = summarise([t - d for t, d in zip(ours_wall, dcp_wall, strict=True)])
    blocked = {"ours": tg.blocked_s / rounds, "dcp": dcp.blocked_s / rounds}
    dcp.blocked_s = 0.0
    note = None
    if not (ours_ok and dcp_ok):
        unresolved = [n for n, ok in (("trainguard", ours_ok), ("DCP", dcp_ok)) if not ok]
        note = (
            f"{' and '.join(unresolved)} overhead not resolved from noise (95% CI of the median "
            f"reaches 0 or below, or fewer than 6 rounds): overhead_vs_dcp undefined; run more "
            "--loop-rounds on a quieter host"
        )

    def ci(c: tuple[float, float] | None) -> list[float] | None:
        return None if c is None else [round(c[0], 3), round(c[1], 3)]

    return {
        "loop_steps": steps,
        "loop_every": every,
        "loop_plain_s": round(statistics.median(plain), 3),
        "loop_overhead_s": round(ours_over, 3),
        "loop_overhead_ci95_s": ci(ours_ci),
        "dcp_async_loop_overhead_s": round(dcp_over, 3),
        "dcp_async_loop_overhead_ci95_s": ci(dcp_ci),
        "overhead_vs_dcp": round(ours_over / dcp_over, 3) if note is None else None,
        "overhead_vs_dcp_note": note,
        "ours_minus_dcp_s": round(gap, 3),
        "ours_minus_dcp_ci95_s": ci(gap_ci),
        "loop_blocked_s": round(blocked["ours"], 4),
        "dcp_async_loop_blocked_s": round(blocked["dcp"], 4),
        "blocked_vs_dcp": round(blocked["ours"] / blocked["dcp"], 3) if blocked["dcp"] > 0 else None,
        "loop_rounds": rounds,
        "loop_overheads_s": [round(x, 3) for x in ours_d],
        "dcp_async_loop_overheads_s": [round(x, 3) for x in dcp_d],
    }
