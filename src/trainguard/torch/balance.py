"""The trainer's half of load balancing: measure each rank's own compute, agree, move the shares.

Part of the Guard (``Guard(..., balance=True)``, docs/balance.md). Each rank measures its own
compute per sample: from the first forward of a step (a forward pre-hook on the model) to the
moment its backward finished (DDP's communication hook for the last gradient bucket, which DDP
calls before the rank waits for the others' gradients; without DDP, the ``guard.step`` call).
Waiting for slower ranks is not in it, so a fast rank measures its own speed, not the straggler's.
It is device time: on a GPU both ends are CUDA events, read at the next agreement; on the CPU the
CPU time of the thread that computes (a host busy with other processes does not make one rank
look slower than another), plus what a simulated GPU's slowdown added (``torch.sim_gpu``).

Every ``every`` steps, at ``guard.step``, the ranks agree: one all-reduce of every rank's compute
seconds, samples, window time, GPU and how far its sampler has handed out batches. Every rank
then runs the same ladder (``trainguard.balance.ladder``) on the same numbers, so every rank takes
the same move, and new shares start at the same global batch: the first one no rank has handed
out yet. Rank 0 writes each move to the run directory as a finding (``balance.rebalance``,
``balance.restore``, ``balance.exclude``) with its evidence; the supervisor records it as an
incident, and excludes the GPU when the move says so.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainguard import rundir
from trainguard.balance.ladder import LadderConfig, LadderState, Measure, Move, judge
from trainguard.records import Action, Finding, Health
from trainguard.torch.shares import ShareSampler
from trainguard.torch.state import unwrap_model

log = logging.getLogger(__name__)

__all__ = ["Balancer"]

SLOTS = 5  # per rank in the agreement: compute seconds, samples, window seconds, GPU, batches handed out
_SEVERITY = {"rebalance": Health.DEGRADED, "restore": Health.OK, "exclude": Health.DEGRADED}


class Balancer:
    """Moves ``sampler``'s shares by measured speed. The Guard builds one with ``balance=True``.

    ``progress`` counts the steps recorded (the Guard's ``guard.step`` calls): the first forward
    after a new count starts a step. Without a DDP model a step's compute ends where the next
    begins (or at the agreement), so it includes the optimizer step and the data loading.
    """

    def __init__(
        self,
        sampler: ShareSampler,
        config: LadderConfig | None = None,
        every: int = 10,
        *,
        run_dir: Path | None = None,
        rank: int = 0,
        world: int = 1,
        gpu: int | None = None,
        progress: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        device_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        if not isinstance(sampler, ShareSampler):
            raise TypeError(
                f"balancing needs a trainguard.torch.ShareSampler as the sampler, got {type(sampler).__name__} "
                "(DataLoader(dataset, batch_sampler=ShareSampler(dataset, global_batch=B)); docs/balance.md)"
            )
        if every < 2:
            raise ValueError(f"every={every}: agree every 2 steps or more")
        self.sampler, self.config, self.every = sampler, config or LadderConfig(), every
        self.run_dir, self.rank, self.world, self.gpu = run_dir, rank, world, gpu
        self.moves: list[Move] = []  # every move taken, oldest first
        self.state: LadderState | None = None  # set at the first agreement, from the sampler's shares
        self._progress = progress or (lambda: 0)
        self._clock = clock  # the job's time (windows)
        self.device_clock = device_clock  # this rank's compute, on the CPU (see the module docstring)
        self._hooks: list[Any] = []
        self._cuda = False
        self._seen = -1  # the progress count of the step being measured
        self._start: Any = None  # when its first forward began (a float, or a CUDA event); None: no step open
        self._ended: Any = None  # when its backward finished (DDP's last bucket)
        self._step_samples = 0
        self._pending: list[tuple[Any, Any, int]] = []  # closed steps: (start, end, samples)
        self._window_start = clock()
        self.next_step = every - 1  # guard.step of this step agrees

    # -- measuring --------------------------------------------------------------------------------
    def attach(self, model: torch.nn.Module) -> None:
        """Time ``model``'s steps: a forward pre-hook on the module DDP wraps and, on a DDP model,
        a communication hook that notes when the last gradient bucket is ready, then all-reduces
        as DDP does by default (a script with its own hook times its steps at ``guard.step``)."""
        inner = unwrap_model(model)
        self._hooks.append(inner.register_forward_pre_hook(self._on_forward))
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            try:
                model.register_comm_hook(None, _unannotated(self._comm_hook))
            except RuntimeError as exc:  # the script registered its own: time at guard.step
                log.warning("balance: DDP has a communication hook already (%s); timing at guard.step", exc)
        if self.rank == 0 and self.run_dir is not None:  # the supervisor leaves slow GPUs to us first
            c = self.config
            why = (
                f"balancing {self.world} ranks: shares of the global batch of {self.sampler.global_batch} "
                f"follow measured speed (agreed every {self.every} steps; rebalance above {c.threshold:.0%} "
                f"idle for {c.persist} agreements, restore below {c.restore:.0%})"
            )
            on = Finding("balance.on", Health.OK, Action.NONE, why, gpu=self.gpu, time=time.time())
            rundir.append_finding(self.run_dir, self.rank, on, None)

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _now(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.device_clock()

    def _on_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation is not a training step
        n = self._progress()
        if n != self._seen or self._start is None:  # the first forward of a step
            self._close()
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            self._cuda = first is not None and first.is_cuda
            self._seen, self._start, self._ended, self._step_samples = n, self._now(), None, 0
        self._step_samples += _batch_len(args)

    def _comm_hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            self._ended = self._now()  # this rank's backward is done; from here it waits for the others
        group = dist.group.WORLD
        assert group is not None
        tensor = bucket.buffer().div_(group.size())
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

    def _close(self) -> None:
        """Close the step being measured: from its first forward to its backward's end (else the
        Guard's step call)."""
        if self._start is None:
            return
        end = self._ended
        if end is None:  # no DDP hook: the step's compute ended by now (at guard.step)
            end = self._now()
        self._pending.append((self._start, end, self._step_samples))
        self._start = self._ended = None

    def _window(self) -> tuple[float, int, int]:
        """(compute seconds, samples, steps) of the steps closed since the last agreement."""
        seconds, samples = 0.0, 0
        for start, end, n in self._pending:
            if isinstance(start, float):
                seconds += max(0.0, end - start)
            else:
                end.synchronize()
                seconds += start.elapsed_time(end) / 1000.0
            samples += n
        steps = len(self._pending)
        self._pending = []
        return seconds, samples, steps

    # -- agreeing ---------------------------------------------------------------------------------
    def boundary(self, step: int) -> Move | None:
        """At ``guard.step(step)`` on every rank (a collective): agree on the window, judge, move."""
        self.next_step = step + self.every
        self._close()
        seconds, samples, steps = self._window()
        now = self._clock()
        wall, self._window_start = now - self._window_start, now
        own = [seconds, float(samples), wall, float(self.gpu if self.gpu is not None else -1), 0.0]
        own[4] = float(self.sampler.produced)
        agreed = self._all_gather(own)
        rows = [agreed[r * SLOTS : (r + 1) * SLOTS] for r in range(self.world)]
        planned = self.sampler.shares_at(self.sampler.produced)
        if self.state is None or self.state.shares != planned:  # first window, or a rollback
            self.state = LadderState.start(planned)
        m = Measure(
            step=step,
            compute_s=tuple(r[0] for r in rows),
            samples=tuple(int(r[1]) for r in rows),
            wall_s=max(r[2] for r in rows),
            steps=steps,
        )
        self.state, move = judge(self.state, m, self.config)
        if move is None:
            return None
        first = int(max(r[4] for r in rows))
        if move.shares != move.old_shares:
            self.sampler.schedule(first, move.shares)
        self.moves.append(move)
        gpus = [int(r[3]) if r[3] >= 0 else None for r in rows]
        self._report(move, first, gpus)
        return move

    def _all_gather(self, own: list[float]) -> list[float]:
        """Every rank's slots: each writes its own into zeros and the ranks sum (one all-reduce)."""
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        buf = torch.zeros(self.world * SLOTS, dtype=torch.float64)
        buf[self.rank * SLOTS : (self.rank + 1) * SLOTS] = torch.tensor(own, dtype=torch.float64)
        buf = buf.to(device)
        dist.all_reduce(buf)
        return [float(v) for v in buf.cpu().tolist()]

    def _report(self, move: Move, first: int, gpus: list[int | None]) -> None:
        if self.rank != 0:
            return
        gpu = gpus[move.rank] if move.rank is not None else None
        reason = move.describe(gpus)
        log.warning("balance: %s", reason)
        if self.run_dir is None:
            return
        record = {**move.to_dict(), "first_batch": first, "gpus": gpus, "gpu": gpu}
        finding = Finding(
            f"balance.{move.verb}",
            _SEVERITY[move.verb],
            Action.NONE,
            reason,
            gpu=gpu,
            time=time.time(),
            evidence=(json.dumps(record),),
        )
        rundir.append_finding(self.run_dir, self.rank, finding, move.step)


def _unannotated(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``hook`` with a signature DDP accepts: it compares the bucket's annotation to the class
    itself, and annotations in this module are strings (``from __future__ import annotations``)."""

    def plain(state: Any, bucket: Any) -> Any:
        return hook(state, bucket)

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("state", "bucket")]
    setattr(plain, "__signature__", inspect.Signature(params))  # noqa: B010 (mypy: no such attribute)
    return plain


def balancer_for(
    balance: bool | LadderConfig,
    every: int,
    state: Any,
    run_dir: Path | None,
    rank: int,
    world: int,
    progress: Callable[[], int],
) -> Balancer | None:
    """The Guard's balancer for ``GuardConfig.balance`` (None when off, or with one rank)."""
    if balance is False:
        return None
    ladder = None if balance is True else balance
    sampler = getattr(state, "sampler", None)
    balancer = Balancer(
        sampler,  # type: ignore[arg-type]  # Balancer says what it needs when it is not one
        ladder,
        every,
        run_dir=run_dir,
        rank=rank,
        world=world,
        gpu=gpu_from_env(),
        progress=progress,
    )
    return balancer if world > 1 else None


def _batch_len(args: tuple[Any, ...]) -> int:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() > 0:
            return int(a.shape[0])
    return 0


def gpu_from_env() -> int | None:
    """The physical GPU the supervisor gave this rank (``TRAINGUARD_GPU``), if it did."""
    named = os.environ.get("TRAINGUARD_GPU", "")
    return int(named) if named.isdigit() else None
