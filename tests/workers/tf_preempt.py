"""A multi-worker custom training loop with TensorFlow's own preemption handling, knowing nothing of
trainguard.

    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 0}}' \
        python tf_preempt.py /tmp/ckpt --steps 200

Shaped like TF's guide to ``tf.distribute.experimental.PreemptionCheckpointHandler``: a
``MultiWorkerMirroredStrategy``, a ``tf.train.Checkpoint`` handed to the handler (which restores it
at start), and every step through ``handler.run``. Off GCP the handler's defaults apply
(TF 2.21's ``BorgTerminationConfig``): a SIGTERM to any worker makes every worker save at the next
step and exit 42. The run prints ``start step N`` (what the handler restored) and ``done step N``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint_dir")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-s", type=float, default=0.1, help="sleep after each step (a slower job)")
    args = ap.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
        model.build((None, 64))
        optimizer = tf.keras.optimizers.SGD(0.05)
        step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, args.checkpoint_dir
    )
    print(f"start step {int(step.numpy())}", flush=True)
    x = tf.random.stateless_normal((64, 64), seed=(1, 2))
    y = tf.zeros((64,), tf.int64)

    @tf.function
    def train_step() -> None:
        def replica_fn() -> None:
            with tf.GradientTape() as tape:
                logits = model(x)
                loss = tf.reduce_mean(
                    tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            step.assign_add(1)

        strategy.run(replica_fn)

    while handler.total_run_calls < args.steps:
        handler.run(train_step)  # saves and exits 42 once any worker got SIGTERM
        time.sleep(args.step_s)
        if handler.total_run_calls % 20 == 0:
            print(f"at step {int(step.numpy())}", flush=True)
    print(f"done step {int(step.numpy())}", flush=True)


if __name__ == "__main__":
    main()
