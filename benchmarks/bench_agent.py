"""The node agent under load: requests per second and latency while it samples a simulated
8-GPU node at 10 Hz, its CPU when idle at 1 Hz, its memory, and the cost of one 8-GPU scrape.

    python benchmarks/bench_agent.py              # 5 s of load, a table
    python benchmarks/bench_agent.py --json       # the figures as JSON
    python benchmarks/bench_agent.py --seconds 10 --clients 16

The agent runs as `trainguard agent` in its own process (as an operator runs it); the load
generator is another process: ``--clients`` keep-alive connections on loopback, asking in turn
for /metrics, /api/v1/gpus and /api/v1/node with the bearer token. The baseline, measured in the
same run with the same generator, is a minimal stdlib ``ThreadingHTTPServer`` answering a
constant: ``rps_ratio`` = agent rps / baseline rps.

Keys: rps, p50_ms, p99_ms (targets rps >= 1000 with p99 <= 50 ms while sampling at 10 Hz),
agent_cpu_idle (share of one core at 1 Hz with no clients, target <= 0.02), rss_mb,
scrape_ms (rendering /metrics for 8 GPUs, uncached, target < 10 ms), baseline_rps, rps_ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
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

from targets import Target, finish

TARGETS = (
    Target("rps", ">=", 1000),
    Target("p99_ms", "<=", 50),
    Target("agent_cpu_idle", "<=", 0.02),
    Target("scrape_ms", "<", 10),
)

TOKEN = "bench-token-0123456789abcdef"
PATHS = ("/metrics", "/api/v1/gpus", "/api/v1/node")
TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


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
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
    assert proc.stderr is not None
    for line in proc.stderr:
        if m := re.search(r"serving http://127\.0\.0\.1:(\d+)/", line):
            return proc, int(m.group(1))
    raise SystemExit("the agent did not start")


def baseline_server(port_out: multiprocessing.connection.Connection) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Constant(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def do_GET(self) -> None:
            body = b'{"ok":true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Constant)
    port_out.send(server.server_address[1])
    server.serve_forever()


async def _client(port: int, until: float, latencies: list[float], k: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = k
    try:
        while time.perf_counter() < until:
            path = PATHS[i % len(PATHS)]
            i += 1
            t0 = time.perf_counter()
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"{path}: {head[:40]!r}")
    finally:
        writer.close()


def load(port: int, seconds: float, clients: int, out: multiprocessing.connection.Connection) -> None:
    latencies: list[float] = []

    async def main() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_client(port, until, latencies, k) for k in range(clients)))

    t0 = time.perf_counter()
    asyncio.run(main())
    out.send((latencies, time.perf_counter() - t0))


def run_load(port: int, seconds: float, clients: int) -> tuple[float, float, float]:
    """(rps, p50 ms, p99 ms) from a generator in its own process."""
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=load, args=(port, seconds, clients, there))
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


def scrape_ms(rounds: int = 50) -> float:
    """Median time to render /metrics for a simulated 8-GPU node, cache defeated each round."""
    from trainguard.agent import AgentConfig, AgentDaemon
    from trainguard.agent.prometheus import MetricsView

    with tempfile.TemporaryDirectory() as d:
        daemon = AgentDaemon(AgentConfig(backend="sim", gpus=8, db=f"{d}/tg.db", state_dir=d))
        try:
            daemon.step()
            daemon.sim.now().xid(79, gpu=3)
            view = MetricsView(daemon)
            times = []
            for _ in range(rounds):
                daemon.step()
                t0 = time.perf_counter()
                view.render()
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1000
        finally:
            daemon.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seconds", type=float, default=5.0, help="load duration (default 5)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent keep-alive connections (default 8)")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU window (default 10)")
    args = ap.parse_args()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as d:
        tmp = Path(d)
        # baseline: a constant from the stdlib server, same generator
        here, there = multiprocessing.Pipe()
        base = multiprocessing.Process(target=baseline_server, args=(there,), daemon=True)
        base.start()
        out["baseline_rps"], out["baseline_p50_ms"], out["baseline_p99_ms"] = run_load(
            here.recv(), args.seconds, args.clients
        )
        base.terminate()
        base.join()
        # the agent sampling at 10 Hz, under load
        agent, port = start_agent(tmp, 0.1)
        try:
            time.sleep(1.0)
            out["rps"], out["p50_ms"], out["p99_ms"] = run_load(port, args.seconds, args.clients)
            out["rss_mb"] = rss_mb(agent.pid)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=30)
        # the agent at 1 Hz with no clients
        agent, port = start_agent(tmp, 1.0)
        try:
            time.sleep(2.0)
            c0, t0 = cpu_seconds(agent.pid), time.monotonic()
            time.sleep(args.idle_seconds)
            out["agent_cpu_idle"] = (cpu_seconds(agent.pid) - c0) / (time.monotonic() - t0)
            out["rss_mb_idle"] = rss_mb(agent.pid)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=30)
    out["scrape_ms"] = scrape_ms()
    out["rps_ratio"] = out["rps"] / out["baseline_rps"]
    out = {k: round(v, 4) for k, v in out.items()}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")
        ok = (
            out["rps"] >= 1000
            and out["p99_ms"] <= 50
            and out["agent_cpu_idle"] <= 0.02
            and out["scrape_ms"] < 10
        )
        print(
            "targets (rps >= 1000, p99 <= 50 ms, idle CPU <= 0.02, scrape < 10 ms):",
            "met" if ok else "NOT met",
        )
    return finish("bench_agent", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
