"""Data-parallel Keras training on scikit-learn's bundled digits, kept alive by trainguard.

    trainguard run --framework tf --gpu-ids 0,1,2,3 -- python examples/train_keras.py --checkpoint-dir /tmp/keras-ckpt
    python examples/train_keras.py --checkpoint-dir /tmp/keras-ckpt     # without the supervisor

Shaped like Keras's own data-parallel example ("Multi-GPU distributed training with TensorFlow"):
a functional model of Dense layers built and compiled in a ``tf.distribute.MirroredStrategy``
scope (every GPU of the node, or the CPU), trained with ``model.fit``. The trainguard lines are
marked ``# trainguard``: five (the import, the Guard, the resume, the data stream in place of
tf.data's shuffle-repeat-batch, the callback). Kill it at
any moment and start it again with the same ``--checkpoint-dir``: it resumes from the newest
valid checkpoint, with its data position, and ends with the weights an uninterrupted run ends
with (bitwise on CPU with ``--deterministic``). Under ``trainguard run`` the Guard also writes
heartbeats, error files and findings, and applies chaos drills (``trainguard demo --framework
keras`` runs it so).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import keras
import numpy as np
import tensorflow as tf

from trainguard.keras import Guard, shuffled_batches  # trainguard


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1797 digits as 64 features in [0, 1], split 80/20 with a fixed seed."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = (x[order] / 16.0).astype("float32"), y[order].astype("int64")
    n_test = len(y) // 5
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


class Delay(keras.callbacks.Callback):
    """A pause after each step, so that a demo's faults land while someone watches."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        if self.seconds:
            time.sleep(self.seconds)


def get_compiled_model() -> keras.Model:
    inputs = keras.Input(shape=(64,), name="digits")
    x = keras.layers.Dense(128, activation="relu")(inputs)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint-dir", default="keras-ckpt")
    ap.add_argument("--steps", type=int, default=180, help="optimizer steps in all")
    ap.add_argument(
        "--steps-per-epoch", type=int, default=0, help="a divisor of --steps (0: the largest up to 50)"
    )
    ap.add_argument("--batch-size", type=int, default=32, help="per replica")
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--deterministic", action="store_true", help="bitwise-reproducible ops (slower on GPU)")
    ap.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (demos)")
    ap.add_argument("--verbose", type=int, default=2)
    args = ap.parse_args()
    if not args.steps_per_epoch:
        args.steps_per_epoch = max(d for d in range(1, 51) if args.steps % d == 0)
    if args.steps % args.steps_per_epoch:
        ap.error(f"--steps {args.steps} is not a whole number of epochs of {args.steps_per_epoch} steps")

    keras.utils.set_random_seed(0)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MirroredStrategy()
    print(f"Number of devices: {strategy.num_replicas_in_sync}", flush=True)

    x_train, y_train, x_test, y_test = digits()
    batch_size = args.batch_size * strategy.num_replicas_in_sync
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size)

    with strategy.scope():
        model = get_compiled_model()

    guard = Guard(args.checkpoint_dir, checkpoint_every=args.checkpoint_every)  # trainguard
    guard.resume(model)  # trainguard: state and RNG of the newest valid checkpoint
    # Each epoch shuffled anew, in an order a resume can start anywhere: in place of Keras's
    # Dataset.from_tensor_slices((x, y)).shuffle(n).repeat().batch(batch_size).
    train = shuffled_batches((x_train, y_train), batch_size, seed=0, start=guard.position)  # trainguard
    model.fit(
        train,
        epochs=args.steps // args.steps_per_epoch,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[guard, Delay(args.step_delay)],  # trainguard: the Guard
        verbose=args.verbose,
    )
    loss, accuracy = model.evaluate(test, verbose=0)
    print(f"test accuracy: {accuracy:.4f} (loss {loss:.4f}, step {guard.step})", flush=True)


if __name__ == "__main__":
    main()
