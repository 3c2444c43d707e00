"""Throughput of `trainguard logs scan --json` against GNU grep -E on the same generated log.

    python benchmarks/bench_logscan.py                 # 1 GiB log, human summary
    python benchmarks/bench_logscan.py --size-mb 64    # a quick try
    python benchmarks/bench_logscan.py --json          # one JSON object

The log is a GPU node's syslog: many daemons (systemd, sshd, kubelet, containerd, slurmd, chrony,
the kernel's NIC/IB/PCIe/NVMe chatter, training steps), about 0.5% of lines that carry an anchor
word without being a finding ("ACPI Error", "Error getting v2 registry"), and about 0.1% NVIDIA /
NCCL / CUDA lines, two thirds of them findings (Xid, SXid, NCCL WARN and timeouts, CUDA errors,
OOM kills) and the rest NCCL INFO / driver banners. It is built by repeating four pre-built
blocks, in a ``tempfile.mkdtemp()`` directory removed at the end.

trainguard runs the same code as the CLI (``scan_file`` + the CLI's JSON writer, output to a temp
file). The baseline is ``LC_ALL=C grep -E -n ANCHORS FILE > tmpfile`` with the same anchor
literals the scanner searches for; output goes to a file because GNU grep stops at the first match
when its output is /dev/null. Each side runs twice on a warm page cache; the best run counts.
Keys: ``lines``, ``bytes``, ``trainguard_lines_per_s``, ``grep_lines_per_s``, ``ratio``
(trainguard / grep), ``findings``, plus ``engine``, ``grep_matches`` and the seconds. Target: ratio >= 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard.cli.logs import emit_events
from trainguard.detect.scan import ANCHORS, ScanStats, scan_file

TARGET = 0.5

NOISE = [
    "systemd[1]: Started Session {n} of user slurm.",
    "systemd[1]: session-{n}.scope: Deactivated successfully.",
    "sshd[{pid}]: Accepted publickey for ops from 10.2.{a}.{b} port {port} ssh2: ED25519 SHA256:q8R1xq0lV2",
    "sshd[{pid}]: pam_unix(sshd:session): session opened for user ops(uid=1000) by (uid=0)",
    'kubelet[1873]: I1122 08:{mm}:{ss}.{us} 1873 kubelet_pods.go:1090] "Clean up pod" pod="train/worker-{n}"',
    'containerd[1402]: time="2026-11-22T08:{mm}:{ss}.{us}Z" level=info msg="shim disconnected" id={hex}',
    'containerd[1402]: time="2026-11-22T08:{mm}:{ss}.{us}Z" level=error msg="failed to delete" id={hex}',
    "slurmd[2010]: launch task StepId={n}.0 request from UID:1000 GID:1000 HOST:10.2.{a}.{b} PORT:{port}",
    "slurmstepd[{pid}]: done with job {n}",
    "chronyd[990]: Selected source 10.2.0.{a} (ntp{b}.cluster.local)",
    "CRON[{pid}]: (root) CMD (/usr/local/bin/node-exporter-textfile.sh)",
    "rsyslogd[880]: imjournal: {n} messages lost due to rate-limiting (20000 allowed within 600 seconds)",
    "kernel: [{up}] mlx5_core 0000:{bus}:00.0: mlx5_fw_tracer_handle_traces:742:(pid {pid}): FWTracer: Events were lost",
    "kernel: [{up}] IPv4: martian source 10.2.{a}.{b} from 10.2.{b}.{a}, on dev ib0",
    "kernel: [{up}] pcieport 0000:{bus}:01.0: AER: Corrected error received: 0000:{bus}:00.0",
    "kernel: [{up}] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "nvidia-persistenced[1201]: device 0000:{bus}:00.0 - persistence mode enabled.",
    "nv-hostengine[1311]: DCGM field watch updated for group {n}",
    "python[{pid}]: step {n} | loss 2.{us} | lr 3.0e-4 | grad_norm 0.{b} | 412 TFLOP/s",
    "kernel: [{up}] nvme nvme0: I/O {n} QID 7 timeout, completion polled",
    "systemd-logind[1100]: New session {n} of user ops.",
    "NetworkManager[1050]: <info>  [1763800807.{us}] device (ib0): carrier: link connected",
    'node_exporter[1600]: ts=2026-11-22T08:{mm}:{ss}.{us}Z caller=collector.go:169 level=warn msg="collector failed"',
]
# lines that carry an anchor literal but are not findings (the scanner must still look at them)
NEAR = [
    'dockerd[1500]: time="2026-11-22T08:{mm}:{ss}Z" level=warning msg="Error getting v2 registry: timeout"',
    "kernel: [{up}] ACPI Error: AE_NOT_FOUND, While resolving a named reference package element (20210730/dspkginit-438)",
]
NVIDIA_INFO = [
    "python[{pid}]: node{a}:{pid}:{pid} [{b}] NCCL INFO Channel 0{b}/32 :    0   1   2   3   4   5   6   7",
    "python[{pid}]: node{a}:{pid}:{pid} [{b}] NCCL INFO comm 0x55d3c8a0 rank {b} nranks 512 - Init COMPLETE",
    "kernel: [{up}] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024",
]
FINDINGS = [
    "kernel: [{up}] NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, name=python, GPU has fallen off the bus.",
    "kernel: [{up}] NVRM: Xid (PCI:0000:{bus}:00): 13, pid={pid}, name=python, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
    "kernel: [{up}] NVRM: Xid (PCI:0000:{bus}:00): 48, pid={pid}, name=python, An uncorrectable double bit error (DBE) has been detected.",
    "kernel: [{up}] nvidia-nvswitch2: SXid (PCI:0000:{bus}:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
    "python[{pid}]: node{a}:{pid}:{pid} [{b}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.2.{a}.{b}<{port}> with error 12, opcode 0, len 0, vendor err 129",
    "python[{pid}]: [rank{b}]:[E1122 08:{mm}:{ss}.{us} ProcessGroupNCCL.cpp:616] [Rank {b}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.",
    "python[{pid}]: RuntimeError: CUDA error: an illegal memory access was encountered",
    "python[{pid}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {b} has a total capacity of 79.10 GiB",
    "kernel: [{up}] Out of memory: Killed process {pid} (python) total-vm:81234567kB, anon-rss:51234567kB, file-rss:0kB",
]  # fmt: skip


def _line(template: str, rng: random.Random, i: int) -> str:
    mm, ss = (i // 60) % 60, i % 60
    fields = dict(n=rng.randrange(1, 99999), pid=rng.randrange(300, 65000), a=rng.randrange(256), b=rng.randrange(8),
                  port=rng.randrange(1024, 65535), mm=f"{mm:02d}", ss=f"{ss:02d}", us=f"{rng.randrange(10**6):06d}",
                  hex=f"{rng.getrandbits(64):016x}", up=f"{1000 + i * 0.01:12.6f}", bus=f"{rng.choice([0x18, 0x3b, 0x5e, 0x86, 0xaf, 0xd8]):02x}")  # fmt: skip
    return f"Nov 22 08:{mm:02d}:{ss:02d} gpu-node-{fields['a']:03d} " + template.format(**fields)


def build_block(
    rng: random.Random, n_lines: int = 40_000, nvidia_rate: float = 0.001, near_rate: float = 0.005
) -> bytes:
    """~0.1% NVIDIA/NCCL/CUDA lines (two thirds of them findings), ~0.5% anchor-bearing noise, the rest noise."""
    lines = []
    for i in range(n_lines):
        roll = rng.random()
        if roll < nvidia_rate:
            group = FINDINGS if rng.random() < 2 / 3 else NVIDIA_INFO
        elif roll < nvidia_rate + near_rate:
            group = NEAR
        else:
            group = NOISE
        lines.append(_line(rng.choice(group), rng, i))
    return ("\n".join(lines) + "\n").encode()


def generate(path: Path, size: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    blocks = [build_block(rng) for _ in range(4)]
    written = 0
    with path.open("wb") as fh:
        while written < size:
            block = blocks[(written // len(blocks[0])) % len(blocks)]
            fh.write(block)
            written += len(block)


def run_trainguard(path: Path, out_path: Path, engine: str) -> tuple[float, ScanStats]:
    stats = ScanStats()
    start = time.perf_counter()
    with out_path.open("w", encoding="utf-8", buffering=1 << 20) as out:
        emit_events(scan_file(path, stats=stats, engine=engine), True, out)
    return time.perf_counter() - start, stats


def run_grep(grep: str, path: Path, out_path: Path) -> tuple[float, int]:
    pattern = "|".join(re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", a.decode()) for a in ANCHORS)  # ERE escaping
    env = {**os.environ, "LC_ALL": "C"}
    start = time.perf_counter()
    with out_path.open("wb") as out:
        subprocess.run([grep, "-E", "-n", pattern, str(path)], stdout=out, env=env, check=False)
    seconds = time.perf_counter() - start
    with out_path.open("rb") as fh:
        matches = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    return seconds, matches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (default 1024)")
    parser.add_argument("--quick", action="store_true", help="same as --size-mb 64")
    parser.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "stdlib"])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    grep = shutil.which("grep")
    if grep is None:
        print("bench_logscan: GNU grep not found; it is the baseline", file=sys.stderr)
        return 2
    size = (64 if args.quick else args.size_mb) << 20
    tmp = Path(tempfile.mkdtemp(prefix="bench-logscan-"))
    try:
        log = tmp / "node.log"
        t0 = time.perf_counter()
        generate(log, size)
        gen_s = time.perf_counter() - t0
        with log.open("rb") as fh:  # warm the page cache for both sides
            while fh.read(16 << 20):
                pass
        tg_runs, grep_runs = [], []
        for _ in range(2):
            grep_runs.append(run_grep(grep, log, tmp / "grep.out"))
            tg_runs.append(run_trainguard(log, tmp / "trainguard.jsonl", args.engine))
        tg_s, stats = min(tg_runs, key=lambda r: r[0])
        grep_s, grep_matches = min(grep_runs, key=lambda r: r[0])
        result = {
            "lines": stats.lines,
            "bytes": stats.bytes,
            "trainguard_lines_per_s": round(stats.lines / tg_s),
            "grep_lines_per_s": round(stats.lines / grep_s),
            "ratio": round(grep_s / tg_s, 3),
            "findings": stats.findings,
            "engine": stats.engine,
            "grep_matches": grep_matches,
            "trainguard_s": round(tg_s, 3),
            "grep_s": round(grep_s, 3),
            "generate_s": round(gen_s, 2),
            "target_ratio": TARGET,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"log: {result['bytes'] / 2**20:.0f} MiB, {result['lines']:,} lines (generated in {result['generate_s']} s)"
        )
        print(f"trainguard logs scan --json [{result['engine']}]: {result['trainguard_s']} s, "
              f"{result['trainguard_lines_per_s']:,} lines/s, {result['findings']:,} findings")  # fmt: skip
        print(f"grep -E -n (same anchors, LC_ALL=C):  {result['grep_s']} s, {result['grep_lines_per_s']:,} lines/s, "
              f"{result['grep_matches']:,} matching lines")  # fmt: skip
        verdict = "meets" if result["ratio"] >= TARGET else "misses"
        print(f"ratio trainguard/grep: {result['ratio']} ({verdict} the {TARGET} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
