"""Small torch.distributed helpers that degrade to no-ops in a single process."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    if active():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not active() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    if not active() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if active() and dist.get_world_size() > 1:
        dist.barrier()
