"""TensorFlow's failure lines across every real set (#37): the score docs/tensorflow.md reports.

The sets of tests/data/real/ mix frameworks; this picks the TensorFlow/Keras rows out of each by a
rule fixed here (not by what the classifier says): the thread is in a tensorflow/* or keras-team/*
repository, or the line names TensorFlow's source tree (``tensorflow/``), its error class
(``ResourceExhaustedError``), its allocator's OOM (``OOM when allocating tensor``) or its device
names (``/job:``); the driver-probe sets (tf_probe_*) are TensorFlow's whole. Dev: the halves the
rules were grown from; held out: the halves scored once, after. ``pytest -s`` prints each miss.

The coordination-service sets (tf_coord_*) carry a fourth column, the task a line names as the failed
one: a survivor's line names the lost task, which is the rank the incident must blame (the launcher
gives worker R task index R, ``supervisor.tf``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_real_lines import _rows  # type: ignore[import-not-found]
from trainguard.detect.culprit import line_rank
from trainguard.detect.scan import classify_line

DATA = Path(__file__).parent / "data" / "real"
HALVES = {
    "dev": ("lines.tsv", "fresh_dev.tsv", "third_dev.tsv", "tf_probe_dev.tsv"),
    "held_out": ("heldout.tsv", "fresh_heldout.tsv", "third_heldout.tsv", "tf_probe_heldout.tsv"),
}
THREAD = re.compile(r"github\.com/(tensorflow|keras-team)/")
LINE = re.compile(r"tensorflow[/\\]|ResourceExhaustedError|OOM when allocating tensor|/job:")


def tf_rows(names: tuple[str, ...]) -> list[tuple[str, str, str]]:
    return [
        (expected, url, line)
        for name in names
        for expected, url, line in _rows(DATA / name)
        if name.startswith("tf_probe") or THREAD.search(url) or LINE.search(line)
    ]


@pytest.mark.parametrize("half,count,floor", [("dev", 17, 1.0), ("held_out", 22, 0.8)])
def test_tensorflow_lines_are_classified(half: str, count: int, floor: float) -> None:
    rows = tf_rows(HALVES[half])
    misses = [
        (expected, got, line)
        for expected, _, line in rows
        if (got := ((e := classify_line(line)) and e.category.value) or "none") != expected
    ]
    print(f"\nTensorFlow lines, {half}: {len(rows) - len(misses)} of {len(rows)} right")
    for expected, got, line in misses:
        print(f"  expected {expected}, got {got}: {line[:120]}")
    assert len(rows) == count  # the selection itself is fixed: a new row changes the reported figure
    assert (len(rows) - len(misses)) / len(rows) >= floor


def coord_rows(name: str) -> list[tuple[str, str, str]]:
    """(category, rank named or '-', line) of a tf_coord set."""
    rows = []
    for raw in (DATA / name).read_text(encoding="utf-8").splitlines():
        if raw and not raw.startswith("#"):
            category, rank, _source, line = raw.split("\t", 3)
            rows.append((category, rank, line))
    return rows


@pytest.mark.parametrize(
    "name,count,floor", [("tf_coord_dev.tsv", 14, 1.0), ("tf_coord_heldout.tsv", 5, 0.8)]
)
def test_coordination_service_lines_name_the_lost_task(name: str, count: int, floor: float) -> None:
    rows = coord_rows(name)
    misses = []
    for expected, rank, line in rows:
        event = classify_line(line)
        got = event.category.value if event is not None else "none"
        named = line_rank(line)
        if (got, "-" if named is None else str(named)) != (expected, rank):
            misses.append((expected, got, rank, named, line))
        elif event is not None and expected == "node_host":
            assert event.sympathetic, line  # a survivor's report of a lost task is a consequence
    print(f"\n{name}: {len(rows) - len(misses)} of {len(rows)} right (category and rank)")
    for expected, got, rank, named, line in misses:
        print(f"  expected {expected} naming {rank}, got {got} naming {named}: {line[:120]}")
    assert len(rows) == count
    assert (len(rows) - len(misses)) / len(rows) >= floor
