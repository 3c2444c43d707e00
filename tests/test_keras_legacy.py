"""The Keras 2 Guard (`trainguard.keras.legacy`, on tf_keras) resumes a model whose optimizer was
never built: tf_keras creates its optimizer's slots at the first step, so a fresh model before
``fit`` has fewer variables than its checkpoint (one process, real tf_keras 2.21)."""

from __future__ import annotations

import os

from real_parts import require_module

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
require_module("tensorflow", install="make install (tensorflow-cpu 2.21)")
tf_keras = require_module("tf_keras", install="make install (tf-keras 2.21: multi-worker model.fit)")

import numpy as np  # noqa: E402

from trainguard.keras import shuffled_batches  # noqa: E402
from trainguard.keras.legacy import Guard  # noqa: E402

X = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
Y = (X[:, 0] > 0).astype("int64")


def model() -> tf_keras.Model:
    m = tf_keras.Sequential(
        [tf_keras.layers.InputLayer(input_shape=(8,)), tf_keras.layers.Dense(4), tf_keras.layers.Dense(2)]
    )
    m.compile(
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf_keras.optimizers.SGD(learning_rate=0.05),  # a slot per variable, made at step 1
    )
    return m


def test_a_fresh_tf_keras_model_resumes_from_its_checkpoint(tmp_path):
    trained, guard = model(), Guard(tmp_path, checkpoint_every=5, run_dir=None)
    guard.resume(trained)
    data = shuffled_batches((X, Y), 16, seed=0, start=guard.position)
    trained.fit(data, epochs=1, steps_per_epoch=10, callbacks=[guard], verbose=0)

    fresh, again = model(), Guard(tmp_path, checkpoint_every=5, run_dir=None)
    assert again.resume(fresh) == 10 and again.position == 10
    saved = [v.numpy() for v in trained.variables + trained.optimizer.variables]
    restored = [v.numpy() for v in fresh.variables + fresh.optimizer.variables]
    assert len(restored) == len(saved) and all(
        np.array_equal(a, b) for a, b in zip(saved, restored, strict=True)
    )
