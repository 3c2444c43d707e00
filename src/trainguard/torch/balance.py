"""The trainer's half of load balancing: measure each rank's own compute, agree, move the shares.

Part of the Guard (``Guard(..., balance=True)``, docs/balance.md). Each rank measures its own
compute per sample: from the first forward of a step (a forward pre-hook on the model) to the
moment its backward finished (a hook on the gradient of the parameter whose gradient comes last,
learnt on the first step: DDP waits for the other ranks' gradients only after it). Waiting for
slower ranks is not in it, so a fast rank measures its own speed, not the straggler's.
It is device time: on a GPU both ends are CUDA events, read at the next agreement; on the CPU the
CPU time of the thread that computes (a host busy with other processes does not make one rank
look slower than another), plus what a simulated GPU's slowdown added (``torch.sim_gpu``).

Every ``every`` steps, at ``guard.step``, the ranks agree: one asynchronous all-reduce of every
rank's compute seconds, samples, window time, GPU and how far its sampler has handed out batches,
read at the next ``guard.step`` (done by then: no rank waits for it). Every rank then runs the
same ladder (``trainguard.balance.ladder``) on the same numbers, so every rank takes the same
move, and new shares start at the same global batch: the first one no rank can have handed out. Rank 0 writes each move to the run directory as a finding (``balance.rebalance``,
``balance.restore``, ``balance.exclude``) with its evidence; the supervisor records it as an
incident, and excludes the GPU when the move says so.
"""

from __future__ import annotations

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
from trainguard.actions import Advice
from trainguard.balance.ladder import LadderConfig, LadderState, Measure, Move, judge
from trainguard.errors import ConfigError
from trainguard.records import Finding, Health
from trainguard.torch.shares import ShareSampler
from trainguard.torch.state import unwrap_model

log = logging.getLogger(__name__)

__all__ = ["Balancer"]

# per rank in the agreement: compute seconds, samples, window seconds, GPU, the next batch its
# sampler hands out, and how many batches its loader holds ahead of training
SLOTS = 6
_SEVERITY = {"rebalance": Health.DEGRADED, "restore": Health.OK, "exclude": Health.DEGRADED}


