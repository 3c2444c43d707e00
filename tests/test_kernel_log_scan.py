"""The bulk file scanner finds exactly what line-by-line classification finds, at the right lines."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainguard.actions import Advice
from trainguard.detect import scan as scan_mod
from trainguard.detect import searchers
from trainguard.detect.scan import BurstTracker, ScanStats, classify_line, scan_engine, scan_file
from trainguard.errors import InputError
from trainguard.records import Severity

DATA = Path(__file__).parent / "data"
ENGINES = ["stdlib", *(["hyperscan"] if scan_engine() == "hyperscan" else [])]
FILLER = [
    "Nov 22 08:40:07 node3 systemd[1]: Started Session 1234 of user root.",
    "Nov 22 08:40:07 node3 sshd[2211]: Accepted publickey for ops from 10.0.0.5 port 51234 ssh2",
    "Nov 22 08:40:08 node3 kubelet[1200]: I1122 08:40:08.123 kubelet.go:1234] SyncLoop UPDATE",
    "Nov 22 08:40:09 node3 chronyd[650]: Selected source 10.0.0.1",
]


def _golden_lines() -> list[str]:
    kernel = (DATA / "kernel" / "variants.log").read_text(encoding="utf-8").splitlines()
    training = (DATA / "training" / "rank_failures.log").read_text(encoding="utf-8").splitlines()
    return kernel + training


def _mixed_file(tmp_path: Path, n: int = 3000, seed: int = 0) -> tuple[Path, list[str]]:
    rng = random.Random(seed)
    golden = _golden_lines()
    lines = [rng.choice(golden) if rng.random() < 0.05 else rng.choice(FILLER) for _ in range(n)]
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


def _reference(lines: list[str]) -> list[tuple[int, str, int | None, str | None, str]]:
    out = []
    for no, line in enumerate(lines, 1):
        event = classify_line(line)
        if event is not None:
            out.append((no, event.kind.value, event.xid, event.pci, event.category.value))
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("chunk", "threads"), [(4096, 1), (4096, 3), (1 << 20, None)])
def test_scan_finds_what_line_by_line_classification_finds(tmp_path, engine, chunk, threads):
    path, lines = _mixed_file(tmp_path)
    stats = ScanStats()
    got = [(e.line_no, e.kind.value, e.xid, e.pci, e.category.value)
           for e in scan_file(path, stats=stats, engine=engine, chunk_size=chunk, threads=threads)]  # fmt: skip
    want = _reference(lines)
    assert len(want) > 50
    assert got == want
    assert stats.lines == len(lines)
    assert stats.bytes == path.stat().st_size
    assert stats.findings == len(want)
    assert stats.engine == engine


@pytest.mark.parametrize("engine", ENGINES)
def test_stdin_is_scanned_like_the_file_at_the_same_line_numbers(tmp_path, monkeypatch, engine):
    path, lines = _mixed_file(tmp_path)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    stats = ScanStats()
    got = [
        (e.path, e.line_no, e.category.value)
        for e in scan_file("-", stats=stats, engine=engine, chunk_size=4096)
    ]
    assert got == [("-", no, category) for no, _, _, _, category in _reference(lines)]
    assert stats.lines == len(lines) and stats.threads == 1


def test_a_file_of_one_run_is_searched_without_a_thread_pool(tmp_path, monkeypatch):
    path, lines = _mixed_file(tmp_path, n=200)  # far under one 1 MiB run
    started: list[int] = []
    real = searchers.threaded
    monkeypatch.setattr(
        scan_mod, "threaded", lambda work, spans, n: started.append(n) or real(work, spans, n)
    )
    stats = ScanStats()
    got = [(e.line_no, e.category.value) for e in scan_file(path, stats=stats, threads=4)]
    assert got == [(no, category) for no, _, _, _, category in _reference(lines)]
    assert started == [1] and stats.threads == 1


def test_a_scan_stopped_early_leaves_no_search_thread_running(tmp_path):
    path, _ = _mixed_file(tmp_path, n=20_000)
    events = scan_file(path, chunk_size=4096, threads=4)
    next(events)
    events.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("trainguard-scan")]


@pytest.mark.parametrize("engine", ENGINES)
def test_binary_garbage_is_skipped_and_counted_without_shifting_line_numbers(tmp_path, engine):
    xid = b"[ 1.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    path = tmp_path / "garbage.log"
    path.write_bytes(
        b"ok line\n\x00\x00NVRM\x00\x01\n\xff\xfe NVRM Xid \xc3\x28\n" + xid + b"\nCUDA \xe2\x82\n"
    )
    stats = ScanStats()
    events = list(scan_file(path, stats=stats, engine=engine))
    assert [(e.line_no, e.xid) for e in events] == [(4, 79)]
    assert stats.skipped == 3
    assert stats.lines == 5


def test_overlong_line_is_skipped_and_scanning_goes_on(tmp_path):
    path = tmp_path / "long.log"
    line = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    path.write_bytes(b"x" * (2 * scan_mod.MAX_LINE) + b"\n" + line + b"\n")
    stats = ScanStats()
    events = list(scan_file(path, stats=stats, chunk_size=1 << 16))
    assert [(e.line_no, e.xid) for e in events] == [(2, 79)]
    assert stats.skipped == 1 and stats.lines == 2


@pytest.mark.parametrize("threads", [1, 2])
def test_overlong_lines_count_the_same_in_a_file_and_through_stdin(tmp_path, monkeypatch, threads):
    xid = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    data = xid + b"\n" + b"y" * (3 * scan_mod.MAX_LINE) + b"\n" + xid + b"\n" + b"z" * (2 * scan_mod.MAX_LINE)
    path = tmp_path / "long.log"
    path.write_bytes(data)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    for source in (path, "-"):
        stats = ScanStats()
        assert [e.line_no for e in scan_file(source, stats=stats, chunk_size=1 << 16, threads=threads)] == [
            1,
            3,
        ]
        assert (stats.lines, stats.skipped) == (4, 2)


def test_last_line_without_newline_and_crlf_endings_are_handled(tmp_path):
    path = tmp_path / "crlf.log"
    path.write_bytes(b"a\r\nRuntimeError: CUDA error: an illegal memory access was encountered\r\nKilled")
    events = list(scan_file(path))
    assert [(e.line_no, e.category.value) for e in events] == [(2, "unknown"), (3, "node_host")]
    assert not events[0].text.endswith("\r")


def test_empty_file_has_no_findings(tmp_path):
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    stats = ScanStats()
    assert list(scan_file(path, stats=stats)) == []
    assert stats.lines == 0


def test_missing_file_and_directory_are_input_errors_naming_the_path(tmp_path):
    with pytest.raises(InputError, match=r"nope\.log"):
        scan_file(tmp_path / "nope.log")
    with pytest.raises(InputError, match="directory"):
        scan_file(tmp_path)


def test_unknown_engine_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="engine"):
        scan_file(tmp_path / "x", engine="grep")


def _xid(code: int, pci: str, stamp: str = "") -> str:
    return f"{stamp}NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python, text"


def test_xid_45_after_another_xid_on_the_same_gpu_is_sympathetic(tmp_path):
    path = tmp_path / "burst.log"
    path.write_text(
        "\n".join([
            _xid(13, "0000:3b:00", "[  100.000000] "),
            _xid(45, "0000:3b:00", "[  103.000000] "),  # 3 s later, same GPU: sympathetic
            _xid(45, "0000:5e:00", "[  103.500000] "),  # other GPU: alone
            _xid(45, "0000:3b:00", "[  200.000000] "),  # far outside the window: alone
        ]) + "\n"
    )  # fmt: skip
    events = list(scan_file(path))
    assert [e.sympathetic for e in events] == [False, True, False, False]
    assert (events[1].severity, events[1].action) == (Severity.INFO, Advice.IGNORE)
    assert events[2].action is Advice.RESTART_APP


def test_without_timestamps_the_burst_is_counted_in_lines(tmp_path):
    path = tmp_path / "nostamp.log"
    path.write_text("\n".join([_xid(31, "0000:3b:00"), "filler", _xid(45, "0000:3b:00"), *["x"] * 50,
                               _xid(45, "0000:3b:00")]) + "\n")  # fmt: skip
    assert [e.sympathetic for e in scan_file(path)] == [False, True, False]


def test_burst_tracker_window_is_configurable(tmp_path):
    path = tmp_path / "window.log"
    path.write_text(
        _xid(48, "0000:3b:00", "[ 10.000000] ") + "\n" + _xid(45, "0000:3b:00", "[ 40.000000] ") + "\n"
    )
    assert [e.sympathetic for e in scan_file(path)] == [False, False]
    assert [e.sympathetic for e in scan_file(path, tracker=BurstTracker(window_s=60))] == [False, True]


def test_the_scanners_fast_replace_keeps_every_event_field():
    import dataclasses

    from trainguard.actions import Advice
    from trainguard.detect.scan import _at
    from trainguard.records import Category, Event, EventKind, Severity

    values = {"kind": EventKind.XID, "text": "t", "time": 1.0, "xid": 79, "pci": "0000:3b:00", "uuid": "GPU-1",
              "pid": 7, "process": "python", "category": Category.GPU_HARDWARE, "severity": Severity.FATAL,
              "action": Advice.REBOOT_NODE, "sympathetic": True, "path": "a", "line_no": 1}  # fmt: skip
    assert set(values) == {f.name for f in dataclasses.fields(Event)}  # a new field needs a value here
    event = Event(**values)  # type: ignore[arg-type]
    assert _at(event, "b", 2) == dataclasses.replace(event, path="b", line_no=2)


def _children() -> set[int]:
    """This process's children (Linux), the exited but not yet reaped included."""
    pids = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as fh:
            pids.update(int(p) for p in fh.read().split())
    return pids


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.fixture
def forking(monkeypatch):
    """Forked searchers for any file, whatever other threads this test process runs."""
    monkeypatch.setattr(scan_mod, "FORK_FROM", 0)
    monkeypatch.setattr(scan_mod, "alone", lambda: True)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("processes", [2, 3])
