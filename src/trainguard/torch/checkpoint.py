"""``Checkpointer``: verified, asynchronous checkpoints and exact resume, inside the trainer.

    >>> ckpt = Checkpointer("/ckpt", keep_last=3, milestone_every=1000)      # doctest: +SKIP
    >>> state = TrainState(model, optimizer, scheduler, sampler=sampler)      # doctest: +SKIP
    >>> start = ckpt.resume(state)            # 0 on a fresh start
    >>> for step in range(start, total_steps):
    ...     train_one_step()
    ...     if (step + 1) % 100 == 0:
    ...         ckpt.save(step + 1, state)    # returns at once: see "overlap" below
    >>> ckpt.close()                          # waits until the last save is durable

Every checkpoint is signed and a resume loads only one signed with a key of the user's keyring,
with the loader its signed manifest names (``trainguard.checkpoint.signing``: the key comes from
a file or the environment, a per-user one made on the first save); ``encrypt=True`` also
encrypts replicated checkpoints at rest (``trainguard.checkpoint.sealing``).

``step`` is the number of completed optimizer steps; ``resume`` returns it. Replicated state (one
process or DDP) is written by rank 0 as ``step-N/state.pt`` (plain ``torch.load``-able) by a
background writer process; sharded state (FSDP2 / DTensor parameters) goes through
``torch.distributed.checkpoint`` from every rank (``trainguard.torch.sharded``). In a distributed
run ``save``, ``wait``, ``resume``, ``rollback`` and ``close`` are collective: call them on every
rank at the same step.

With ``overlap=True`` (the default) ``save`` copies to host memory at once only what the next
forward pass may change (buffers, RNG, small state); the parameters and the optimizer's state are
copied alongside the next forward and backward, and the optimizer's next ``step()`` waits for that
copy (a step pre-hook). Code that changes parameters in place outside ``optimizer.step()`` between
a save and the next step should call ``wait()`` first, or use ``overlap=False``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoint import Manifest, choose_resume, step_dir_name
from trainguard.checkpoint.signing import (
    Key,
    Keyring,
    Trust,
    allow_unsigned_from_env,
    encrypt_from_env,
    load_keyring,
)
from trainguard.errors import CheckpointError
from trainguard.torch import dist, loading, sharded
from trainguard.torch.async_writer import BackgroundWriter
from trainguard.torch.snapshot import Snapshot, optimizer_tensors
from trainguard.torch.staging import Staging, flatten
from trainguard.torch.state import TrainState
from trainguard.torch.writer import write_replicated

log = logging.getLogger(__name__)

PAYLOAD_FORMAT = 1


class Checkpointer:
    def __init__(
        self,
        directory: str | Path,
        keep_last: int = 3,
        milestone_every: int = 0,
        async_save: bool = True,
        weights_only: bool = True,  # torch.load safety; set False for exotic objects in `extra`
        overlap: bool = True,  # copy params/optimizer state alongside the next step (see snapshot)
        encrypt: bool | None = None,  # encrypt at rest; None: $TRAINGUARD_CHECKPOINT_ENCRYPT
        allow_unsigned: bool
        | None = None,  # resume from unsigned; None: $TRAINGUARD_CHECKPOINT_ALLOW_UNSIGNED
        keyring: Keyring | None = None,  # None: the environment's (see trainguard.checkpoint.signing)
    ) -> None:
        self.directory = Path(directory).absolute()  # the writer process must not depend on the cwd
        self.keep_last = keep_last
        self.milestone_every = milestone_every
        self.async_save = async_save
        self.weights_only = weights_only
        self.last_result: dict[str, Any] | None = None  # the writer's report of the last durable save
        self.overlap = overlap
        self.encrypt = encrypt_from_env() if encrypt is None else encrypt
        self.allow_unsigned = allow_unsigned
        self._keyring = keyring  # loaded on first use when None: only rank 0 signs
        self.last_stall_s: float | None = None  # time save() (and the optimizer's wait) blocked training
        self._latest: int | None = None
        self._writer = BackgroundWriter() if async_save else None
        self._staging: Staging | None = None
        self._staging_id = 0
        self._snapshot: tuple[Snapshot, dict[str, Any]] | None = None  # copying; then submitted
        self._handoff = threading.Lock()  # taking _snapshot and submitting it (copy thread or ours)
        self._hooks: dict[int, Any] = {}  # id(optimizer) -> its step pre-hook handle
        self._unsynced = False  # a save happened since the last collective wait
        self._pending: CheckpointError | None = None
        self._closed = False
        self._atexit = _weak_finalizer(self)
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ saving

    def save(self, step: int, state: TrainState) -> None:
        """Checkpoint ``state`` as of ``step`` completed steps. Asynchronous: returns once the
        state is in host memory; the previous save's error, if any, is raised here (on every
        rank: errors travel with the collective, so no rank is left waiting in one)."""
        if self._closed:
            raise CheckpointError("save() after close(): create a new Checkpointer")
        started = time.perf_counter()
        error = self._collect_error()
        rank, world = dist.rank_and_world()
        if sharded.is_sharded(state):
            if self.encrypt:
                raise CheckpointError(
                    "encryption at rest covers replicated checkpoints only: sharded (FSDP/DTensor) "
                    "state is written by torch.distributed.checkpoint, which trainguard does not "
                    "encrypt; use an encrypted filesystem for it, or Checkpointer(encrypt=False)"
                )
            _raise_any(dist.all_gather_object(error))
            self._latest = sharded.save(self, step, state)
            self.last_stall_s = time.perf_counter() - started
            return
        gathered = dist.all_gather_object((state.local_state_dict(), error))
        _raise_any([e for _, e in gathered])
        if rank == 0:
            payload = {
                "trainguard": {"format": PAYLOAD_FORMAT, "step": step, "world_size": world},
                **state.global_state_dict(),
                "local": [local for local, _ in gathered],
            }
            if self._writer is None:
                try:
                    self.last_result = write_replicated(
                        self.directory,
                        step,
                        payload,
                        world,
                        self.keep_last,
                        self.milestone_every,
                        key=self.signing_key(),
                        encrypt=self.encrypt,
                    )
                    self._latest = step
                except Exception as exc:
                    error = f"save of step {step} failed: {exc!r}"
            else:
                self._submit(step, payload, world, state.optimizer)
        if self._writer is None:
            # a synchronous save is durable for every rank when save() returns (or failed for all)
            _raise_any([dist.broadcast_object(error)])
            self._latest = step
        else:
            self._unsynced = True
        self.last_stall_s = time.perf_counter() - started

    def _submit(self, step: int, payload: dict[str, Any], world: int, optimizer: Any) -> None:
        assert self._writer is not None
        skeleton, tensors = flatten(payload)
        defer = optimizer_tensors(optimizer) if self.overlap and self._hook(optimizer) else set()
        if self._staging is None or not self._staging.matches(tensors):
            if self._staging is not None:
                self._staging.close()
            self._staging = Staging(tensors)
            self._staging_id += 1
        job = {
            "step": step,
            "directory": str(self.directory),
            "skeleton": pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL),
            "slots": [(s.offset, s.nbytes, s.dtype, s.shape) for s in self._staging.specs],
            "world_size": world,
            "keep_last": self.keep_last,
            "milestone_every": self.milestone_every,
            "key": self.signing_key().secret.hex(),
            "encrypt": self.encrypt,
        }
        # Started from this thread, never the copy thread: PR_SET_PDEATHSIG fires when the
        # thread that forked the writer ends.
        self._writer.start()
        with self._handoff:  # the copy thread's hand-off waits until the job is in place
            snapshot = self._staging.copy_from(tensors, defer, _weak_handoff(self))
            if snapshot is not None:  # sent by the copy thread when done, else by the next
                self._snapshot = (snapshot, job)  # optimizer.step() (or wait/save/close)
                return
        self._send(job)

    def _handoff_from_copy_thread(self, snapshot: Snapshot) -> None:
        """The snapshot's copy is done: submit its job now, from the copy thread."""
        with self._handoff:
            if self._snapshot is None or self._snapshot[0] is not snapshot:
                return  # already taken by the training thread
            if self._writer is None or not self._writer.alive:
                return  # restarting the writer is the training thread's job (see _submit)
            job, self._snapshot = self._snapshot[1], None
            try:
                self._send(job)
            except CheckpointError as exc:
                self._pending = exc

    def _send(self, job: dict[str, Any]) -> None:
        assert self._writer is not None and self._staging is not None
        self._writer.submit(job, self._staging_id, self._staging.fd, self._staging.size)

    def _hook(self, optimizer: Any) -> bool:
        """Make ``optimizer.step()`` wait for a pending snapshot; False if it cannot be hooked."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            return False
        if id(optimizer) not in self._hooks:
            ref = weakref.ref(self)  # the optimizer must not keep the Checkpointer alive

            def before_update(*_: object) -> None:
                ckpt = ref()
                if ckpt is not None and ckpt._snapshot is not None:
                    ckpt._protect()

            self._hooks[id(optimizer)] = optimizer.register_step_pre_hook(before_update)
        return True

    def _protect(self) -> None:
        """Before an optimizer update: the snapshot must have read the tensors it will change.
        A failed copy is kept for the next save/wait (raising here would kill the step)."""
        pending = self._snapshot
        if pending is None:  # the copy thread submitted it meanwhile
            return
        started = time.perf_counter()
        snapshot = pending[0]
        snapshot.protect()
        if snapshot.ready():
            self._release_keeping_error()
        self.last_stall_s = (self.last_stall_s or 0.0) + time.perf_counter() - started

    def _release(self) -> None:
        """Wait for the snapshot's copy, then hand the save to the writer (unless the copy
        thread did: then its submit is complete once the lock is ours)."""
        with self._handoff:
            if self._snapshot is None:
                return
            (snapshot, job), self._snapshot = self._snapshot, None
        try:
            snapshot.join()
        except Exception as exc:
            raise CheckpointError(
                f"save of step {job['step']} failed while copying the state to host memory: {exc!r}"
            ) from exc
        self._send(job)

    def _release_keeping_error(self) -> None:
        """``_release`` where raising is not an option (inside optimizer.step, a property): its
        error waits for the next save/wait."""
        try:
            self._release()
        except CheckpointError as exc:
            self._pending = exc

    def _collect(self) -> None:
        """Finish the in-flight save on this rank (blocking); raise its error."""
        self._release()  # also waits for a hand-off the copy thread has under way
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        if self._writer is None:
            return
        result = self._writer.wait()
        if result is not None:
            self.last_result = result
            self._latest = int(result["step"])
            if result.get("deleted"):
                log.debug("retention deleted checkpoints %s", result["deleted"])

    def _collect_error(self) -> str | None:
        try:
            self._collect()
        except CheckpointError as exc:
            return str(exc)
        return None

    def wait(self) -> None:
        """Block until the last save is durable (on rank 0) and every rank knows it; re-raise its
        error on every rank. Collective when distributed, but only synchronises after a save."""
        error = self._collect_error()
        if self._unsynced:
            self._unsynced = False
            status = dist.broadcast_object((error, self._latest))
            error = status[0]
            self._latest = status[1]
        _raise_any([error])

    @property
    def latest_step(self) -> int | None:
        """The newest step known durable to this process (saved or resumed), or None."""
        if self._snapshot is not None and self._snapshot[0].ready():
            self._release_keeping_error()
        if self._writer is not None and self._writer.in_flight is not None and self._writer.done():
            try:
                self._collect()
            except CheckpointError as exc:
                self._pending = exc
        return self._latest

    def close(self) -> None:
        """Wait for the in-flight save and stop the writer process. Collective when distributed."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._closed = True
        atexit.unregister(self._atexit)
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()
        with self._handoff:
            pending, self._snapshot = self._snapshot, None
        if pending is not None:  # only after an error: do not leave a copy into freed memory
            with contextlib.suppress(BaseException):
                pending[0].join()
        if self._writer is not None:
            self._writer.close()
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # do not mask the real error with a collective that may hang
            self._finish_locally()

    def _finish_locally(self) -> None:
        try:
            self._collect()
        except CheckpointError as exc:
            log.error("%s", exc)
        finally:
            if not self._closed:
                self._shutdown()

    # ------------------------------------------------------------------ loading

    def resume(self, state: TrainState) -> int:
        """Load the newest valid checkpoint into ``state``; the step to continue from (0: none).
        Invalid checkpoints are logged and skipped. Every rank loads the same one. A save still
        in flight is waited for first, so it is a candidate."""
        self.wait()
        rank, world = dist.rank_and_world()
        if rank == 0 and self._writer is not None and not sharded.is_sharded(state):
            # The writer imports torch (seconds): start it now, overlapping the trainer's own start-up,
            # not inside the first save, where the stall would look like a hang to the watchdog.
            self._writer.start()
        choice: tuple[int, Manifest] | None = None
        if rank == 0:
            choice = self._choose()
        choice = dist.broadcast_object(choice)
        if choice is None:
            return 0
        step, manifest = choice  # the loader is the one this verified, signed manifest names
        path = self.directory / step_dir_name(step)
        if rank != 0:
            loading.check_same(path, manifest, rank)
        if manifest.kind == "dcp":
            sharded.load(path, state, manifest, weights_only=self.weights_only)
        else:
            payload = loading.load_payload(path, manifest, self.weights_only, self._decryption_keys)
            state.load_global_state_dict(payload)
            local = payload.get("local") or []
            if local:
                if len(local) != world:
                    log.warning("checkpoint written by %d ranks, resuming with %d", len(local), world)
                state.load_local_state_dict(local[rank] if rank < len(local) else local[0])
        self._latest = step
        log.info("resumed from %s", path)
        return step

    def rollback(self, state: TrainState) -> int:
        """Wait for the in-flight save, then resume from the newest valid checkpoint."""
        self.wait()
        return self.resume(state)

    def _choose(self) -> tuple[int, Manifest] | None:
        """Rank 0: the newest checkpoint that verifies, with its manifest."""
        choice = choose_resume(self.directory, trust=self.trust())
        for step, reason in choice.skipped:
            log.warning("skipping invalid checkpoint %s: %s", self.directory / step_dir_name(step), reason)
        if choice.info is None or choice.manifest is None:
            return None
        return choice.info.step, choice.manifest

    # ------------------------------------------------------------------ keys

    def trust(self) -> Trust:
        """What a resume accepts: this Checkpointer's keyring, and unsigned checkpoints if allowed."""
        keyring = self._keyring if self._keyring is not None else load_keyring()
        allow = self.allow_unsigned if self.allow_unsigned is not None else allow_unsigned_from_env()
        return Trust(keyring, allow)

    def signing_key(self) -> Key:
        """The key saves are signed with (the default key file is made on the first save)."""
        if self._keyring is None:
            self._keyring = load_keyring(create=True)
        return self._keyring.signing

    def _decryption_keys(self) -> Keyring:
        return self._keyring if self._keyring is not None else load_keyring()


def _raise_any(errors: list[str | None]) -> None:
    messages = [e for e in errors if e]
    if messages:
        raise CheckpointError(messages[0])


def _weak_handoff(ckpt: Checkpointer) -> Callable[[Snapshot], None]:
    """The copy thread's hand-off, not keeping the Checkpointer alive."""
    ref = weakref.ref(ckpt)

    def handoff(snapshot: Snapshot) -> None:
        target = ref()
        if target is not None:
            target._handoff_from_copy_thread(snapshot)

    return handoff


def _weak_finalizer(ckpt: Checkpointer) -> Any:
    """An atexit hook that does not keep the Checkpointer alive: waits for the in-flight save
    (locally, no collectives: other ranks may be gone) and reports its error loudly."""
    ref = weakref.ref(ckpt)

    def finish() -> None:
        obj = ref()
        if obj is not None and not obj._closed:
            obj._finish_locally()

    return finish
