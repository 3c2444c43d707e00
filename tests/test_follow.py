"""Following growing logs: appends, partial lines, rotation, truncation, /dev/kmsg and the journal."""

from __future__ import annotations

import os
import subprocess

import pytest

from trainguard.errors import InputError
from trainguard.telemetry.follow import KmsgReader, LogFollower, decode_line, read_journal_kernel, read_kmsg


def _append(path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_follower_yields_appended_complete_lines_only(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"old line\n")
    follower = LogFollower(log, from_start=True)
    assert follower.poll() == ["old line"]
    _append(log, b"new 1\nnew 2\npart")
    assert follower.poll() == ["new 1", "new 2"]
    assert follower.poll() == []
    _append(log, b"ial\n")
    assert follower.poll() == ["partial"]
    follower.close()


def test_follower_can_start_at_the_end(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"history\n")
    follower = LogFollower(log, from_start=False)
    assert follower.poll() == []
    _append(log, b"fresh\n")
    assert follower.poll() == ["fresh"]


def test_rotation_finishes_the_old_file_then_follows_the_new_one(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"a\n")
    follower = LogFollower(log)
    assert follower.poll() == ["a"]
    _append(log, b"b\nlast-without-newline")
    os.rename(log, tmp_path / "kern.log.1")
    assert follower.poll() == ["b"]  # rotated away, new file not there yet: keep the old one
    log.write_bytes(b"c\n")
    assert follower.poll() == ["last-without-newline", "c"]
    _append(log, b"d\n")
    assert follower.poll() == ["d"]


def test_truncation_restarts_from_the_beginning(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    follower = LogFollower(log)
    assert len(follower.poll()) == 3
    with open(log, "wb") as fh:  # copytruncate: same inode, shorter file
        fh.write(b"x\n")
    assert follower.poll() == ["x"]


def test_a_file_that_appears_later_is_picked_up(tmp_path):
    log = tmp_path / "later.log"
    follower = LogFollower(log, from_start=False)
    assert follower.poll() == []
    log.write_bytes(b"hello\n")
    assert follower.poll() == ["hello"]


def test_garbage_lines_are_skipped_and_counted(tmp_path):
    log = tmp_path / "bin.log"
    log.write_bytes(b"good\n\x00\x01\x02\n\xff\xfe\xfd\nalso good \xe2\x9c\x93\n")
    follower = LogFollower(log)
    assert follower.poll() == ["good", "also good \u2713"]
    assert follower.skipped == 2


def test_lines_sleeps_through_the_injected_sleep_until_stopped(tmp_path):
    log = tmp_path / "k.log"
    log.write_bytes(b"x\n")
    naps: list[float] = []
    follower = LogFollower(log, poll_interval=0.25, sleep=naps.append)
    got = list(follower.lines(stop=lambda: len(naps) >= 2))
    assert got == ["x"] and naps == [0.25, 0.25]


def test_decode_line_keeps_a_literal_replacement_character():
    assert decode_line("caf\ufffd".encode()) == "caf\ufffd"
    assert decode_line(b"caf\xe9") is None
    assert decode_line(b"a\x00b") is None


class _FakeKmsg:
    """One record per read, like /dev/kmsg; EPIPE for an overwritten record, EAGAIN at the end."""

    def __init__(self, items):
        self.items = list(items)

    def __call__(self, _fd, _n):
        if not self.items:
            raise BlockingIOError(11, "EAGAIN")
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


def test_kmsg_reader_survives_overwritten_records(tmp_path):
    fake = tmp_path / "kmsg"
    fake.write_bytes(b"")
    read = _FakeKmsg([
        b"6,100,1000,-;NVRM: GPU at PCI:0000:3b:00: GPU-aaaa0000-1111-2222-3333-444455556666\n SUBSYSTEM=pci\n",
        BrokenPipeError(32, "EPIPE"),
        b"4,105,2000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n",
        b"4,106,2001,-;\xff\xfe garbage\n",
    ])  # fmt: skip
    reader = KmsgReader(fake, read=read)
    lines = reader.poll()
    assert [line.split(";")[0] for line in lines] == ["6,100,1000,-", "4,105,2000,-"]
    assert reader.lost == 1 and reader.skipped == 1
    assert reader.poll() == []
    reader.close()


def test_read_kmsg_returns_what_is_there(tmp_path):
    fake = tmp_path / "kmsg"
    fake.write_bytes(b"")
    assert read_kmsg(fake, read=_FakeKmsg([b"6,1,1,-;hello\n"])) == ["6,1,1,-;hello"]


def test_kmsg_reader_without_permission_says_so(tmp_path):
    with pytest.raises(InputError, match="missing"):
        KmsgReader(tmp_path / "missing")


def test_journal_reader_runs_journalctl_for_kernel_messages():
    calls = []

    def run(cmd, **_kw):
        calls.append(cmd)
        out = b"-- Journal begins at Sun 2026-11-22 --\n2026-11-22T08:40:07+0000 node kernel: NVRM: Xid (PCI:0000:3b:00): 79, x\n"
        return subprocess.CompletedProcess(cmd, 0, out, b"")

    lines = read_journal_kernel(since="-1h", run=run)
    assert calls == [["journalctl", "-k", "-o", "short-iso", "--no-pager", "--since", "-1h"]]
    assert lines == ["2026-11-22T08:40:07+0000 node kernel: NVRM: Xid (PCI:0000:3b:00): 79, x"]


def test_journal_reader_reports_journalctl_failure():
    def run(cmd, **_kw):
        return subprocess.CompletedProcess(cmd, 1, b"", b"No journal files were found.")

    with pytest.raises(InputError, match="No journal files"):
        read_journal_kernel(run=run)