def test_forked_searchers_find_what_line_by_line_classification_finds(tmp_path, forking, engine, processes):
    path, lines = _mixed_file(tmp_path, n=6000)
    stats, before = ScanStats(), _children()
    got = [(e.line_no, e.kind.value, e.xid, e.pci, e.category.value)
           for e in scan_file(path, stats=stats, engine=engine, chunk_size=4096, threads=processes)]  # fmt: skip
    assert got == _reference(lines)
    assert (stats.processes, stats.lines, stats.findings) == (processes, len(lines), len(got))
    assert _children() == before


def test_a_forked_scan_stopped_early_leaves_no_process(tmp_path, forking):
    path, _ = _mixed_file(tmp_path, n=20_000)
    before = _children()
    events = scan_file(path, chunk_size=4096, threads=3)
    next(events)
    assert len(_children() - before) == 2  # searching, or done and not yet reaped
    events.close()
    assert _children() == before


def test_what_a_dead_searcher_did_not_send_is_searched_here(tmp_path):
    """The OOM killer takes a child mid-share: no finding is lost, none is doubled."""
    spans = [(n, n + 1, False) for n in range(0, 40)]
    parent = os.getpid()

    def work(span):
        if os.getpid() != parent and span[0] == 25:
            os.kill(os.getpid(), signal.SIGKILL)
        return searchers.Run([(0, str(span[0]).encode())], 1, 0)

    before = _children()
    runs = list(searchers.forked(work, [spans[:20], spans[20:]]))
    assert [r.lines[0][1] for r in runs] == [str(n).encode() for n in range(40)]
    assert _children() == before


