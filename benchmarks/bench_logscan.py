"""Throughput of `trainguard logs scan --json` against `LC_ALL=C grep -E -n` on two generated logs.

    python benchmarks/bench_logscan.py                  # 1 GiB syslog + 145 MiB training log
    python benchmarks/bench_logscan.py --quick          # 64 MiB + 64 MiB, follow for 4 s
    python benchmarks/bench_logscan.py --json           # one JSON object
    python benchmarks/bench_logscan.py --cli-only --reps 12   # the NCCL_DEBUG=INFO case alone

The logs (``loggen.py``): a GPU node's syslog where 0.1% of lines are NVIDIA/NCCL/CUDA, and one
node's torchrun output with ``NCCL_DEBUG=INFO``: 42% ``NCCL INFO`` lines, step lines, framework
warnings, and two planted failures per 40,000 lines (a six-line watchdog timeout, a CUDA error
with torch's hints, NCCL WARN, OOM...). Each is written to a ``tempfile.mkdtemp()`` directory
removed at the end.

trainguard runs what the CLI runs (``scan_file`` + ``merge_events`` + the JSON writer, to a temp
file). The baseline is fixed: ``LC_ALL=C grep -E -n -f patterns.txt`` with the pattern list a
user would write for these failures (Xid, SXid, NCCL WARN, CUDA error, out of memory, watchdog,
timed out, illegal memory, ECC, segfault, Killed process, Traceback), output to a file (to
/dev/null GNU grep stops at the first match). The two alternate (grep, trainguard, grep, ...) on a
warm page cache, five pairs (three with ``--quick``); the median of the per-pair ratios counts. Then ``logs follow``'s loop follows the training log while a thread appends it at
50 MB/s; its thread CPU time over the wall time is the share of one core it needs.

Keys: ``ratio``, ``ratio_training`` and ``ratio_nccl_info_cli`` (the NCCL_DEBUG=INFO log as
processes, start-up included, with ``ratio_ci95_nccl_info_cli``; ``ratio_cpu_nccl_info_cli``
with its CI, grep's CPU seconds over the CLI's and its forked searchers', the figure that holds
when no core is free; ``load_average_nccl_info_cli`` over the pairs) (grep seconds / trainguard
seconds, target >= 1.0, with
``ratio_range``/``ratio_range_training`` over the pairs; and ``ratio_cpu``/``ratio_cpu_training``
from CPU time, all of trainguard's threads counted against grep's one),
``findings``/``findings_training`` with ``planted``/``planted_training`` (must be equal),
``follow_core_share`` (target < 1.0), ``follow_findings`` and ``follow_lag_s``; plus lines,
bytes, seconds, ``engine``, ``threads`` (``--threads 1`` for one core) and ``processes`` (the
searchers forked: this process runs one thread when it scans, as the CLI does; their CPU time
counts in ``ratio_cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import loggen
from targets import Target, finish
from trainguard.cli.logs import emit_events
from trainguard.detect.scan import EventMerger, ScanStats, merge_events, scan_bytes, scan_file
from trainguard.telemetry.follow import LogFollower

TARGET = 1.0
REAL_LINES = Path(__file__).resolve().parent.parent / "tests" / "data" / "real"
FOLLOW_RATE = 50 << 20  # bytes per second


def run_trainguard(
    path: Path, out_path: Path, engine: str, threads: int | None
) -> tuple[float, float, ScanStats, int]:
    """(wall seconds, CPU seconds of all threads and forked searchers, stats, findings printed)."""
    stats = ScanStats()
    start, cpu = time.perf_counter(), time.process_time() + _children_cpu()
    with out_path.open("w", encoding="utf-8", buffering=1 << 20) as out:
        events = scan_file(path, stats=stats, engine=engine, threads=threads)
        found = emit_events(merge_events(events), True, out)
    return time.perf_counter() - start, time.process_time() + _children_cpu() - cpu, stats, found


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_grep(grep: str, patterns: Path, path: Path, out_path: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, matching lines)."""
    env = {**os.environ, "LC_ALL": "C"}
    start, cpu = time.perf_counter(), _children_cpu()
    with out_path.open("wb") as out:
        subprocess.run([grep, "-E", "-n", "-f", str(patterns), str(path)], stdout=out, env=env, check=False)
    seconds, cpu_s = time.perf_counter() - start, _children_cpu() - cpu
    with out_path.open("rb") as fh:
        matches = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return seconds, cpu_s, matches


