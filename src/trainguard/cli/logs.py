"""``trainguard logs scan PATH... [--json]``, ``logs follow PATH [--json]`` (and ``logs explain``).

Classify kernel-log lines (Xid, SXid, fallen off the bus, GPU map) and training-log lines (NCCL,
CUDA, OOM, torchelastic, crashes). ``--json`` prints one object per finding per line; lines that
are not findings print nothing. Exit 0, or 2 when a path cannot be read or is a binary file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, TextIO

from trainguard.cli.interrupt import quits_on_ctrl_c

if TYPE_CHECKING:
    from trainguard.detect.scan import ScanStats
    from trainguard.records import Event

_TABLE = "{loc:<28} {kind:<8} {xid:>5} {pci:<10} {severity:<7} {action:<15} {category:<17} {text}"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs",
        help="classify kernel and training logs (Xid, SXid, NCCL, CUDA, OOM...)",
        description="Find GPU, NCCL, CUDA and host failures in kernel logs and training logs.",
    )
    sub = parser.add_subparsers(dest="logs_command", metavar="ACTION")
    scan = sub.add_parser(
        "scan",
        help="classify whole files (dmesg, syslog, journal exports, training logs)",
        description="Print every failure in the given logs: Xid/SXid and fallen-off-the-bus lines of kernel "
        "logs; NCCL, CUDA, OOM, host and crash lines of training logs. One finding per failure (torch's "
        "six-line watchdog timeout is one); exit 0, or 2 when a path cannot be read or is a binary file.",
    )
    scan.add_argument("paths", nargs="+", metavar="PATH", help="log files to scan ('-' reads stdin)")
    _common(scan)
    scan.add_argument(
        "--engine",
        choices=["auto", "hyperscan", "stdlib"],
        default="auto",
        help="bulk search engine (auto: hyperscan when installed)",
    )
    scan.set_defaults(func=run_scan)
    follow = sub.add_parser(
        "follow",
        help="classify lines as they are appended (survives rotation)",
        description="Like tail -F, printing the failures among the lines appended to a log file or /dev/kmsg "
        "(rotation and truncation are followed; a fast-growing file is scanned in bulk); exit 0, or 2 when "
        "the file is missing or a binary file.",
    )
    follow.add_argument("path", metavar="PATH", help="a log file, or /dev/kmsg")
    _common(follow)
    follow.add_argument("--from-start", action="store_true", help="classify what is already there first")
    follow.add_argument("--interval", type=float, default=0.5, help="seconds between polls (default 0.5)")
    follow.add_argument(
        "--max-seconds", type=float, default=None, help="stop after this long (default: never)"
    )
    follow.set_defaults(func=run_follow)
    _add_explain(sub)

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _add_explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser(
        "explain",
        help="name the rank whose failure brought a multi-rank job down",
        description="Read every rank's log of a failed job and tell the root-cause finding (rank, host, "
        "GPU, time, line) from its consequences (other ranks' watchdog timeouts and aborted "
        "communicators), with the action to take.",
    )
    explain.add_argument(
        "paths", nargs="+", metavar="DIR|FILE", help="a torchrun --log-dir, Slurm per-task files, or one file"
    )
    explain.add_argument("--json", action="store_true", help="print one JSON object")
    explain.add_argument(
        "--advise",
        action="store_true",
        help="exit with the recommendation's code: 0 no failure, 75 restart, 76 restart without the named "
        "GPU/node, 3 stop (workload bug: do not requeue), 1 stop (retry budget spent without progress)",
    )
    explain.add_argument(
        "--engine", choices=["auto", "hyperscan", "stdlib"], default="auto", help=argparse.SUPPRESS
    )
    explain.set_defaults(func=_run_explain)


def _run_explain(args: argparse.Namespace) -> int:
    from trainguard.cli.logs_explain import run_explain  # its imports are not `logs scan`'s to pay

    return run_explain(args)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per finding, one per line")
    parser.add_argument(
        "--every-line",
        action="store_true",
        help="print every line that is a finding, also the follow-up lines of one failure "
        "(by default one NCCL watchdog timeout printed as six lines is one finding)",
    )
    parser.add_argument(
        "--burst-window",
        type=float,
        default=10.0,
        metavar="S",
        help="an Xid 45 within S seconds after another Xid on the same GPU is sympathetic (default 10)",
    )


def event_json(event: Event) -> dict[str, object]:
    return {
        "path": event.path,
        "line_no": event.line_no,
        "kind": event.kind.value,
        "xid": event.xid,
        "pci": event.pci,
        "category": event.category.value,
        "severity": event.severity.value,
        "action": event.action.value,
        "sympathetic": event.sympathetic,
        "time": event.time,
        "uuid": event.uuid,
        "pid": event.pid,
        "process": event.process,
        "text": event.text,
    }


def emit_events(events: Iterable[Event], as_json: bool, out: TextIO) -> int:
    count = 0
    for event in events:
        count += 1
        if as_json:
            out.write(json.dumps(event_json(event)) + "\n")
            continue
        text = event.text if len(event.text) <= 100 else event.text[:97] + "..."
        severity = event.severity.value + ("*" if event.sympathetic else "")
        out.write(
            _TABLE.format(loc=f"{event.path}:{event.line_no}", kind=event.kind.value,
                          xid="" if event.xid is None else event.xid, pci=event.pci or "", severity=severity,
                          action=event.action.value, category=event.category.value, text=text) + "\n"
        )  # fmt: skip
    return count


def emit_header(as_json: bool, out: TextIO) -> None:
    if not as_json:
        out.write(_TABLE.format(loc="PATH:LINE", kind="KIND", xid="XID", pci="PCI", severity="SEVERITY",
                                action="ACTION", category="CATEGORY", text="TEXT") + "\n")  # fmt: skip


_SNIFF_BYTES = 1 << 16  # how much of a file `logs follow` reads first to tell a binary file


def not_a_log(path: str, stats: ScanStats) -> str:
    """The error for a binary file given as a log (``stats``: its scan)."""
    return (
        f"{path}: a binary file, not a log ({stats.skipped} of {stats.lines} line(s) are not text); "
        "give a text log (decompress it first)"
    )


def run_scan(args: argparse.Namespace) -> int:
    from trainguard.detect.scan import BurstTracker, ScanStats, merge_events, scan_file
    from trainguard.errors import InputError

    out, status = sys.stdout, 0
    emit_header(args.json, out)
    for path in args.paths:
        stats = ScanStats()
        try:
            events = scan_file(path, stats=stats, engine=args.engine, tracker=BurstTracker(args.burst_window))
            found = emit_events(events if args.every_line else merge_events(events), args.json, out)
        except InputError as exc:
            print(f"trainguard logs scan: error: {exc}", file=sys.stderr)
            status = 2
            continue
        except BrokenPipeError:  # `| head`: the reader has seen enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return status
        if stats.looks_binary():
            print(f"trainguard logs scan: error: {not_a_log(path, stats)}", file=sys.stderr)
            status = 2
            continue
        if stats.skipped:
            print(
                f"trainguard logs scan: {path}: skipped {stats.skipped} binary or non-UTF-8 line(s)",
                file=sys.stderr,
            )
        if not args.json:
            searchers = (f", {stats.processes} processes" if stats.processes > 1
                         else f", {stats.threads} threads" if stats.threads > 1 else "")  # fmt: skip
            print(
                f"# {path}: {found} finding(s) in {stats.lines} line(s) [{stats.engine}{searchers}]",
                file=sys.stderr,
            )
    return status


@quits_on_ctrl_c  # also when started with SIGINT ignored (`cmd &` in a script, CI)
def run_follow(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trainguard.detect.scan import BurstTracker, EventMerger, ScanStats, scan_bytes
    from trainguard.errors import InputError
    from trainguard.telemetry.follow import KmsgReader, LogFollower

    if not Path(args.path).exists():  # a typo, most likely; the Python API waits for the file instead
        raise InputError(f"{args.path}: no such file")
    source: KmsgReader | LogFollower
    if args.path == "/dev/kmsg" or str(args.path).endswith("/kmsg"):
        source = KmsgReader(args.path, from_start=args.from_start)
    else:
        head = ScanStats()  # what scan would refuse: its start, whether followed from there or not
        with open(args.path, "rb") as f:
            scan_bytes(f.read(_SNIFF_BYTES), name=args.path, stats=head)
        if head.looks_binary():
            raise InputError(not_a_log(args.path, head))
        source = LogFollower(args.path, from_start=args.from_start, poll_interval=args.interval)
    tracker, merger, stats = BurstTracker(args.burst_window), EventMerger(), ScanStats()
    deadline = None if args.max_seconds is None else time.monotonic() + args.max_seconds
    out = sys.stdout
    scan_bytes(b"", name=args.path)  # the engine imported and compiled before we say we follow
    emit_header(args.json, out)
    try:
        while deadline is None or time.monotonic() < deadline:
            if isinstance(source, LogFollower):
                data = source.poll_bytes()
            else:
                data = "".join(line + "\n" for line in source.poll()).encode()
            base = stats.lines
            events = scan_bytes(data, name=args.path, line_base=base, stats=stats, tracker=tracker)
            emit_events([e for e in events if args.every_line or merger.is_new(e)], args.json, out)
            out.flush()
            if not data:
                time.sleep(
                    args.interval
                    if deadline is None
                    else max(0.0, min(args.interval, deadline - time.monotonic()))
                )
    finally:
        source.close()
        skipped = source.skipped + stats.skipped
        if skipped:
            print(f"trainguard logs follow: skipped {skipped} binary or non-UTF-8 line(s)", file=sys.stderr)
    return 0
