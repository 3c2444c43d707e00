"""The job bench_tf.py runs in both arms: a two-worker Keras job on MultiWorkerMirroredStrategy.

    python benchmarks/tf_job.py --backup-dir B --collective-timeout 60          # what a TF user runs
    python benchmarks/tf_job.py --trainguard --checkpoint-dir C                 # with trainguard's Guard

One script, two ways to survive a restart: TensorFlow's ``BackupAndRestore`` (``--backup-dir``,
saved every ``--save-every`` batches) or trainguard's Guard (``--trainguard``: checkpoints every
``--save-every`` steps, heartbeats the supervisor reads). Everything else is shared: the model
and data (scikit-learn's digits; tf.data's shuffle-repeat-batch, or the Guard's resumable
`shuffled_batches`: the TensorFlow arm imports no trainguard code), the steps, TF's
collective timeout, the pace (``--step-s`` of work per step), and the fault that happens inside
the job: ``--hang-at-step N`` hangs worker ``--hang-rank`` once (a marker file makes a restarted
worker not hang again), as a deadlock in a worker's own code would, with its process alive.
Keras 2 (``tf_keras``): Keras 3's ``fit`` cannot run this strategy across workers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf
from sklearn.datasets import load_digits


class Pace(tf.keras.callbacks.Callback):
    """``step_s`` of work per step, the one hang of the fault schedule, and (rank 0, ``progress``)
    a line ``time step pid`` per step for the harness to read."""

    def __init__(
        self, step_s: float, hang_at: int, marker: str, rank: int, hang_rank: int, progress: str
    ) -> None:
        super().__init__()
        self.step_s, self.hang_at, self.marker = step_s, hang_at, Path(marker) if marker else None
        self.hang_here = rank == hang_rank
        self.progress = open(progress, "a") if progress and rank == 0 else None  # noqa: SIM115

    def on_train_batch_end(self, batch, logs=None):
        if self.step_s:
            time.sleep(self.step_s)
        step = int(self.model.optimizer.iterations.numpy())
        if self.progress is not None:
            self.progress.write(f"{time.time():.3f} {step} {os.getpid()}\n")
            self.progress.flush()
        if self.hang_here and self.marker is not None and step == self.hang_at and not self.marker.exists():
            self.marker.write_text(str(time.time()))
            print(f"hanging at step {step}", flush=True)
            while True:
                time.sleep(3600)

    def on_train_end(self, logs=None):
        print(f"done step {int(self.model.optimizer.iterations.numpy())}", flush=True)


def model() -> tf.keras.Model:
    m = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(64,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    m.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=["accuracy"],
    )
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps-per-epoch", type=int, default=50)
    ap.add_argument("--per-worker-batch-size", type=int, default=32)
    ap.add_argument("--save-every", type=int, default=20, help="steps between saves (either way)")
    ap.add_argument("--backup-dir", default="", help="TensorFlow's BackupAndRestore")
    ap.add_argument("--trainguard", action="store_true", help="trainguard's Guard instead")
    ap.add_argument("--checkpoint-dir", default="tf-job-ckpt")
    ap.add_argument("--collective-timeout", type=float, default=0.0, help="seconds (0: none, TF's default)")
    ap.add_argument("--step-s", type=float, default=0.0)
    ap.add_argument("--hang-at-step", type=int, default=-1)
    ap.add_argument("--hang-rank", type=int, default=1)
    ap.add_argument("--hang-marker", default="")
    ap.add_argument("--progress", default="", help="rank 0 appends 'time step pid' per step here")
    args = ap.parse_args()

    cluster = json.loads(os.environ.get("TF_CONFIG", "{}"))
    workers = len(cluster.get("cluster", {}).get("worker", [])) or 1
    rank = int(cluster.get("task", {}).get("index", 0))
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=args.collective_timeout or None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        m = model()

    x, y = load_digits(return_X_y=True)
    arrays = ((x / 16.0).astype("float32"), y.astype("int64"))
    batch = args.per_worker_batch_size * workers
    callbacks: list[tf.keras.callbacks.Callback] = []
    if args.trainguard:
        from trainguard.keras import shuffled_batches
        from trainguard.keras.legacy import Guard

        guard = Guard(args.checkpoint_dir, checkpoint_every=args.save_every)
        guard.resume(m)
        data = shuffled_batches(arrays, batch, seed=0, start=guard.position)
        callbacks.append(guard)
    else:  # what TF's tutorial writes; no trainguard code in this arm
        data = (
            tf.data.Dataset.from_tensor_slices(arrays).shuffle(len(arrays[1]), seed=0).repeat().batch(batch)
        )
        if args.backup_dir:
            callbacks.append(
                tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir, save_freq=args.save_every)
            )
    pace = Pace(args.step_s, args.hang_at_step, args.hang_marker, rank, args.hang_rank, args.progress)
    callbacks.append(pace)
    m.fit(data, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, callbacks=callbacks, verbose=2)


if __name__ == "__main__":
    main()
