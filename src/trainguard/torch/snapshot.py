"""Overlapped snapshots: the stall of an asynchronous save, hidden behind the next step.

A copying snapshot cannot be faster than one copy of the state (``Staging.copy_from``), and on a
large model that copy is most of the training stall. But most of the state (the parameters and
the optimizer's moments) only changes inside ``optimizer.step()``: between a save at a step
boundary and the next ``optimizer.step()`` there is a whole forward and backward pass in which
those tensors are read, never written. So ``Checkpointer.save`` copies the rest (buffers, which a
forward pass may update, RNG states, user objects) at once, and starts the copy of the
optimizer-owned tensors here, while training goes on::

    save()  -> copy buffers & small state now -> Snapshot(params, moments) starts copying
    forward / backward                          (the copy runs alongside, without the GIL)
    optimizer.step() -> pre-hook: Snapshot.protect() waits for the copy, then the update runs

On CPU the copy runs in a thread (``torch._foreach_copy_`` releases the GIL); on CUDA it is
queued on a side stream and ``protect`` only orders the optimizer's stream after it, so the host
never waits. ``join`` is the blocking end used by ``wait``/``resume``/``close``.

The contract is that nothing but the optimizer changes those tensors in between. Code that does
(an in-place ``p.data.mul_()`` after a save) would get a torn snapshot, so the tensors' autograd
version counters, which every in-place op bumps, are compared with their values at the save:
a change makes the save fail loudly (``CheckpointError`` at the next save/wait) instead of
writing a checkpoint that mixes two steps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

Pairs = list[tuple[torch.Tensor, torch.Tensor]]  # (staging view, live tensor)


def by_device(pairs: Pairs) -> tuple[Pairs, Pairs]:
    """(host, device) pairs, by where the live tensor is: the two are copied differently."""
    host = [(d, s) for d, s in pairs if s.device.type == "cpu"]
    device = [(d, s) for d, s in pairs if s.device.type != "cpu"]
    return host, device


def copy_pairs(pairs: Pairs, non_blocking: bool = False) -> None:
    """One grouped ``_foreach_copy_`` into staging views (the sources on one kind of device)."""
    if not pairs:
        return
    with torch.no_grad():
        dst, src = [d for d, _ in pairs], [s for _, s in pairs]
        torch._foreach_copy_(dst, src, non_blocking=non_blocking)


class Snapshot:
    """The deferred copy of one save, in flight until ``join``. Not re-entrant."""

    def __init__(
        self, pairs: Pairs, pinned: bool, on_copied: Callable[[Snapshot], None] | None = None
    ) -> None:
        self.error: BaseException | None = None
        self._on_copied = on_copied  # CPU only: called by the copy thread after a clean copy
        self._versions = [(src, src._version) for _, src in pairs]  # see "The contract" above
        self._checked = False
        self._copied = threading.Event()
        self._event: Any = None  # CUDA: recorded on the side stream after the copy
        self._thread: threading.Thread | None = None
        cpu, device = by_device(pairs)
        if device:
            self._queue_device_copy(device, pinned)
        if cpu:
            self._thread = threading.Thread(
                target=self._copy, args=(cpu,), name="trainguard-snapshot", daemon=True
            )
            self._thread.start()
        else:
            self._copied.set()

    def _queue_device_copy(self, pairs: Pairs, pinned: bool) -> None:
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)  # the copy sees every update queued before the save
        with torch.cuda.stream(side):
            copy_pairs(pairs, non_blocking=pinned)
            self._event = torch.cuda.Event()
            self._event.record(side)
        for _, src in pairs:  # the caching allocator must not reuse them while the copy reads
            src.record_stream(side)

    def _copy(self, pairs: Pairs) -> None:
        try:
            copy_pairs(pairs)
            if self._event is None:
                # Checked once the copy has read everything: an in-place change after this
                # point cannot tear the snapshot, one before it shows in the version counters.
                self._check_untouched()
        except BaseException as exc:  # surfaced by join(), on the training thread
            self.error = exc
        finally:
            self._copied.set()
        if self.error is None and self._on_copied is not None:
            # hand the save to the writer now rather than at the next optimizer.step(): under
            # back-pressure the write would otherwise start a forward and backward pass late
            self._on_copied(self)

    def protect(self) -> None:
        """Before the live tensors change: the copy must have read them (CPU: wait for it;
        CUDA: the current stream waits for the copy, the host does not)."""
        self._copied.wait()
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)
        self._check_untouched()  # before the optimizer's own in-place update

    def _check_untouched(self) -> None:
        if self._checked:
            return
        self._checked = True
        changed = sum(src._version != version for src, version in self._versions)
        if changed and self.error is None:
            self.error = RuntimeError(
                f"{changed} parameter/optimizer tensor(s) were changed in place outside optimizer.step() "
                "while the overlapped snapshot copied them; call Checkpointer.wait() before such changes, "
                "or use Checkpointer(overlap=False)"
            )

    def ready(self) -> bool:
        """The staging buffer holds the whole snapshot (never blocks)."""
        return self._copied.is_set() and (self._event is None or bool(self._event.query()))

    def join(self) -> None:
        """Block until the staging buffer holds the snapshot; raise the copy's error."""
        self._copied.wait()
        if self._thread is not None:
            self._thread.join()
        if self._event is not None:
            self._event.synchronize()
        self._check_untouched()
        if self.error is not None:
            raise self.error


def optimizer_tensors(optimizer: Any) -> set[int]:
    """Storage addresses of the tensors only ``optimizer.step()`` writes: its parameters and
    its per-parameter state (a copy of these may overlap the next forward and backward)."""
    owned: set[int] = set()
    for group in getattr(optimizer, "param_groups", ()):
        owned.update(p.data_ptr() for p in group["params"] if p.numel())
    for per_param in getattr(optimizer, "state", {}).values():
        if isinstance(per_param, dict):
            owned.update(
                t.data_ptr() for t in per_param.values() if isinstance(t, torch.Tensor) and t.numel()
            )
    return owned
