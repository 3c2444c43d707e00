"""The Keras Guard inside one process, on real TensorFlow and Keras 3: resume, numerics, preemption,
the run-directory files. (A killed-and-resumed process: tests/test_keras_resume.py.)"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from real_parts import require_module

require_module(
    "tensorflow", install="make install (tensorflow-cpu 2.21; users: pip install 'trainguard[tf]')"
)
keras = require_module("keras", install="make install (Keras 3 comes with tensorflow)")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainguard import rundir  # noqa: E402
from trainguard.checkpoint import damage, list_checkpoints  # noqa: E402
from trainguard.control import Control, read_control, write_control  # noqa: E402
from trainguard.keras import Guard, StateMismatch, batch_loss, shuffled_batches  # noqa: E402
from trainguard.rundir import WorkerExit  # noqa: E402

tf.config.experimental.enable_op_determinism()
X = np.random.default_rng(1).normal(size=(96, 8)).astype("float32")
Y = (X[:, :3].sum(axis=1) > 0).astype("int64")


def model(seed: int = 0, width: int = 16) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=(8,))
    h = keras.layers.Dense(width, activation="relu")(inputs)
    h = keras.layers.Dropout(0.2)(h)
    m = keras.Model(inputs, keras.layers.Dense(2)(h))
    m.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return m


def fit(
    m: keras.Model, guard: Guard, epochs: int, more: list[keras.callbacks.Callback] | None = None
) -> None:
    data = shuffled_batches((X, Y), 16, seed=3, start=guard.position)
    m.fit(data, epochs=epochs, steps_per_epoch=10, callbacks=[guard, *(more or [])], verbose=0)


class At(keras.callbacks.Callback):
    """Does ``what`` once the ``step``-th batch of this fit ended (counting from 1)."""

    def __init__(self, step: int, what) -> None:
        super().__init__()
        self.step, self.what, self.seen = step, what, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            self.what()


def weights(m: keras.Model) -> list[np.ndarray]:
    return [np.array(v.value) for v in m.variables] + [np.array(v.value) for v in m.optimizer.variables]


def test_batch_i_of_the_stream_is_the_same_batch_from_any_start():
    whole = [b[1].numpy() for b in shuffled_batches((X, Y), 16, seed=3).take(14)]
    later = [b[1].numpy() for b in shuffled_batches((X, Y), 16, seed=3, start=9).take(5)]
    assert all(np.array_equal(a, b) for a, b in zip(whole[9:], later, strict=True))
    rows = [shuffled_batches((np.arange(96),), 16, seed=3, start=e * 6).take(6) for e in (0, 1)]
    epochs = [np.concatenate([b[0].numpy() for b in r]) for r in rows]
    assert all(sorted(e) == list(range(96)) for e in epochs) and not np.array_equal(*epochs)


def test_a_run_stopped_at_any_step_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    whole, g = model(), Guard(tmp_path / "a", checkpoint_every=5)
    g.resume(whole)
    fit(whole, g, epochs=3)
    assert (g.step, g.position) == (30, 30)

    crashed, g1 = model(), Guard(tmp_path / "b", checkpoint_every=5)
    g1.resume(crashed)

    def crash() -> None:
        raise RuntimeError("the process dies")

    with pytest.raises(RuntimeError):
        fit(crashed, g1, epochs=3, more=[At(13, crash)])
    resumed, g2 = model(seed=7), Guard(tmp_path / "b", checkpoint_every=5)  # another init: all comes back
    assert g2.resume(resumed) == 10 and g2.resumed is not None and g2.position == 10
    fit(resumed, g2, epochs=3)
    assert (g2.step, g2.position) == (30, 30)  # the first epoch after the resume was 20 batches, not 30
    assert all(np.array_equal(a, b) for a, b in zip(weights(whole), weights(resumed), strict=True))


def test_a_nan_rolls_back_to_the_last_checkpoint_and_training_goes_on(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "chaos.json").write_text(json.dumps({"faults": [{"kind": "nan", "rank": 0, "step": 12}]}))
    m, g = model(), Guard(tmp_path / "ckpt", checkpoint_every=5, run_dir=run, rank=0)
    g.resume(m)
    fit(m, g, epochs=3)
    rules = [(f.rule, step) for rank, step, f in rundir.read_findings(run)]
    assert rules == [("numerics.nonfinite_loss", 12), ("numerics.rollback", 12)]
    assert "from rank 0" in rundir.read_findings(run)[0][2].reason
    assert g.position == 30 and g.step == 30 - 3  # steps 10-12 were undone; their data is not replayed
    assert all(np.isfinite(w).all() for w in weights(m))


def test_a_nan_with_no_checkpoint_to_return_to_stops_the_rank(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "chaos.json").write_text(json.dumps({"faults": [{"kind": "nan", "rank": 0, "step": 3}]}))
    m, g = model(), Guard(tmp_path / "ckpt", checkpoint_every=0, run_dir=run, rank=0)
    g.resume(m)
    with pytest.raises(SystemExit) as stop:
        fit(m, g, epochs=1)
    assert stop.value.code == WorkerExit.NUMERICS_STOP
    assert [f.rule for _, _, f in rundir.read_findings(run)][-1] == "numerics.unrecoverable"
    assert rundir.read_last_heartbeat(rundir.heartbeat_path(run, 0)).phase == "exit"


def test_a_stop_signal_saves_at_the_next_batch_and_exits_preempted(tmp_path):
    m, g = model(), Guard(tmp_path / "ckpt", checkpoint_every=0, run_dir=tmp_path / "run", rank=0)
    g.resume(m)
    with pytest.raises(SystemExit) as stop:
        fit(m, g, epochs=3, more=[At(7, lambda: os.kill(os.getpid(), signal.SIGTERM))])
    assert stop.value.code == WorkerExit.PREEMPTED
    assert [c.step for c in list_checkpoints(tmp_path / "ckpt")] == [8]  # the signal came during step 8's end
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_the_supervisors_checkpoint_request_is_saved_at_the_next_look_once(tmp_path):
    run = tmp_path / "run"
    m = model()
    g = Guard(
        tmp_path / "ckpt",
        checkpoint_every=0,
        run_dir=run,
        rank=0,
        attempt=2,
        control_every=5,
        save_at_end=False,
    )
    g.resume(m)

    def ask(attempt: int) -> None:
        write_control(run, (read_control(run) or Control()).asking_checkpoint("GPU 3 degraded", 1.0, attempt))

    fit(
        m, g, epochs=3, more=[At(7, lambda: ask(2)), At(17, lambda: ask(1))]
    )  # the second: an older attempt's
    assert [c.step for c in list_checkpoints(tmp_path / "ckpt")] == [10]


def test_heartbeats_say_each_phase_and_an_uncaught_error_leaves_the_error_file(tmp_path):
    run = tmp_path / "run"
    m, g = model(), Guard(tmp_path / "ckpt", checkpoint_every=5, run_dir=run, rank=0, heartbeat_interval_s=0)
    g.resume(m)

    def fail() -> None:
        raise ValueError("bad batch shape")

    with pytest.raises(ValueError) as err:
        fit(m, g, epochs=1, more=[At(7, fail)])
    sys.excepthook(ValueError, err.value, err.value.__traceback__)  # what the interpreter does at the end
    beats = rundir.read_heartbeats(rundir.heartbeat_path(run, 0))
    assert beats[0].phase == "init" and {b.phase for b in beats} >= {"train", "checkpoint"}
    assert [b.step for b in beats if b.phase == "train"][:3] == [0, 1, 2]
    (record,) = rundir.read_errors(run)
    assert (record.rank, record.exc_type, record.message, record.step) == (
        0,
        "ValueError",
        "bad batch shape",
        6,
    )  # the 7th batch


def test_resume_skips_a_torn_newest_checkpoint_and_refuses_another_models(tmp_path):
    m, g = model(), Guard(tmp_path / "ckpt", checkpoint_every=5)
    g.resume(m)
    fit(m, g, epochs=1)
    damage(tmp_path / "ckpt" / "step-00000010", "truncate")
    assert Guard(tmp_path / "ckpt").resume(model()) == 5
    with pytest.raises(StateMismatch, match="written for another model"):
        Guard(tmp_path / "ckpt").resume(model(width=32))


def test_each_batch_loss_is_recovered_from_keras_running_mean():
    losses = [2.0, 4.0, 3.0, 7.0]
    means = [sum(losses[: i + 1]) / (i + 1) for i in range(4)]
    assert [batch_loss(means[i], means[i - 1] if i else None, i + 1, i) for i in range(4)] == losses
    assert batch_loss(means[3], means[1], 4, 2) == 5.0  # two batches per call: their mean
