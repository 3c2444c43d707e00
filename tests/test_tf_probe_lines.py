"""TensorFlow's start-up probe of the CUDA driver (tests/data/real/tf_probe_*.tsv, #37): on a host
without a driver, ``failed call to cuInit: ... UNKNOWN ERROR (303)`` is no failure (TF trains on
the CPU), so it must not become the cause or the summary of a worker's death; the probe naming a
CUDA_ERROR_* on a GPU host stays the driver's. Before the rule: dev 1/2, held out 6/8; after: 2/2
and 8/8 (the held-out lines were read while collecting them; no rule was written from them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_real_lines import _rows  # type: ignore[import-not-found]
from trainguard.detect.scan import classify_line
from trainguard.detect.training_log import classify_training_line
from trainguard.incidents import RootCause
from trainguard.supervisor.exits import Exited, exit_trouble

DATA = Path(__file__).parent / "data" / "real"
PROBE = "E0000 00:00:1795872919.647160    4437 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"


@pytest.mark.parametrize("name", ["tf_probe_dev.tsv", "tf_probe_heldout.tsv"])
def test_the_probe_lines_are_classified_as_their_threads_found(name):
    rows = _rows(DATA / name)
    got = [((e := classify_line(line)) and e.category.value) or "none" for _, _, line in rows]
    assert got == [expected for expected, _, _ in rows]


def test_a_tf_worker_that_crashes_is_summarised_by_its_error_not_by_the_driver_probe():
    lines = [PROBE, "ValueError: malformed sample in shard 7: expected 64 pixels, got 63"]
    events = [e for line in lines if (e := classify_training_line(line)) is not None]
    trouble = exit_trouble(100.0, [Exited(0, 0, 1, 100.0)], [], events, [], {0: 0}, {0: None})
    assert trouble.root_cause is RootCause.SOFTWARE_BUG
    assert trouble.summary.startswith("ValueError: malformed sample")
