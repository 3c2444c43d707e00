"""The control file, supervisor -> trainer: written atomically, versioned, and read by a trainer
that never raises on what it finds there."""

from __future__ import annotations

import json
import threading

import pytest

from trainguard.control import (
    CONTROL_VERSION,
    Control,
    ControlWatch,
    control_path,
    read_control,
    write_control,
)


def test_each_request_is_a_new_document_with_the_next_sequence_number(tmp_path):
    first = Control().asking_checkpoint("GPU 3 degraded", now=10.0, attempt=2)
    write_control(tmp_path, first)
    assert read_control(tmp_path) == first
    second = first.asking_checkpoint("again", now=11.0)
    write_control(tmp_path, second)
    assert (second.seq, second.save_now, second.attempt) == (2, 2, None)
    assert read_control(tmp_path) == second
    assert [p.name for p in tmp_path.iterdir()] == ["control.json"]  # no temp file left behind
    assert json.loads(control_path(tmp_path).read_text())["version"] == CONTROL_VERSION


def test_a_reader_never_sees_a_half_written_document(tmp_path):
    write_control(tmp_path, Control(seq=1, reason="x" * 4096))
    stop = threading.Event()

    def writer() -> None:
        control = Control(seq=1)
        while not stop.is_set():
            control = control.asking_checkpoint("y" * (control.seq % 7 * 1000), now=float(control.seq))
            write_control(tmp_path, control)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = [read_control(tmp_path) for _ in range(3000)]
    finally:
        stop.set()
        thread.join()
    assert None not in seen  # a torn or empty file would read as None
    seqs = [c.seq for c in seen if c is not None]
    assert seqs == sorted(seqs) and len(set(seqs)) > 1


def test_fields_a_reader_does_not_know_are_ignored(tmp_path):
    doc = {"version": CONTROL_VERSION, "seq": 4, "time": 1.0, "save_now": 4, "shares": {"0": 0.6}, "x": [1]}
    control_path(tmp_path).write_text(json.dumps(doc))
    assert read_control(tmp_path) == Control(seq=4, time=1.0, save_now=4)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[1, 2]",
        '"control"',
        json.dumps({"version": CONTROL_VERSION + 1, "seq": 9, "save_now": 9}),  # a newer format
        json.dumps({"version": "1", "seq": 9, "save_now": 9}),
        json.dumps({"version": CONTROL_VERSION, "save_now": 9}),  # no sequence number
        json.dumps({"version": CONTROL_VERSION, "seq": True, "save_now": 9}),
        "\x00\xff garbage",
    ],
)
def test_a_document_that_is_not_one_reads_as_none(tmp_path, text):
    control_path(tmp_path).write_text(text, errors="surrogateescape")
    assert read_control(tmp_path) is None


def test_fields_of_the_wrong_type_read_as_their_default(tmp_path):
    doc = {"version": CONTROL_VERSION, "seq": 3, "time": "soon", "save_now": "3", "attempt": 1.5, "reason": 7}
    control_path(tmp_path).write_text(json.dumps(doc))
    assert read_control(tmp_path) == Control(seq=3)


def test_the_watch_reads_the_file_only_when_it_changed(tmp_path):
    watch = ControlWatch(tmp_path)
    assert watch.poll() is None  # no file yet
    write_control(tmp_path, Control().asking_checkpoint("a", now=1.0))
    assert watch.poll() == watch.current == read_control(tmp_path)
    assert watch.poll() is None  # unchanged: a stat, no read
    write_control(tmp_path, watch.current.asking_checkpoint("b", now=2.0))
    new = watch.poll()
    assert new is not None and new.reason == "b" and new.save_now == 2