def compare(
    grep: str, patterns: Path, log: Path, tmp: Path, engine: str, threads: int | None, reps: int
) -> dict[str, float | int | str]:
    """``reps`` interleaved pairs (grep, then trainguard); the medians of the per-pair ratios."""
    with log.open("rb") as fh:  # warm the page cache for both sides
        while fh.read(16 << 20):
            pass
    pairs = []
    for _ in range(reps):
        g = run_grep(grep, patterns, log, tmp / "grep.out")
        pairs.append((g, run_trainguard(log, tmp / "trainguard.jsonl", engine, threads)))
    (_, _, grep_matches), (_, _, stats, found) = pairs[-1]
    return {"lines": stats.lines, "bytes": stats.bytes,
            "trainguard_s": _median(t[0] for _, t in pairs), "grep_s": _median(g[0] for g, _ in pairs),
            "ratio": _median(g[0] / t[0] for g, t in pairs),
            "trainguard_cpu_s": _median(t[1] for _, t in pairs), "grep_cpu_s": _median(g[1] for g, _ in pairs),
            "ratio_cpu": _median(g[1] / t[1] for g, t in pairs),
            "ratio_range": [round(min(g[0] / t[0] for g, t in pairs), 2), round(max(g[0] / t[0] for g, t in pairs), 2)],
            "findings": found, "grep_matches": grep_matches, "engine": stats.engine, "threads": stats.threads,
            "processes": stats.processes}  # fmt: skip


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("trainguard")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "trainguard.cli"]


def run_cli(log: Path, out_path: Path) -> tuple[float, float, int]:
    """``trainguard logs scan --json LOG`` as a user runs it: a new process, start-up included,
    from compiled bytecode as an installed package has it (PYTHONDONTWRITEBYTECODE is dropped,
    and `compare_cli` runs it once untimed). (wall seconds, CPU seconds of the process and its
    forked searchers, findings printed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start, cpu = time.perf_counter(), _children_cpu()
    with out_path.open("wb") as out:
        subprocess.run([*_cli(), "logs", "scan", "--json", str(log)], stdout=out, check=True, env=env)
    seconds, cpu_s = time.perf_counter() - start, _children_cpu() - cpu
    with out_path.open("rb") as fh:
        return seconds, cpu_s, sum(1 for _ in fh)


def compare_cli(grep: str, patterns: Path, log: Path, tmp: Path, reps: int) -> dict[str, object]:
    """``reps`` interleaved pairs of processes (grep, trainguard CLI); median ratios (wall and CPU)
    and a 95% bootstrap interval of each."""
    with log.open("rb") as fh:
        while fh.read(16 << 20):
            pass
    run_cli(log, tmp / "cli.jsonl")  # writes the bytecode caches, warms the page cache
    pairs, loads = [], []
    for _ in range(reps):
        g = run_grep(grep, patterns, log, tmp / "grep.out")
        pairs.append((g, run_cli(log, tmp / "cli.jsonl")))
        loads.append(os.getloadavg()[0])
    ratios = [g[0] / t[0] for g, t in pairs]
    cpu_ratios = [g[1] / t[1] for g, t in pairs]
    return {"cli_s": _median(t[0] for _, t in pairs), "grep_s": _median(g[0] for g, _ in pairs),
            "ratio": _median(ratios), "ratio_ci95": _median_ci95(ratios),
            "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)], "pairs": reps,
            "cli_cpu_s": _median(t[1] for _, t in pairs), "grep_cpu_s": _median(g[1] for g, _ in pairs),
            "ratio_cpu": _median(cpu_ratios), "ratio_cpu_ci95": _median_ci95(cpu_ratios),
            "load_average": [round(min(loads), 1), round(max(loads), 1)],
            "findings": pairs[-1][1][2], "grep_matches": pairs[-1][0][2]}  # fmt: skip


def _median_ci95(values: list[float]) -> list[float]:
    """A 95% bootstrap interval of the median."""
    import random

    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return [round(boot[50], 2), round(boot[1949], 2)]


def real_line_recall(real: list[str]) -> dict[str, int]:
    """Of the real failure lines: how many trainguard reports, how many the user's grep patterns match."""
    import re

    from trainguard.detect.scan import classify_line

    user = re.compile("|".join(loggen.USER_PATTERNS))
    return {"real_lines": len(real), "trainguard_found": sum(classify_line(x) is not None for x in real),
            "grep_found": sum(bool(user.search(x)) for x in real)}  # fmt: skip


