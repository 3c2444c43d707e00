"""Torch side of numerics checks: fused gradient finiteness and one cheap cross-rank agreement.

The decisions live in ``trainguard.detect.numerics`` (pure, torch-free); this module only turns
tensors into the few floats those decisions need, with as few GPU->CPU syncs as possible: the
gradient check is one fused ``torch._foreach_norm`` plus ``isfinite`` that stays on the device,
and the loss, the gradient flag and the preemption flag travel together in one small tensor, one
``all_reduce`` (when distributed) and one ``tolist()`` per step.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
import torch.distributed as dist

NAN = float("nan")


def nonfinite_grads(params: Iterable[torch.nn.Parameter]) -> torch.Tensor | None:
    """A 0-d float tensor, 1.0 when any gradient holds NaN/Inf (no sync); None without grads.

    One fused kernel per (device, dtype): the found-inf check GradScaler uses, with a scale of
    exactly 1.0 (multiplying by 1.0 changes no float, NaN and -0.0 included). Where that op is
    unavailable, the norm of each gradient is finite exactly when all its elements are.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse:
            g = g.coalesce()._values()
        groups.setdefault((g.device, g.dtype), []).append(g)
    if not groups:
        return None
    flags = []
    for (device, _), grads in groups.items():
        found = torch.zeros(1, device=device)
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.ones(1, device=device))
        except (AttributeError, RuntimeError, NotImplementedError):
            norms = torch.stack([n.float() for n in torch._foreach_norm(grads)])
            found = (~torch.isfinite(norms)).any().float().reshape(1)
        flags.append(found)
    if len(flags) == 1:
        return flags[0].reshape(())
    return torch.stack([f.to(flags[0].device).reshape(()) for f in flags]).amax()


def poison(loss: torch.Tensor) -> torch.Tensor:
    """The loss times NaN: still attached to the graph, so backward spreads NaN like a real fault."""
    return loss * NAN


def distributed_world() -> tuple[int, int] | None:
    """(rank, world size) of the default process group, or None when it is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def gather_step(
    loss: object, grad_flag: torch.Tensor | None, preempt: bool, world: int
) -> tuple[float | None, bool, bool, float | None]:
    """(loss, grads non-finite, preemption requested, wait) agreed across ranks.

    With several ranks the loss is the mean over ranks (a NaN anywhere makes it NaN everywhere)
    and the flags are "any rank": every rank then takes the same decision at the same step.
    ``wait`` is how long the all-reduce (and the sync after it) took here: the ranks that waited
    for a straggler wait long, the straggler itself hardly at all. None without peers.
    """
    if world <= 1 and (grad_flag is None or grad_flag.device.type == "cpu"):
        # No peers to agree with, and nothing to batch into one device sync: plain item() calls.
        bad = grad_flag is not None and grad_flag.item() > 0
        if isinstance(loss, torch.Tensor):
            return float((loss if loss.numel() == 1 else loss.reshape(-1)[0]).item()), bad, preempt, None
        return _as_float(loss), bad, preempt, None
    device = _device(loss, grad_flag, world)
    if isinstance(loss, torch.Tensor):
        loss_t = loss.detach().reshape(-1)[0].to(device=device, dtype=torch.float32)
        has_loss = 1.0
    else:
        value = _as_float(loss)
        loss_t = torch.tensor(0.0 if value is None else value, device=device)
        has_loss = 0.0 if value is None else 1.0
    grad_t = grad_flag.to(device) if grad_flag is not None else torch.zeros((), device=device)
    extra = torch.tensor([has_loss, 1.0 if preempt else 0.0], device=device)
    packed = torch.cat([loss_t.reshape(1), grad_t.reshape(1).float(), extra])
    wait = None
    if world > 1:
        started = time.perf_counter()
        dist.all_reduce(packed)
        total, grads_bad, n_loss, n_preempt = packed.tolist()
        wait = time.perf_counter() - started
    else:
        total, grads_bad, n_loss, n_preempt = packed.tolist()
    mean = total / n_loss if n_loss > 0 else None
    return mean, grads_bad > 0, n_preempt > 0, wait


def _device(loss: object, grad_flag: torch.Tensor | None, world: int) -> torch.device:
    if world > 1 and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(loss, torch.Tensor):
        return loss.device
    return grad_flag.device if grad_flag is not None else torch.device("cpu")


def _as_float(loss: object) -> float | None:
    try:
        return float(loss)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
