"""Detect: turn raw evidence (log lines, GPU readings) into classified events and findings.

logs     -> kernel_log.parse_kernel_line / training_log.classify_training_line -> Event
files    -> scan.scan_file (bulk), follow.LogFollower / KmsgReader (as they grow)
catalog  -> xid.xid_info(code) -> XidInfo
readings -> rules (Samples and Events -> Findings -> verdicts)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.detect.kernel_log import line_time, parse_kernel_line
    from trainguard.detect.scan import (
        BurstTracker,
        EventMerger,
        ScanStats,
        classify_line,
        merge_events,
        scan_bytes,
        scan_file,
    )
    from trainguard.detect.training_log import (
        ElasticRootCause,
        classify_training_line,
        parse_elastic_root_cause,
    )
    from trainguard.detect.xid import XidClass, XidInfo, xid_catalog, xid_info
    from trainguard.telemetry.follow import (
        KmsgReader,
        LogFollower,
        decode_line,
        read_journal_kernel,
        read_kmsg,
    )


__all__ = [
    "BurstTracker",
    "ElasticRootCause",
    "EventMerger",
    "KmsgReader",
    "LogFollower",
    "ScanStats",
    "XidClass",
    "XidInfo",
    "classify_line",
    "classify_training_line",
    "decode_line",
    "line_time",
    "merge_events",
    "parse_elastic_root_cause",
    "parse_kernel_line",
    "read_journal_kernel",
    "read_kmsg",
    "scan_bytes",
    "scan_file",
    "xid_catalog",
    "xid_info",
]

# Where each name lives (the followers are telemetry's): imported on first use, so `trainguard logs scan` loads only the modules
# it runs (not the followers' subprocess/shutil, say).
_HOME = {
    **dict.fromkeys(
        ["KmsgReader", "LogFollower", "decode_line", "read_journal_kernel", "read_kmsg"],
        "trainguard.telemetry.follow",
    ),
    **dict.fromkeys(["line_time", "parse_kernel_line"], f"{__name__}.kernel_log"),
    **dict.fromkeys(
        [
            "BurstTracker",
            "EventMerger",
            "ScanStats",
            "classify_line",
            "merge_events",
            "scan_bytes",
            "scan_file",
        ],
        f"{__name__}.scan",
    ),
    **dict.fromkeys(
        ["ElasticRootCause", "classify_training_line", "parse_elastic_root_cause"], f"{__name__}.training_log"
    ),
    **dict.fromkeys(["XidClass", "XidInfo", "xid_catalog", "xid_info"], f"{__name__}.xid"),
}


def __getattr__(name: str) -> Any:
    import importlib

    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
