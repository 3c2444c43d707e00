"""The node agent against what a user runs instead: the cost of one /metrics scrape (CPU and
wall) at a scraper's pace, requests per second and latency under load, both sampling a simulated
8-GPU node at 10 Hz, every request on a new connection on both sides; idle CPU at 1 Hz, memory.

    python benchmarks/bench_agent.py              # 3 rounds per side, a table
    python benchmarks/bench_agent.py --json       # the figures as JSON
    python benchmarks/bench_agent.py --quick      # 2 short rounds: that it runs
    python benchmarks/bench_agent.py --seconds 10 --repeats 5 --clients 16 --scrapes 60

The agent runs as `trainguard agent` in its own process (as an operator runs it). The baseline is
what a user runs without it: dcgm-exporter (not installable here) in its shape, written with
prometheus_client's own exposition server (``start_http_server``), exporting dcgm-exporter's
default counters with dcgm-exporter's labels (gpu, UUID, pci_bus_id, device, modelName,
Hostname, DCGM_FI_DRIVER_VERSION) from the same simulated node, sampled at the same rate.

One connection policy on both sides: prometheus_client's server answers HTTP/1.0 and closes
every connection, so every request to either server comes on a new connection (the agent is
asked ``Connection: close``). Cost per scrape: ``--scrapes`` scrapes, one every 0.2 s (each
sees a new sample, so the agent's render cache never answers one twice: a scraper every 15 s
sees the same), the agent as shipped (its per-client rate limit in force); the server's CPU over
the window less its CPU over an equal window without scrapes (its sampling), per scrape; wall is
the client's, connect to last byte. Throughput: ``--clients`` connections from another process
asking for /metrics as fast as they are answered, in ``--repeats`` interleaved rounds (A B, B A,
...); there the agent's rate limit is lifted (the generator is one client address at thousands of
requests a second) and the agent's render cache answers all requests between two samples. A last
run asks the agent, keep-alive, for /metrics, /api/v1/gpus and /api/v1/node in turn, token checked.

Keys (each figure of the rounds with _ci95 and _repeats, benchmarks/paired.py):
per_scrape_cpu_ms and exporter_per_scrape_cpu_ms, per_scrape_cpu_ratio (exporter / agent: above
1 the agent costs less per scrape), per_scrape_wall_ms, exporter_per_scrape_wall_ms,
per_scrape_wall_ratio, metrics_series and exporter_series (samples per scrape: the agent exports
more, so per_sample_cpu_ratio puts the CPU ratio per sample, target >= 1.0); metrics_rps, exporter_rps,
rps_ratio (agent / exporter on /metrics, target >= 1.0), metrics_p99_ms, exporter_p99_ms,
metrics_rps_keepalive (the agent alone on kept connections); rps, p50_ms, p99_ms (the whole API;
targets rps >= 1000, p99 <= 50 ms), agent_cpu_idle (share of one core at 1 Hz, no clients,
target <= 0.02) and exporter_cpu_idle, rss_mb, exporter_rss_mb, scrape_ms (rendering /metrics for
8 GPUs, uncached, CPU time of the rendering thread, target < 10 ms) and scrape_wall_ms;
load_average (1-minute, min and max over the run). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import socket
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


def start_agent(
    tmp: Path, interval: float, *, lift_rate_limit: bool = True
) -> tuple[subprocess.Popen[str], int]:
    token = tmp / "token"
    token.write_text(TOKEN)
    os.chmod(token, 0o600)
    cmd = [
        TRAINGUARD, "agent", "--backend", "sim", "--gpus", "8", "--interval", str(interval),
        "--listen", "127.0.0.1:0", "--token-file", str(token),
        "--state-dir", str(tmp / f"state-{interval}-{lift_rate_limit}"), "--db", str(tmp / f"tg-{lift_rate_limit}.db"),
    ]  # fmt: skip
    if lift_rate_limit:  # the throughput generator is one client address at thousands of requests/s
        cmd += ["--set", "agent.rate_limit_rps=1e9", "--set", "agent.rate_limit_burst=1000000000"]
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


DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]


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
    gauges = [(Gauge(name, name, DCGM_LABELS, registry=registry), field) for name, field in EXPORTED]
    host, driver = socket.gethostname(), str(getattr(node, "driver_version", "") or "")

    def labels(g: Any) -> tuple[str, ...]:
        # dcgm-exporter's labels on every GPU sample: index, UUID, bus id as 00000000:3B:00.0,
        # device, model, host, driver version
        domain, _, rest = (g.pci or "0:").partition(":")
        bus = f"{int(domain, 16):08X}:{rest.upper()}.0" if g.pci else ""
        return (str(g.index), g.uuid or "", bus, f"nvidia{g.index}", g.name or "", host, driver)

    def sample() -> None:
        while True:
            for s in node.sample():
                for gauge, field in gauges:
                    value = getattr(s, field)
                    if value is not None:
                        gauge.labels(*labels(s.gpu)).set(float(value))
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


async def _client(
    port: int, until: float, latencies: list[float], k: int, paths: tuple[str, ...], close: bool
) -> None:
    """Requests in turn, on one keep-alive connection, or (``close``) each on a new connection
    that the request asks to close; a server that closes after each answer (HTTP/1.0, as
    prometheus_client's wsgiref server does) is reconnected, and the reconnect counts."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = k
    hint = "Connection: close\r\n" if close else ""
    try:
        while time.perf_counter() < until:
            path = paths[i % len(paths)]
            i += 1
            t0 = time.perf_counter()
            if writer.is_closing():
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n{hint}\r\n".encode()
            )
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
    close: bool,
    out: multiprocessing.connection.Connection,
) -> None:
    latencies: list[float] = []

    async def main() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_client(port, until, latencies, k, paths, close) for k in range(clients)))

    t0 = time.perf_counter()
    asyncio.run(main())
    out.send((latencies, time.perf_counter() - t0))


