"""The Guard for Keras 2 (``tf_keras``, what ``TF_USE_LEGACY_KERAS=1`` selects), whose ``fit``
runs ``MultiWorkerMirroredStrategy`` across workers (Keras 3's cannot: keras-team/keras#20585).

    from trainguard.keras.legacy import Guard
    guard = Guard("ckpt/", checkpoint_every=50)
    guard.resume(model)
    data = shuffled_batches((x, y), global_batch, start=guard.position)
    model.fit(data, epochs=E, steps_per_epoch=S, callbacks=[guard])

The same Guard as `trainguard.keras.Guard` (`GuardLogic`), on tf_keras's Callback. Keras 2's
``fit`` starts mid-epoch, as its BackupAndRestore makes it: a resumed run keeps its epochs. Every
worker runs one; rank 0 (TF_CONFIG's first worker) writes the checkpoints, every rank its
heartbeats. Keras 2's dropout draws from TensorFlow's stateful generators: a resume is exact up
to those draws (use Keras 3 where bitwise resumes matter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import tf_keras
except ImportError:
    raise ImportError("trainguard.keras.legacy needs tf_keras: pip install tf-keras") from None

from trainguard.keras.guard import GuardLogic

__all__ = ["Guard"]


class _StartAt:
    """What tf_keras's ``fit`` asks where to start (``model._training_state``, the seam its
    BackupAndRestore uses for a worker that restarts)."""

    def __init__(self, epoch: int, step: int) -> None:
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(
        self, steps_per_epoch: int, initial_epoch: int, mode: Any
    ) -> tuple[int, int]:
        return self.epoch, self.step


class Guard(GuardLogic, tf_keras.callbacks.Callback):
    """`trainguard.keras.Guard` for a tf_keras model (see the module docstring)."""

    def __init__(self, directory: str | Path, **settings: Any) -> None:
        tf_keras.callbacks.Callback.__init__(self)
        GuardLogic.__init__(self, directory, **settings)

    def _start_at(self, position: int, steps_per_epoch: int) -> None:
        self.model._training_state = _StartAt(position // steps_per_epoch, position % steps_per_epoch)

    def _fit_ended(self) -> None:
        self.model._training_state = None
