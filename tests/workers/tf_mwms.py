"""A multi-worker Keras job as TensorFlow's own tutorial writes it, knowing nothing of trainguard.

    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 0}}' \
        python tf_mwms.py --backup-dir /tmp/backup

Shaped like "Multi-worker training with Keras" (tensorflow.org/tutorials/distribute/
multi_worker_with_keras): the cluster comes from TF_CONFIG, ``tf.distribute.MultiWorkerMirroredStrategy``,
a model built and compiled in its scope, ``model.fit`` on a global batch, and (``--backup-dir``)
``BackupAndRestore`` to resume after a restart someone else performs. The data are scikit-learn's
digits (no download). Keras 2 (``tf_keras``, what ``TF_USE_LEGACY_KERAS=1`` selects): Keras 3's
``fit`` cannot run this strategy across workers (keras-team/keras#20585). ``--collective-timeout``
is TF's own bound on a collective that waits for a worker that never comes.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def digits_dataset(global_batch_size: int) -> tf.data.Dataset:
    x, y = load_digits(return_X_y=True)
    x, y = (x / np.float32(16)).astype("float32"), y.astype(np.int64)
    return (
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(global_batch_size)
    )


def build_and_compile_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(64,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=["accuracy"],
    )
    return model


class Progress(tf.keras.callbacks.Callback):
    """Prints where training starts and ends (the optimizer's step count), and paces the steps."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s, self.started = step_s, False

    def on_train_batch_begin(self, batch, logs=None):
        if not self.started:
            self.started = True
            print(f"start step {int(self.model.optimizer.iterations.numpy())}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if self.step_s:
            time.sleep(self.step_s)

    def on_train_end(self, logs=None):
        print(f"done step {int(self.model.optimizer.iterations.numpy())}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps-per-epoch", type=int, default=20)
    ap.add_argument("--per-worker-batch-size", type=int, default=32)
    ap.add_argument("--backup-dir", default="", help="BackupAndRestore's folder ('': none)")
    ap.add_argument("--save-freq", default="epoch", help="BackupAndRestore's save_freq: epoch or N batches")
    ap.add_argument("--collective-timeout", type=float, default=0.0, help="seconds (0: TF's default, none)")
    ap.add_argument("--step-s", type=float, default=0.0, help="sleep after each step (a slower job)")
    args = ap.parse_args()

    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=args.collective_timeout or None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    global_batch_size = args.per_worker_batch_size * num_workers
    multi_worker_dataset = digits_dataset(global_batch_size)
    with strategy.scope():
        multi_worker_model = build_and_compile_model()

    callbacks: list[tf.keras.callbacks.Callback] = [Progress(args.step_s)]
    if args.backup_dir:
        save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
        callbacks.append(tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir, save_freq=save_freq))
    multi_worker_model.fit(
        multi_worker_dataset,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=callbacks,
        verbose=2,
    )


if __name__ == "__main__":
    main()
