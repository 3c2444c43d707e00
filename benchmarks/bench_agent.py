"""The node agent under load against what a user runs instead: requests per second and latency
of /metrics while both sample a simulated 8-GPU node at 10 Hz, idle CPU at 1 Hz, memory, and the
cost of one 8-GPU scrape.

    python benchmarks/bench_agent.py              # 3 rounds of 5 s per side, a table
    python benchmarks/bench_agent.py --json       # the figures as JSON
    python benchmarks/bench_agent.py --seconds 10 --repeats 5 --clients 16

The agent runs as `trainguard agent` in its own process (as an operator runs it). The baseline is
what a user runs without it: dcgm-exporter (not installable here) in its shape, written with
prometheus_client's own exposition server (``start_http_server``), exporting dcgm-exporter's
default counters from the same simulated node, sampled at the same rate. The load generator is
another process: ``--clients`` keep-alive connections on loopback (reconnecting when a server
closes after each answer) asking for /metrics, in --repeats interleaved rounds (A B, B A, ...).
A last run asks the agent for /metrics, /api/v1/gpus and /api/v1/node in turn, token checked.

Keys (each figure of the rounds with _ci95 and _repeats, benchmarks/paired.py): metrics_rps,
exporter_rps, rps_ratio (agent / exporter on /metrics, geometric mean of the rounds' ratios,
target >= 1.0), metrics_p99_ms, exporter_p99_ms, metrics_series and exporter_series (samples per
scrape: the agent exports more); rps, p50_ms, p99_ms (the whole API; targets rps >= 1000, p99
<= 50 ms), agent_cpu_idle (share of one core at 1 Hz, no clients, target <= 0.02) and
exporter_cpu_idle, rss_mb, exporter_rss_mb, scrape_ms (rendering /metrics for 8 GPUs, uncached, CPU time of
the rendering thread, target < 10 ms) and scrape_wall_ms. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from paired import interleave, mean_ci, missed, ratio_ci, targets_json
from trainguard.procs import die_with_parent, parent_death

TOKEN = "bench-token-0123456789abcdef"
PATHS = ("/metrics", "/api/v1/gpus", "/api/v1/node")
TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))


def start_agent(tmp: Path, interval: float) -> tuple[subprocess.Popen[str], int]:
    token = tmp / "token"
    token.write_text(TOKEN)
    os.chmod(token, 0o600)
    cmd = [
        TRAINGUARD, "agent", "--backend", "sim", "--gpus", "8", "--interval", str(interval),
        "--listen", "127.0.0.1:0", "--token-file", str(token), "--state-dir", str(tmp / f"state-{interval}"),
        "--db", str(tmp / "tg.db"),
        # the generator is one client address: lift the per-client limit for the measurement
        "--set", "agent.rate_limit_rps=1e9", "--set", "agent.rate_limit_burst=1000000000",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=parent_death())
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"serving http://127\.0\.0\.1:(\d+)/", line):
            return proc, int(m.group(1))
    raise SystemExit("the agent did not start")


# dcgm-exporter's default counters (its names), read from the same simulated node the agent reads.
EXPORTED = (
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c"),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w"),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz"),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz"),
    ("DCGM_FI_DEV_GPU_UTIL", "util_gpu_pct"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "util_mem_pct"),
    ("DCGM_FI_DEV_FB_USED", "mem_used_mib"),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay"),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc_errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remap_failure"),
)


def exporter(port_out: multiprocessing.connection.Connection, interval: float) -> None:
    """What a user runs without trainguard: dcgm-exporter's shape (sample every ``interval``,
    serve the last readings on /metrics) written with prometheus_client's own exposition server,
    over the same simulated 8-GPU node."""
    import threading

    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from trainguard.telemetry import open_backend

    die_with_parent(os.getppid())  # started by this benchmark: dies with it
    node = open_backend("sim", n_gpus=8, seed=0)
    registry = CollectorRegistry()
    gauges = [(Gauge(name, name, ["gpu", "UUID"], registry=registry), field) for name, field in EXPORTED]

    def sample() -> None:
        while True:
            for s in node.sample():
                for gauge, field in gauges:
                    value = getattr(s, field)
                    if value is not None:
                        gauge.labels(str(s.gpu.index), s.gpu.uuid or "").set(float(value))
            time.sleep(interval)

    threading.Thread(target=sample, daemon=True).start()
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    port_out.send(server.server_address[1])
    threading.Event().wait()


def start_exporter(interval: float) -> tuple[multiprocessing.Process, int]:
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=exporter, args=(there, interval), daemon=True)
    proc.start()
    return proc, here.recv()


async def _client(port: int, until: float, latencies: list[float], k: int, paths: tuple[str, ...]) -> None:
    """Keep-alive requests in turn; a server that closes after each answer (HTTP/1.0, as
    prometheus_client's wsgiref server does) is reconnected, and the reconnect counts."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = k
    try:
        while time.perf_counter() < until:
            path = paths[i % len(paths)]
            i += 1
            t0 = time.perf_counter()
            if writer.is_closing():
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            if head.startswith(b"HTTP/1.0") or re.search(rb"(?i)connection: close", head):
                writer.close()
            latencies.append(time.perf_counter() - t0)
            if not re.match(rb"HTTP/1\.[01] 200", head):
                raise SystemExit(f"{path}: {head[:40]!r}")
    finally:
        writer.close()


def load(
    port: int,
    seconds: float,
    clients: int,
    paths: tuple[str, ...],
    out: multiprocessing.connection.Connection,
) -> None:
    latencies: list[float] = []

    async def main() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_client(port, until, latencies, k, paths) for k in range(clients)))

    t0 = time.perf_counter()
    asyncio.run(main())
    out.send((latencies, time.perf_counter() - t0))


