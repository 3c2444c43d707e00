"""Kernel-log parsing against golden lines in every format real drivers and log tools print."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from trainguard.actions import Advice
from trainguard.detect.kernel_log import line_time, parse_kernel_line
from trainguard.records import Category, EventKind, Severity

DATA = Path(__file__).parent / "data" / "kernel"
NOW = datetime.fromisoformat("2026-11-22T12:00:00").timestamp()  # gives zone-less syslog stamps their year


def _golden() -> list[tuple[int, str, dict[str, str] | None]]:
    lines = (DATA / "variants.log").read_text(encoding="utf-8").splitlines()
    expected: dict[int, dict[str, str]] = {}
    for row in (DATA / "variants.expected.tsv").read_text(encoding="utf-8").splitlines():
        if row.startswith("#") or not row.strip():
            continue
        no, kind, xid, pci, when, action = row.split("\t")
        expected[int(no)] = {"kind": kind, "xid": xid, "pci": pci, "time": when, "action": action}
    return [(i, line, expected.get(i)) for i, line in enumerate(lines, 1)]


def _expected_time(spec: str) -> float | None:
    if spec == "-":
        return None
    if spec.startswith("local:"):
        return datetime.fromisoformat(spec[6:]).timestamp()
    return float(spec)


@pytest.mark.parametrize(
    ("no", "line", "want"), _golden(), ids=lambda v: str(v) if isinstance(v, int) else ""
)
def test_golden_kernel_line_parses_to_the_expected_event(no, line, want):
    event = parse_kernel_line(line, now=NOW)
    if want is None:
        assert event is None, f"line {no} should not be a finding: {line}"
        return
    assert event is not None, f"line {no} not recognised: {line}"
    assert event.kind.value == want["kind"]
    assert event.xid == (None if want["xid"] == "-" else int(want["xid"]))
    assert event.pci == want["pci"]
    assert event.time == pytest.approx(_expected_time(want["time"]), abs=1e-6)
    assert event.action.value == want["action"]
    assert event.text == line


def test_golden_file_has_every_variant_and_some_non_findings():
    rows = _golden()
    assert sum(1 for _, _, want in rows if want) >= 29
    assert sum(1 for _, _, want in rows if want is None) >= 5


def test_xid_79_from_the_simulated_fleet_fails_the_gpu():
    line = "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    event = parse_kernel_line(line)
    assert event is not None
    assert (event.kind, event.xid, event.pci, event.pid, event.process) == (
        EventKind.XID,
        79,
        "0000:3b:00",
        1234,
        "python",
    )
    assert (event.severity, event.category, event.action) == (
        Severity.FATAL,
        Category.GPU_HARDWARE,
        Advice.REBOOT_NODE,
    )


def test_unknown_pid_and_name_are_left_empty():
    event = parse_kernel_line(
        "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception"
    )
    assert event is not None and event.pid is None and event.process is None


def test_gpu_map_line_maps_pci_to_uuid():
    event = parse_kernel_line(
        "[    3.123456] NVRM: GPU at PCI:0000:3B:00: GPU-6b2ba0f0-2e2a-1d87-7ad9-0a4d4c7ed4f0"
    )
    assert event is not None and event.kind is EventKind.GPU_MAP
    assert (event.pci, event.uuid) == ("0000:3b:00", "GPU-6b2ba0f0-2e2a-1d87-7ad9-0a4d4c7ed4f0")
    assert event.severity is Severity.INFO


def test_sxid_is_never_a_gpu_xid():
    event = parse_kernel_line(
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress error"
    )
    assert event is not None and event.kind is EventKind.SXID
    assert event.category is Category.INTERCONNECT


@pytest.mark.parametrize(
    ("tail", "action"),
    [
        ("from 0x0 (None) to 0x1 (GPU Reset Required)", Advice.RESET_GPU),
        ("from 0x0 (None) to 0x2 (Node Reboot Required)", Advice.REBOOT_NODE),
        ("from 0x1 (GPU Reset Required) to 0x0 (None)", Advice.NONE),
        ("from None to Drain and Reset", Advice.DRAIN),  # as the NVML recovery-action rule says
    ],
)
def test_xid_154_takes_the_action_the_driver_names(tail, action):
    event = parse_kernel_line(f"NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed {tail}")
    assert event is not None and event.action is action


def test_monotonic_stamps_become_epoch_when_boot_time_is_known():
    event = parse_kernel_line(
        "[  100.500000] NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception", boot_time=1000.0
    )
    assert event is not None and event.time == pytest.approx(1100.5)


def test_line_without_a_stamp_takes_the_read_time():
    event = parse_kernel_line("NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception", now=42.0)
    assert event is not None and event.time == 42.0


def test_timestamp_prefixes_are_recognised():
    assert line_time("[  123.000001] ") == pytest.approx(123.000001)
    assert line_time("6,1234,5678901,-;") == pytest.approx(5.678901)
    assert line_time("2026-11-22T08:40:07Z host kernel: ") == 1795336807.0
    assert line_time("host kernel: ") is None


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NVRM",
        "NVRM: Xid (",
        "NVRM: Xid (PCI:zzzz:3b:00): 79",
        "NVRM: Xid (PCI:0000:3b:00): 99999999999999999999999",
        "nvidia-nvswitch: SXid (PCI:",
        "[Sun Foo 99 99:99:99 9999] NVRM: Xid (PCI:0000:3b:00): 79, x",
        "9999-99-99T99:99:99+99:99 NVRM: Xid (PCI:0000:3b:00): 79, x",
        "\x00\x00NVRM\x00Xid\ufffd",
    ],
)
def test_malformed_lines_never_raise(line):
    parse_kernel_line(line)  # a None or an Event, never an exception


@pytest.mark.parametrize("code", [13, 31, 45, 48, 63, 64, 74, 79, 94, 95, 119, 154])
def test_simulated_fleet_lines_parse_like_real_ones(code):
    import random

    kmsg = pytest.importorskip("trainguard.telemetry.sim.kmsg")
    text = kmsg.xid_messages(code, random.Random(code))[0]
    line = kmsg.dmesg_line(1234.5678901, kmsg.format_xid("0000:3B:00.0", code, text, pid=77, who=code != 154))
    event = parse_kernel_line(line)
    assert event is not None and (event.kind, event.xid, event.pci) == (EventKind.XID, code, "0000:3b:00")
    assert event.time == pytest.approx(1234.56789)
    mapping = parse_kernel_line(
        kmsg.dmesg_line(3.0, kmsg.gpu_map_lines("0000:3b:00", "GPU-11111111-2222-3333-4444-555555555555")[0])
    )
    assert mapping is not None and mapping.uuid == "GPU-11111111-2222-3333-4444-555555555555"


def test_syslog_stamp_without_a_year_read_in_january_is_last_december():
    january = datetime.fromisoformat("2027-01-02T00:00:00").timestamp()
    stamp = line_time("Dec 31 23:59:00 host kernel: ", now=january)
    assert stamp == datetime.fromisoformat("2026-12-31T23:59:00").timestamp()
