"""Torch side of numerics checks: fused gradient finiteness, NaN injection, the process group.

The decisions live in ``trainguard.detect.numerics`` (pure, torch-free); this module only turns
tensors into the flags those decisions need without a GPU->CPU sync: the gradient check is one
fused kernel that stays on the device. Reading the flags and the loss, and agreeing on them
across ranks, is ``trainguard.torch.agreement``'s job (batched, and one step late on a GPU).
"""

from __future__ import annotations

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