def run_load(
    port: int, seconds: float, clients: int, paths: tuple[str, ...] = PATHS
) -> tuple[float, float, float]:
    """(rps, p50 ms, p99 ms) from a generator in its own process."""
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=load, args=(port, seconds, clients, paths, there))
    proc.start()
    latencies, wall = here.recv()
    proc.join()
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return len(latencies) / wall, p(0.50), p(0.99)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` in nanosecond resolution (schedstat, not clock ticks)."""
    return (
        sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir())
        / 1e9
    )


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def scrape_ms(rounds: int = 50) -> tuple[float, float]:
    """Median (CPU, wall) milliseconds to render /metrics for a simulated 8-GPU node, cache
    defeated each round. CPU time of this thread is the cost; wall time adds the waits of a
    shared machine."""
    from trainguard.agent import AgentConfig
    from trainguard.agent.assemble import assemble
    from trainguard.agent.prometheus import MetricsView

    with tempfile.TemporaryDirectory() as d:
        daemon = assemble(AgentConfig(backend="sim", gpus=8, db=f"{d}/tg.db", state_dir=d))
        try:
            daemon.step()
            daemon.sim.now().xid(79, gpu=3)
            view = MetricsView(daemon)
            cpu, wall = [], []
            for _ in range(rounds):
                daemon.step()
                c0, t0 = time.thread_time(), time.perf_counter()
                view.render()
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - t0)
            return statistics.median(cpu) * 1000, statistics.median(wall) * 1000
        finally:
            daemon.close()


TARGETS = {
    "rps": (">=", 1000.0),
    "p99_ms": ("<=", 50.0),
    "agent_cpu_idle": ("<=", 0.02),
    "scrape_ms": ("<", 10.0),
    "rps_ratio": (">=", 1.0),
}


def series(port: int) -> int:
    """Samples (non-comment lines) one /metrics scrape returns."""
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return sum(1 for line in r.read().decode().splitlines() if line and not line.startswith("#"))


def idle_cpu(pid: int, seconds: float) -> float:
    time.sleep(2.0)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seconds", type=float, default=5.0, help="load per measurement (default 5)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds agent/exporter (default 3)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent keep-alive connections (default 8)")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU window (default 10)")
    args = ap.parse_args()
    out: dict[str, Any] = {"targets": targets_json(TARGETS)}
    metrics_only = ("/metrics",)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as d:
        tmp = Path(d)
        # Both sample the same simulated node at 10 Hz and serve /metrics to the same generator,
        # in interleaved rounds (A B, B A, ...).
        agent, port = start_agent(tmp, 0.1)
        exp, exp_port = start_exporter(0.1)
        try:
            time.sleep(1.0)
            out["metrics_series"], out["exporter_series"] = series(port), series(exp_port)
            ours, theirs = interleave(
                args.repeats,
                lambda i: run_load(port, args.seconds, args.clients, metrics_only),
                lambda i: run_load(exp_port, args.seconds, args.clients, metrics_only),
            )
            # The agent's whole API in turn (/metrics, /api/v1/gpus, /api/v1/node), token checked.
            out["rps"], out["p50_ms"], out["p99_ms"] = run_load(port, args.seconds, args.clients)
            out["rss_mb"], out["exporter_rss_mb"] = rss_mb(agent.pid), rss_mb(exp.pid or 0)
        finally:
            exp.terminate()
            exp.join()
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=30)
        out.update(mean_ci([r[0] for r in ours]).as_json("metrics_rps", 1))
        out.update(mean_ci([r[0] for r in theirs]).as_json("exporter_rps", 1))
        out.update(ratio_ci([r[0] for r in ours], [r[0] for r in theirs]).as_json("rps_ratio", 4))
        out["metrics_rps_samples"] = [round(r[0], 1) for r in ours]
        out["exporter_rps_samples"] = [round(r[0], 1) for r in theirs]
        out.update(mean_ci([r[2] for r in ours]).as_json("metrics_p99_ms", 2))
        out.update(mean_ci([r[2] for r in theirs]).as_json("exporter_p99_ms", 2))
        # Idle at 1 Hz with no clients: the agent (which also judges and records) and the exporter.
        agent, port = start_agent(tmp, 1.0)
        try:
            out["agent_cpu_idle"] = idle_cpu(agent.pid, args.idle_seconds)
            out["rss_mb_idle"] = rss_mb(agent.pid)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=30)
        exp, _ = start_exporter(1.0)
        try:
            out["exporter_cpu_idle"] = idle_cpu(exp.pid or 0, args.idle_seconds)
        finally:
            exp.terminate()
            exp.join()
    out["scrape_ms"], out["scrape_wall_ms"] = scrape_ms()
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    bad = missed(out, TARGETS)
    out["targets_missed"] = bad
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:>22}: {v}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