def _searchers(r: dict[str, object]) -> str:
    return f"{r['processes']} processes" if r["processes"] != 1 else f"{r['threads']} thread(s)"


def _median(values: Iterable[float]) -> float:
    return round(statistics.median(values), 3)


def follow(source: Path, tmp: Path, seconds: float, interval: float = 0.1) -> dict[str, float | int]:
    """Append ``source`` to a new file at FOLLOW_RATE for ``seconds`` while following it as the CLI does."""
    data = source.read_bytes()[: int(FOLLOW_RATE * seconds) + 1]
    data = data[: data.rfind(b"\n") + 1]
    grown = tmp / "growing.log"
    grown.write_bytes(b"")
    done = threading.Event()

    def writer() -> None:
        step, start = FOLLOW_RATE // 20, time.monotonic()
        with grown.open("ab") as fh:
            for n, at in enumerate(range(0, len(data), step)):
                time.sleep(max(0.0, start + n / 20 - time.monotonic()))
                fh.write(data[at : at + step])
                fh.flush()
        done.set()

    follower, merger, stats = LogFollower(grown, poll_interval=interval), EventMerger(), ScanStats()
    found = 0
    thread = threading.Thread(target=writer, daemon=True)
    cpu0, wall0 = time.thread_time(), time.monotonic()
    thread.start()
    while True:
        finished = done.is_set()
        chunk = follower.poll_bytes()
        events = scan_bytes(chunk, name=str(grown), line_base=stats.lines, stats=stats)
        found += sum(1 for e in events if merger.is_new(e))
        if finished and not chunk:
            break
        if not chunk:
            time.sleep(interval)
    cpu, wall = time.thread_time() - cpu0, time.monotonic() - wall0
    follower.close()
    thread.join()
    return {"follow_mb_per_s": round(len(data) / (1 << 20) / seconds, 1), "follow_core_share": round(cpu / wall, 3),
            "follow_lag_s": round(wall - seconds, 2), "follow_findings": found, "follow_lines": stats.lines}  # fmt: skip