class Balancer:
    """Moves ``sampler``'s shares by measured speed. The Guard builds one with ``balance=True``.

    ``progress`` counts the steps recorded (the Guard's ``guard.step`` calls): the first forward
    after a new count starts a step. A step's compute ends with the gradient that comes last (a
    step that computed none ends where the next begins, or at the agreement). ``device_clock``
    times it on the CPU (the thread's CPU time; the Guard adds a simulated GPU's slowdown).
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
            raise ConfigError(f"balance_every={every}: agree every 2 steps or more")
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
        self._ended: Any = None  # when its backward finished (the last parameter's gradient)
        self._grad_hooks: list[Any] = []  # one per parameter until the last one is known, then that one
        self._last_param: int | None = None  # the parameter whose gradient came last (this step)
        self._step_samples = 0
        self._pending: list[tuple[Any, Any, int]] = []  # closed steps: (start, end, samples)
        self._window_start = clock()
        self._inflight: tuple[int, int, _Gather] | None = None  # (step, steps, the agreement) in flight
        self._settled: _Gather | None = None  # the last one read, held until the next (see close)
        self.next_step = every - 1  # guard.step of this step launches the agreement, the next reads it

    # -- measuring --------------------------------------------------------------------------------
    def attach(self, model: torch.nn.Module) -> None:
        """Time ``model``'s steps: a forward pre-hook on the module (DDP's inner one) and, on its
        parameters, a hook when a gradient is accumulated; once the first step showed which
        gradient comes last, only that one's hook stays (one Python call per step)."""
        inner = unwrap_model(model)
        self._hooks.append(inner.register_forward_pre_hook(self._on_forward))
        params = [p for p in inner.parameters() if p.requires_grad]
        self._grad_hooks = [
            p.register_post_accumulate_grad_hook(self._grad_hook(i)) for i, p in enumerate(params)
        ]
        if self.rank == 0 and self.run_dir is not None:  # the supervisor leaves slow GPUs to us first
            c = self.config
            why = (
                f"balancing {self.world} ranks: shares of the global batch of {self.sampler.global_batch} "
                f"follow measured speed (agreed every {self.every} steps; rebalance above {c.threshold:.0%} "
                f"idle for {c.persist} agreements, restore below {c.restore:.0%})"
            )
            on = Finding("balance.on", Health.OK, Advice.NONE, why, gpu=self.gpu, time=time.time())
            rundir.append_finding(self.run_dir, self.rank, on, None)

    def close(self) -> None:
        """Remove the hooks; an agreement in flight is waited for (every rank launched it) and
        its handle kept: gloo's thread must drop its own reference first (see agreement.settle)."""
        for handle in (*self._hooks, *self._grad_hooks):
            handle.remove()
        self._hooks, self._grad_hooks = [], []
        if self._inflight is not None:
            self._settled = self._inflight[2]
            self._settled.rows()
            self._inflight = None
        if self._settled is not None:
            time.sleep(0.01)  # lets gloo's thread, woken with us, drop its references first
            self._settled = None

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

    def _grad_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            self._ended, self._last_param = self._now(), index

        return hook

    def _keep_last_hook(self) -> None:
        """After a step that saw every gradient: keep only the hook of the one that came last."""
        if self._last_param is None or len(self._grad_hooks) <= 1:
            return
        for i, handle in enumerate(self._grad_hooks):
            if i != self._last_param:
                handle.remove()
        self._grad_hooks = [self._grad_hooks[self._last_param]]

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
        self._keep_last_hook()

    def _window(self) -> tuple[float, int, int]:
        """(compute seconds, samples, steps) of the steps closed since the last agreement whose
        compute the device has finished (on a GPU a step still running waits for the next one)."""
        seconds, samples, done = 0.0, 0, 0
        for start, end, n in self._pending:
            if isinstance(start, float):
                seconds += max(0.0, end - start)
            elif end.query():
                seconds += start.elapsed_time(end) / 1000.0
            else:
                break
            samples += n
            done += 1
        self._pending = self._pending[done:]
        return seconds, samples, done

    # -- agreeing ---------------------------------------------------------------------------------
    def boundary(self, step: int) -> Move | None:
        """At ``guard.step(step)`` on every rank (a collective): launch the agreement on the window
        that ends here; at the next step, read it (long finished by then: nothing waits), judge
        and move. Returns the move, if one was made."""
        if self._inflight is None:
            self._launch(step)
            return None
        launched, steps, gather = self._inflight
        self._inflight, self._settled = None, gather
        self.next_step = launched + self.every
        rows = gather.rows()
        if step != launched + 1:  # a rollback replays steps: the numbers are stale, every rank drops them
            return None
        return self._judge(launched, steps, rows)

    def _launch(self, step: int) -> None:
        self._close()
        seconds, samples, steps = self._window()
        now = self._clock()
        wall, self._window_start = now - self._window_start, now
        gpu = float(self.gpu if self.gpu is not None else -1)
        ahead = float(self.sampler.produced - self.sampler.position)  # batches a prefetching loader holds
        own = [seconds, float(samples), wall, gpu, float(self.sampler.produced), ahead]
        self._inflight = (step, steps, _Gather(own, self.rank, self.world))
        self.next_step = step + 1

    def _judge(self, step: int, steps: int, rows: list[list[float]]) -> Move | None:
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
        # The first global batch no rank can have handed out yet: a step has passed since the
        # numbers were taken, in which a rank hands out one batch, or, at an epoch's start, one
        # more than its loader holds ahead.
        first = int(max(r[4] for r in rows) + max(r[5] for r in rows) + 1)
        if move.shares != move.old_shares:
            self.sampler.schedule(first, move.shares)
        self.moves.append(move)
        gpus = [int(r[3]) if r[3] >= 0 else None for r in rows]
        self._report(move, first, gpus)
        return move

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
            Advice.NONE,
            reason,
            gpu=gpu,
            time=time.time(),
            evidence=(json.dumps(record),),
        )
        rundir.append_finding(self.run_dir, self.rank, finding, move.step)


class _Gather:
    """Every rank's slots, asynchronously: each writes its own into zeros and the ranks sum them
    (one all-reduce). On a GPU the sum is copied to pinned host memory behind the collective;
    `rows` reads it a step later, when the device has long finished it."""

    def __init__(self, own: list[float], rank: int, world: int) -> None:
        self.world = world
        buf = torch.zeros(world * SLOTS, dtype=torch.float64)
        buf[rank * SLOTS : (rank + 1) * SLOTS] = torch.tensor(own, dtype=torch.float64)
        self.event: Any = None
        if dist.get_backend() == "nccl":
            buf = buf.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(buf, async_op=True).wait()  # the stream waits for it, not the CPU
            host = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=True)
            self.buf = host.copy_(buf, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            self.work: Any = None
        else:
            self.buf = buf
            self.work = dist.all_reduce(buf, async_op=True)

    def rows(self) -> list[list[float]]:
        if self.work is not None:
            self.work.wait()
        if self.event is not None:
            self.event.synchronize()
        values = [float(v) for v in self.buf.tolist()]
        return [values[r * SLOTS : (r + 1) * SLOTS] for r in range(self.world)]


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
