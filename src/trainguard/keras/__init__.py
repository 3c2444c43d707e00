"""Trainer-side trainguard for Keras 3 on TensorFlow: runs inside the user's process (imports Keras).

    >>> from trainguard.keras import Guard  # doctest: +SKIP
    >>> guard = Guard("ckpt/", checkpoint_every=50)  # doctest: +SKIP
    >>> guard.resume(model)  # doctest: +SKIP
    >>> data = shuffled_batches((x, y), batch_size=64, start=guard.position)  # doctest: +SKIP
    >>> model.fit(data, epochs=5, steps_per_epoch=100, callbacks=[guard])  # doctest: +SKIP

See docs/tensorflow.md.
"""

from __future__ import annotations

try:
    import keras as _keras  # noqa: F401
except ImportError:
    raise ImportError("trainguard.keras needs Keras 3 and TensorFlow: pip install 'trainguard[tf]'") from None

from trainguard.keras.checkpoint import Checkpointer, Progress
from trainguard.keras.data import shuffled_batches
from trainguard.keras.guard import Guard, batch_loss
from trainguard.keras.state import StateMismatch

__all__ = ["Checkpointer", "Guard", "Progress", "StateMismatch", "batch_loss", "shuffled_batches"]