def run_load(
    port: int, seconds: float, clients: int, paths: tuple[str, ...] = PATHS, *, close: bool = False
) -> tuple[float, float, float]:
    """(rps, p50 ms, p99 ms) from a generator in its own process."""
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=load, args=(port, seconds, clients, paths, close, there))
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


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid``, its exited threads included (/proc/PID/stat: the
    exporter's server answers each request on a thread of its own that is gone when it is read)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> None:
    """One /metrics scrape on a new connection, closed after the answer (HTTP/1.1 with
    ``Connection: close``: what prometheus_client's HTTP/1.0 server does to every request)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}", "Connection": "close"})
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"/metrics: HTTP {answer.status}")
    finally:
        conn.close()


def scrape_cost(port: int, pid: int, scrapes: int, pace_s: float) -> tuple[float, float]:
    """(server CPU seconds, wall seconds) per scrape: ``scrapes`` scrapes one at a time, one every
    ``pace_s`` (longer than the sampling interval, so each sees a new sample, as a scraper every
    15 s does: the agent's render cache cannot answer one twice), each on a new connection. The
    server's CPU over the window, less its CPU over an equal window without scrapes right after
    (its sampling), divided by the scrapes; wall is the client's, connect to last byte."""
    walls = []
    c0, t0 = process_cpu(pid), time.monotonic()
    for i in range(scrapes):
        time.sleep(max(0.0, t0 + i * pace_s - time.monotonic()))
        s0 = time.perf_counter()
        scrape(port)
        walls.append(time.perf_counter() - s0)
    time.sleep(max(0.0, t0 + scrapes * pace_s - time.monotonic()))
    c1, t1 = process_cpu(pid), time.monotonic()
    time.sleep(t1 - t0)
    background = (process_cpu(pid) - c1) / (time.monotonic() - t1) * (t1 - t0)
    return max(c1 - c0 - background, 1e-6) / scrapes, statistics.fmean(walls)


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


SCRAPE_PACE_S = 0.2  # one scrape per two samples at 10 Hz: each scrape sees a new one

TARGETS = {
    "rps": (">=", 1000.0),
    "p99_ms": ("<=", 50.0),
    "agent_cpu_idle": ("<=", 0.02),
    "scrape_ms": ("<", 10.0),
    "rps_ratio": (">=", 1.0),
    # The agent exports 4x dcgm-exporter's samples: per sample it must cost no more than it.
    "per_sample_cpu_ratio": (">=", 1.0),
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
    ap.add_argument("--clients", type=int, default=8, help="concurrent connections (default 8)")
    ap.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU window (default 10)")
    ap.add_argument(
        "--scrapes", type=int, default=40, help="scrapes per side per round for the cost (default 40)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="2 rounds of 2 s, 10 scrapes, 3 s idle: that it runs"
    )
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.repeats, args.idle_seconds, args.scrapes = 2.0, 2, 3.0, 10
    out: dict[str, Any] = {"targets": targets_json(TARGETS)}
    metrics_only = ("/metrics",)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as d:
        tmp = Path(d)
        # Both sample the same simulated node at 10 Hz and serve /metrics to the same generator,
        # in interleaved rounds (A B, B A, ...), every request on a new connection on both sides.
        exp, exp_port = start_exporter(0.1)
        agent, port = start_agent(tmp, 0.1)
        try:
            time.sleep(1.0)
            out["metrics_series"], out["exporter_series"] = series(port), series(exp_port)
            ours, theirs = interleave(
                args.repeats,
                lambda i: run_load(port, args.seconds, args.clients, metrics_only, close=True),
                lambda i: run_load(exp_port, args.seconds, args.clients, metrics_only, close=True),
            )
            loads.append(os.getloadavg()[0])
            # The agent's own figures, keep-alive as a scraper that can keeps its connection: /metrics,
            # then its whole API in turn (/metrics, /api/v1/gpus, /api/v1/node), token checked.
            out["metrics_rps_keepalive"] = run_load(port, args.seconds, args.clients, metrics_only)[0]
            out["rps"], out["p50_ms"], out["p99_ms"] = run_load(port, args.seconds, args.clients)
            out["rss_mb"], out["exporter_rss_mb"] = rss_mb(agent.pid), rss_mb(exp.pid or 0)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=30)
        # Cost per scrape at a scraper's pace, the agent as shipped (its rate limit in force).
        agent, port = start_agent(tmp, 0.1, lift_rate_limit=False)
        try:
            time.sleep(1.0)
            cost_ours, cost_theirs = interleave(
                args.repeats,
                lambda i: scrape_cost(port, agent.pid, args.scrapes, SCRAPE_PACE_S),
                lambda i: scrape_cost(exp_port, exp.pid or 0, args.scrapes, SCRAPE_PACE_S),
            )
            loads.append(os.getloadavg()[0])
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.communicate(timeout=30)
            exp.terminate()
            exp.join()
        out.update(mean_ci([r[0] for r in ours]).as_json("metrics_rps", 1))
        out.update(mean_ci([r[0] for r in theirs]).as_json("exporter_rps", 1))
        out.update(ratio_ci([r[0] for r in ours], [r[0] for r in theirs]).as_json("rps_ratio", 4))
        out["metrics_rps_samples"] = [round(r[0], 1) for r in ours]
        out["exporter_rps_samples"] = [round(r[0], 1) for r in theirs]
        out.update(mean_ci([r[2] for r in ours]).as_json("metrics_p99_ms", 2))
        out.update(mean_ci([r[2] for r in theirs]).as_json("exporter_p99_ms", 2))
        for key, k in (("cpu", 0), ("wall", 1)):
            a, b = [c[k] for c in cost_ours], [c[k] for c in cost_theirs]
            out.update(mean_ci([x * 1000 for x in a]).as_json(f"per_scrape_{key}_ms", 3))
            out.update(mean_ci([x * 1000 for x in b]).as_json(f"exporter_per_scrape_{key}_ms", 3))
            out.update(ratio_ci(b, a).as_json(f"per_scrape_{key}_ratio", 4))  # exporter / agent
        per_sample = ratio_ci(
            [c[0] / out["exporter_series"] for c in cost_theirs],
            [c[0] / out["metrics_series"] for c in cost_ours],
        )
        out.update(per_sample.as_json("per_sample_cpu_ratio", 4))  # exporter / agent, per sample exported
        out["per_scrape_cpu_ms_samples"] = [round(c[0] * 1000, 3) for c in cost_ours]
        out["exporter_per_scrape_cpu_ms_samples"] = [round(c[0] * 1000, 3) for c in cost_theirs]
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
    out["load_average"] = [round(min(loads), 1), round(max(loads), 1)]
    out = {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
    bad = missed(out, TARGETS)
    out["targets_missed"] = bad
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:>34}: {v}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