def _print_in_process(
    node: dict[str, Any], planted: int, rank: dict[str, Any], planted_training: int, reps: int
) -> None:
    for label, r, p in (
        ("syslog", node, planted),
        ("training log (NCCL_DEBUG=INFO)", rank, planted_training),
    ):
        print(f"{label}: {r['bytes'] / 2**20:.0f} MiB, {r['lines']:,} lines, {p} failures planted")
        print(
            f"  trainguard logs scan --json [{r['engine']}, {_searchers(r)}]: {r['trainguard_s']} s, "
            f"{r['findings']} findings"
        )
        print(
            f"  grep -E -n -f patterns.txt (LC_ALL=C):  {r['grep_s']} s, {r['grep_matches']:,} matching lines"
        )
        verdict = "meets" if float(r["ratio"]) >= TARGET else "misses"
        print(f"  ratio grep_s / trainguard_s (median of {reps} pairs): {r['ratio']} (range {r['ratio_range'][0]}-"
              f"{r['ratio_range'][1]}; {verdict} the {TARGET} target); "
              f"CPU time {r['trainguard_cpu_s']} s vs {r['grep_cpu_s']} s: {r['ratio_cpu']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mb", type=int, default=1024, help="size of the generated syslog (default 1024)"
    )
    parser.add_argument("--training-mb", type=int, default=145, help="size of the training log (default 145)")
    parser.add_argument(
        "--follow-s", type=float, default=8.0, help="seconds of 50 MB/s growth to follow (default 8)"
    )
    parser.add_argument("--quick", action="store_true", help="64 MiB logs, 4 s of following, 3 pairs")
    parser.add_argument("--reps", type=int, default=5, help="interleaved pairs of runs per log (default 5)")
    parser.add_argument(
        "--threads", type=int, default=None, help="search threads (default: one per CPU with hyperscan)"
    )
    parser.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "stdlib"])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--cli-only", action="store_true", help="only the NCCL_DEBUG=INFO log as processes (its target)"
    )
    args = parser.parse_args(argv)
    grep = shutil.which("grep")
    if grep is None:
        print("bench_logscan: GNU grep not found; it is the baseline", file=sys.stderr)
        return 2
    if args.quick:
        args.size_mb, args.training_mb, args.follow_s = 64, 64, 4.0
    tmp = Path(tempfile.mkdtemp(prefix="bench-logscan-"))
    try:
        patterns = tmp / "patterns.txt"
        patterns.write_text("\n".join(loggen.USER_PATTERNS) + "\n")
        syslog, training = tmp / "node.log", tmp / "rank.log"
        reps = 3 if args.quick else args.reps
        t0 = time.perf_counter()
        in_process: dict[str, object] = {}
        if not args.cli_only:
            planted = loggen.generate(syslog, args.size_mb << 20, loggen.syslog_block)
            planted_training = loggen.generate(training, args.training_mb << 20, loggen.training_block)
            node = compare(grep, patterns, syslog, tmp, args.engine, args.threads, reps)
            rank = compare(grep, patterns, training, tmp, args.engine, args.threads, reps)
            followed = follow(training, tmp, min(args.follow_s, training.stat().st_size / FOLLOW_RATE))
            in_process = {**node, "planted": planted,
                          **{f"{k}_training": v for k, v in rank.items() if k != "engine"},
                          "planted_training": planted_training, **followed}  # fmt: skip
        gen_s = time.perf_counter() - t0
        real = loggen.real_failure_lines(REAL_LINES)
        info = tmp / "nccl-info.log"
        planted_info = loggen.generate(
            info, args.training_mb << 20, lambda rng: loggen.nccl_info_block(rng, real)
        )
        cli = compare_cli(grep, patterns, info, tmp, max(reps, 5))
        recall = real_line_recall(real)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        **in_process,
        **{f"{k}_nccl_info_cli": v for k, v in cli.items()},
        "planted_nccl_info": planted_info,
        **recall,
        "in_process_s": round(gen_s, 2),
        "target_ratio": TARGET,
    }
    skipped = args.cli_only  # the in-process figures are not measured with --cli-only
    targets = (
        Target("ratio", ">=", TARGET, optional=skipped),
        Target("ratio_training", ">=", TARGET, optional=skipped),
        Target("follow_core_share", "<", 1.0, optional=skipped),
        Target("ratio_nccl_info_cli", ">=", TARGET),  # as processes, start-up included
    )
    if args.json:
        print(json.dumps(result))
        return finish("bench_logscan", targets, result, json_mode=True)
    if not args.cli_only:
        _print_in_process(node, planted, rank, planted_training, reps)
    print(
        f"NCCL_DEBUG=INFO job log ({args.training_mb} MiB: 70% NCCL INFO, steps, torch.compile warnings, "
        f"{planted_info} planted failures, half of them real lines), as processes, start-up included:"
    )
    print(
        f"  trainguard logs scan --json: {cli['cli_s']} s, {cli['findings']} findings; grep -E -n -f patterns.txt: "
        f"{cli['grep_s']} s, {cli['grep_matches']:,} matching lines"
    )
    print(
        f"  ratio grep_s / trainguard_s (median of {cli['pairs']} pairs): {cli['ratio']} (95% CI {cli['ratio_ci95'][0]}-"
        f"{cli['ratio_ci95'][1]}, range {cli['ratio_range'][0]}-{cli['ratio_range'][1]}; target {TARGET}); "
        f"CPU time {cli['cli_cpu_s']} s vs {cli['grep_cpu_s']} s: {cli['ratio_cpu']} (95% CI "
        f"{cli['ratio_cpu_ci95'][0]}-{cli['ratio_cpu_ci95'][1]}); load average {cli['load_average']}"
    )
    print(
        f"real failure lines from public reports: trainguard reports {recall['trainguard_found']} of "
        f"{recall['real_lines']}, the grep patterns match {recall['grep_found']}"
    )
    if not args.cli_only:
        print(f"logs follow at {followed['follow_mb_per_s']} MB/s: {followed['follow_core_share']} of a core, "
              f"{followed['follow_findings']} findings, done {followed['follow_lag_s']} s after the writer")  # fmt: skip
    return finish("bench_logscan", targets, result)


if __name__ == "__main__":
    sys.exit(main())
