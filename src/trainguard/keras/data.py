"""A data stream whose order is a pure function of the batch index, so a resume can start it anywhere.

tf.data's ``shuffle`` draws each epoch's order from a generator that every iterator of the
dataset advances: a second iterator (``model.fit`` under a distribution strategy opens one to
build the model), or one that skipped ahead, sees later epochs in another order. A resumed run
then trains on other batches than the uninterrupted one. `shuffled_batches` shuffles each epoch
with a stateless permutation of ``(seed, epoch)`` (TensorFlow's ``index_shuffle``), so batch
``i`` is the same batch in every process, iterator and resume::

    >>> data = shuffled_batches((x, y), batch_size=64, seed=0, start=guard.position)  # doctest: +SKIP
    >>> model.fit(data, epochs=5, steps_per_epoch=100, callbacks=[guard])           # doctest: +SKIP

Endless; every batch is full (an epoch is ``len(x) // batch_size`` batches: the rest of the
shuffled samples waits for a later epoch's order). For in-memory arrays; a file pipeline whose
order does not depend on its iterators (no per-iteration reshuffle) resumes with
``Guard.resume(model, data)``, which skips the trained batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

__all__ = ["shuffled_batches"]


def shuffled_batches(
    arrays: Sequence[Any], batch_size: int, seed: int = 0, start: int = 0
) -> tf.data.Dataset:
    """Batches ``start, start + 1, ...`` of ``arrays`` (equal first dimensions), each epoch in
    the order ``(seed, epoch)`` gives; elements are tuples in the order of ``arrays``."""
    tensors = tuple(tf.convert_to_tensor(a) for a in arrays)
    n = int(tensors[0].shape[0])
    if any(int(t.shape[0]) != n for t in tensors):
        raise ValueError(
            f"shuffled_batches: arrays of {[int(t.shape[0]) for t in tensors]} rows; give equal ones"
        )
    if not 0 < batch_size <= n:
        raise ValueError(f"shuffled_batches: batch_size {batch_size} must be between 1 and the {n} rows")
    per_epoch = n // batch_size

    def batch(i: tf.Tensor) -> tuple[tf.Tensor, ...]:
        epoch, j = i // per_epoch, i % per_epoch
        slots = tf.range(j * batch_size, (j + 1) * batch_size, dtype=tf.int64)
        rows = tf.random.experimental.index_shuffle(
            slots, tf.stack([tf.constant(seed, tf.int64), epoch]), n - 1
        )
        return tuple(tf.gather(t, rows) for t in tensors)

    stream = tf.data.Dataset.range(start, 1 << 62).map(
        batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    return stream.prefetch(tf.data.AUTOTUNE)
