"""Host-memory staging for asynchronous saves: the state's tensors, copied at a step boundary into
one shared-memory buffer that the background writer process maps too.

The nested state (dicts, lists, tuples, numbers, tensors) is split into a small *skeleton*, where
every tensor is replaced by a ``Slot`` index, and a flat list of tensors. The buffer is allocated
once (``memfd``, pinned with ``cudaHostRegister`` when CUDA is present) and reused while the
tensors keep their shapes and dtypes; the per-save work on the training thread is a grouped
``torch._foreach_copy_`` of what the next forward pass may change plus pickling the skeleton. The
optimizer-owned tensors are copied alongside the next step (``trainguard.torch.snapshot``).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

import torch

from trainguard.torch.snapshot import Pairs, Snapshot, by_device, copy_pairs

log = logging.getLogger(__name__)

ALIGN = 64  # bytes; matches torch.save's storage alignment


@dataclass(frozen=True, slots=True)
class Slot:
    """Placeholder for the i-th staged tensor inside a skeleton."""

    index: int


@dataclass(frozen=True, slots=True)
class SlotSpec:
    offset: int
    nbytes: int
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]


def flatten(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, tensors): tensors replaced by Slots, shared tensors staged once."""
    tensors: list[torch.Tensor] = []
    seen: dict[tuple[Any, ...], int] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = None
            if value.numel() and value.layout == torch.strided:
                key = (value.data_ptr(), value.dtype, tuple(value.shape), value.stride(), value.device)
                if key in seen:
                    return Slot(seen[key])
            tensors.append(value)
            if key is not None:
                seen[key] = len(tensors) - 1
            return Slot(len(tensors) - 1)
        if isinstance(value, dict):
            out = type(value)() if isinstance(value, OrderedDict) else {}
            for k, v in value.items():
                out[k] = walk(v)
            metadata = getattr(value, "_metadata", None)
            if metadata is not None:
                out._metadata = metadata  # type: ignore[attr-defined]  # module versions for load_state_dict
            return out
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(walk(v) for v in value)
        return value

    return walk(obj), tensors


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of ``flatten``."""
    if isinstance(skeleton, Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        out = type(skeleton)() if isinstance(skeleton, OrderedDict) else {}
        for k, v in skeleton.items():
            out[k] = unflatten(v, tensors)
        metadata = getattr(skeleton, "_metadata", None)
        if metadata is not None:
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    if isinstance(skeleton, tuple) and not hasattr(skeleton, "_fields"):
        return tuple(unflatten(v, tensors) for v in skeleton)
    return skeleton


def layout(tensors: list[torch.Tensor]) -> tuple[list[SlotSpec], int]:
    """Aligned offsets for each tensor in one buffer, and the buffer size."""
    specs, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        specs.append(SlotSpec(offset, nbytes, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        offset += -(-nbytes // ALIGN) * ALIGN
    return specs, max(offset, ALIGN)


def slot_views(buffer: memoryview, specs: list[SlotSpec]) -> list[torch.Tensor]:
    """One tensor per slot over ``buffer``, each with its own storage (so torch.save writes each
    slot alone, not the whole buffer)."""
    views = []
    for spec in specs:
        dtype = getattr(torch, spec.dtype)
        if spec.nbytes == 0:
            views.append(torch.empty(spec.shape, dtype=dtype))
            continue
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=spec.nbytes, offset=spec.offset)
        views.append(raw.view(dtype).view(spec.shape))
    return views


class Staging:
    """The shared-memory buffer and its per-tensor views, re-allocated when shapes change."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.specs, self.size = layout(tensors)
        self.signature = [(t.dtype, tuple(t.shape)) for t in tensors]
        self.fd = _shared_fd(self.size)
        self._mmap = mmap.mmap(self.fd, self.size)
        self._view = memoryview(self._mmap)
        self.views = slot_views(self._view, self.specs)
        self._pinned = _pin(self._view, self.size)
        self.touch()

    def matches(self, tensors: list[torch.Tensor]) -> bool:
        if len(tensors) != len(self.signature):
            return False
        return all(
            t.dtype == d and tuple(t.shape) == s for t, (d, s) in zip(tensors, self.signature, strict=True)
        )

    def touch(self) -> None:
        """Fault every page in now, so the first save's stall is not a page-fault storm."""
        for start in range(0, self.size, 1 << 26):
            end = min(self.size, start + (1 << 26))
            self._view[start:end] = bytes(end - start)

    def copy_from(
        self,
        tensors: list[torch.Tensor],
        defer: Set[int] = frozenset(),
        on_copied: Callable[[Snapshot], None] | None = None,
    ) -> Snapshot | None:
        """The stall of an asynchronous save: grouped copies into the staging views. Tensors
        whose storage address is in ``defer`` are copied by the returned ``Snapshot`` instead,
        alongside the next training step (see ``trainguard.torch.snapshot``), which calls
        ``on_copied`` from its copy thread once the staging buffer holds them."""
        now: Pairs = []
        later: Pairs = []
        for dst, src in zip(self.views, tensors, strict=True):
            if src.numel():
                (later if defer and src.data_ptr() in defer else now).append((dst, src))
        host, device = by_device(now)
        copy_pairs(host)
        if device:
            copy_pairs(device, non_blocking=self._pinned)
            torch.cuda.synchronize()
        return Snapshot(later, self._pinned, on_copied) if later else None

    def close(self) -> None:
        if self._pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(_address(self._view))
        self.views = []
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        # The mmap is released when the last view is garbage-collected.


def _shared_fd(size: int) -> int:
    """An anonymous shared-memory file: memfd on Linux (nothing to leak on a crash), else an
    unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("trainguard-staging", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        fd, name = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(name)
    os.ftruncate(fd, size)
    return fd


def _address(view: memoryview) -> int:
    return torch.frombuffer(view, dtype=torch.uint8, count=1).data_ptr()


def _pin(view: memoryview, size: int) -> bool:
    """Page-lock the buffer for fast asynchronous device-to-host copies (CUDA only)."""
    if not torch.cuda.is_available():
        return False
    try:
        code = torch.cuda.cudart().cudaHostRegister(_address(view), size, 0)
    except Exception as exc:  # pinning is an optimisation only
        log.warning("could not pin the checkpoint staging buffer (%s); copies will be synchronous", exc)
        return False
    return int(code) == 0