def test_a_searcher_dies_with_its_parent(tmp_path):
    """The parent killed outright (no finally runs): its forked searchers stop at their next run."""
    script = (
        "import os, sys, time\n"
        "from trainguard.detect import searchers\n"
        "def work(span):\n"
        "    time.sleep(0.05)\n"
        "    return searchers.Run([], 1, 0)\n"
        "spans = [(n, n + 1, False) for n in range(2000)]\n"
        "runs = searchers.forked(work, [spans[:700], spans[700:1400], spans[1400:]])\n"
        "next(runs)\n"
        "kids = open(f'/proc/self/task/{os.getpid()}/children').read().split()\n"
        "print(' '.join(kids), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    kids = [int(p) for p in out.stdout.split()]
    assert len(kids) == 2, out.stderr
    deadline = time.monotonic() + 30  # each stops within one 50 ms run; the ceiling is for a loaded host
    while any(_state(p) not in ("Z", None) for p in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_state(p) in ("Z", None) for p in kids)


def test_the_cli_names_its_forked_searchers(tmp_path, forking, capsys):
    from trainguard.cli import main

    path, lines = _mixed_file(tmp_path)
    before = _children()
    assert main(["logs", "scan", "--every-line", str(path)]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 + len(_reference(lines))  # the header, a line per finding
    assert f"{len(_reference(lines))} finding(s) in {len(lines)} line(s) [" in err
    assert " processes]" in err and _children() == before


def test_a_searcher_that_cannot_be_forked_costs_only_speed(tmp_path, forking, monkeypatch):
    path, lines = _mixed_file(tmp_path, n=6000)
    forks = []

    def fork():
        if forks:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        forks.append(1)
        return real_fork()

    real_fork, before, fds = os.fork, _children(), sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", fork)
    got = [(e.line_no, e.category.value) for e in scan_file(path, chunk_size=4096, threads=4)]
    assert got == [(no, category) for no, _, _, _, category in _reference(lines)]
    assert len(forks) == 1 and _children() == before
    assert sorted(os.listdir("/proc/self/fd")) == fds  # the failed fork's pipe is closed
