"""No input crashes the parsers or the file scanner (hypothesis)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.detect.kernel_log import parse_kernel_line
from trainguard.detect.scan import ScanStats, classify_line, scan_engine, scan_file
from trainguard.detect.training_log import classify_training_line
from trainguard.records import Event
from trainguard.telemetry.follow import LogFollower

FAST = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# pieces of real lines, recombined into near misses
PREFIXES = [
    "",
    "[ 1234.567890] ",
    "[Sun Nov 22 08:40:07 2026] ",
    "Nov 22 08:40:07 host kernel: ",
    "2026-11-22T08:40:07+0000 host kernel: ",
    "6,1234,5678901,-;",
    "kern  :warn  : ",
    "[",
    "999,",
    "Feb 31 ",
]
BODIES = ["NVRM: Xid (PCI:", "NVRM: Xid (", "nvidia-nvswitch0: SXid (PCI:", "NVRM: GPU at PCI:", "NVRM: GPU "]
BUSES = [
    "0000:3b:00",
    "00000000:3B:00.0",
    "0002:00:00",
    "zz:yy",
    "",
    "0000:3b:00 GPU-I:02",
    "1:2:3:4",
    "ffffffffff:ff:ff",
]
TAILS = ["): 79, pid=1, name=x, GPU has fallen off the bus.", "): ", ")", "): 154, to 0x9 (", "): 45,",
         ": GPU-1234", "): 99999999999, x", ": GPU has fallen off the bus", "): 145, Nonfatal", ") 13"]  # fmt: skip
near_miss = st.builds(
    lambda *parts: "".join(parts),
    st.sampled_from(PREFIXES), st.sampled_from(BODIES), st.sampled_from(BUSES), st.sampled_from(TAILS), st.text(max_size=20),
)  # fmt: skip
TRAINING_BITS = ["NCCL WARN", "ncclSystemError", "CUDA error: ", "exitcode  : ", "Killed", "Error: ", "SIGSEGV",
                 "Root Cause (first observed failure):", "CUBLAS_STATUS_", "Watchdog caught", "\x00", "\ufffd"]  # fmt: skip
training_ish = st.lists(st.one_of(st.sampled_from(TRAINING_BITS), st.text(max_size=10)), max_size=8).map(
    "".join
)


def _ok(result: Event | None) -> None:
    assert result is None or isinstance(result, Event)


@FAST
@given(st.one_of(st.text(), near_miss))
def test_parse_kernel_line_never_raises(line):
    _ok(parse_kernel_line(line))
    _ok(parse_kernel_line(line, now=1e18, boot_time=-1e18))


@FAST
@given(st.one_of(st.text(), training_ish))
def test_classify_training_line_never_raises(line):
    _ok(classify_training_line(line))


@FAST
@given(near_miss)
def test_parsed_pci_addresses_are_normalised(line):
    event = parse_kernel_line(line)
    if event is not None and event.pci is not None:
        domain, bus, dev = event.pci.split(":")
        assert (len(domain), len(bus), len(dev)) == (4, 2, 2) and event.pci == event.pci.lower()


lines_of_bytes = st.lists(
    st.one_of(
        st.binary(max_size=80),
        near_miss.map(str.encode),
        training_ish.map(lambda s: s.encode("utf-8", "replace")),
    ),
    max_size=40,
)


@FILES
@given(lines_of_bytes, st.sampled_from([4096, 1 << 16]))
def test_scanner_never_raises_and_agrees_with_line_by_line(lines, chunk):
    data = b"\n".join(lines)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.log"
        path.write_bytes(data)
        for engine in {"stdlib", scan_engine()}:
            stats = ScanStats()
            events = list(scan_file(path, stats=stats, engine=engine, chunk_size=chunk))
            assert stats.bytes == len(data)
            assert stats.lines == data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
            # every finding sits on a decodable line and matches classifying that line alone
            raw_lines = data.split(b"\n")
            for event in events:
                assert event.line_no is not None
                raw = raw_lines[event.line_no - 1]
                again = classify_line(raw.decode("utf-8").rstrip("\r"))
                assert again is not None and again.kind == event.kind and again.xid == event.xid


@FILES
@given(lines_of_bytes)
def test_follower_never_raises_on_random_bytes(lines):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.log"
        data = b"\n".join(lines) + b"\n"
        path.write_bytes(data)
        follower = LogFollower(path)
        got = follower.poll()
        assert len(got) + follower.skipped == data.count(b"\n")
        follower.close()
