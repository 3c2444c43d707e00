"""The agent's HTTPS side under abuse: legitimate scrapes answered, and the agent's memory, while
strangers hold 1,000 idle TLS connections and 1,000 silent ones (TCP, never a ClientHello).

    python benchmarks/bench_agent_abuse.py                # 3 rounds, a table
    python benchmarks/bench_agent_abuse.py --json --rounds 5
    python benchmarks/bench_agent_abuse.py --old-src /tmp/main/src   # A/B against another checkout

Each round starts `trainguard agent --backend sim` with TLS (an ECDSA certificate) in its own
process, with the usual 1,024 file descriptors, and then, from this process: 1,000 connections
that finish their TLS handshake and send nothing, and 1,000 that never start one, spread over
100 loopback addresses (127.0.1.x: a share per client does not refuse them all at once); then 50
scrapes of /metrics with the token from 127.0.0.1, one every 0.1 s. The baseline, interleaved
with it round by round, is the same agent with no attacker. With ``--old-src`` a third arm runs
the agent of that source tree (the hand-written server) under the same attack.

Keys per arm: answered (of 50, median and range), rss_mb (peak, VmHWM), held (the agent's open
sockets to its port at the end, from /proc/net/tcp).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from targets import Target, finish
from trainguard.procs import parent_death

TOKEN = "bench-token-0123456789abcdef"
SCRAPES = 50
OPENSSL_EC = (
    "openssl",
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
)
OPENSSL_EC += ("-days", "1", "-subj", "/CN=127.0.0.1")


def _child_setup(die_with_us: Callable[[], None]) -> Callable[[], None]:
    def setup() -> None:
        die_with_us()
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # what a default service gets

    return setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(tmp: Path, src: str | None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    token = tmp / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = [
        sys.executable,
        "-m",
        "trainguard.cli",
        "agent",
        "--backend",
        "sim",
        "--listen",
        f"127.0.0.1:{port}",
    ]
    cmd += ["--token-file", str(token), "--state-dir", str(tmp / "state"), "--db", str(tmp / "tg.db")]
    cmd += ["--set", f"agent.tls_cert={tmp / 'tls.crt'}", "--set", f"agent.tls_key={tmp / 'tls.key'}"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, preexec_fn=_child_setup(parent_death()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return proc, port
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the agent did not start listening within 60 s")


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def attack(port: int, n_idle: int, n_silent: int) -> list[socket.socket]:
    held: list[socket.socket] = []
    ctx = client_context()
    for i in range(n_idle + n_silent):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.bind((f"127.0.1.{i % 100 + 1}", 0))
            s.connect(("127.0.0.1", port))
            if i < n_idle:
                s = ctx.wrap_socket(s)  # the handshake, then nothing
        except OSError:
            s.close()  # refused or reset: the agent did not let it in
            continue
        held.append(s)
    return held


def scrape_all(port: int) -> int:
    answered = 0
    ctx = client_context()
    for _ in range(SCRAPES):
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            r = conn.getresponse()
            r.read()
            answered += r.status == 200
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    return answered


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def held_by(port: int) -> int:
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as fh:
            for row in fh.readlines()[1:]:
                f = row.split()
                n += int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "01"
    return n


def one_round(arm: str, src: str | None, n_idle: int, n_silent: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tg-abuse-") as d:
        tmp = Path(d)
        subprocess.run(
            [*OPENSSL_EC, "-keyout", str(tmp / "tls.key"), "-out", str(tmp / "tls.crt")],
            check=True,
            capture_output=True,
        )
        (tmp / "tls.key").chmod(0o600)
        proc, port = start_agent(tmp, src)
        held: list[socket.socket] = []
        try:
            if arm != "baseline":
                held = attack(port, n_idle, n_silent)
            answered = scrape_all(port)
            return {
                "answered": answered,
                "rss_mb": round(peak_rss_mb(proc.pid), 1),
                "held": held_by(port),
                "attacker_connected": len(held),
            }
        finally:
            for s in held:
                s.close()
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def summary(rows: list[dict[str, float]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[key] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "runs": values,
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--silent", type=int, default=1000)
    p.add_argument("--old-src", help="a source tree whose agent runs as a third arm (e.g. main's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * (args.idle + args.silent) + 256)), hard)
    )
    arms: dict[str, str | None] = {"baseline": None, "attacked": None}
    if args.old_src:
        arms["old_attacked"] = args.old_src
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):  # interleaved: A B (C) A B (C) ...
        for arm, src in arms.items():
            results[arm].append(one_round(arm, src, args.idle, args.silent))
    report = {arm: summary(rows) for arm, rows in results.items()}
    report["setup"] = {"idle": args.idle, "silent": args.silent, "scrapes": SCRAPES, "rounds": args.rounds}
    figures = {  # the worst round under attack
        "attacked_answered_min": report["attacked"]["answered"]["min"],
        "attacked_rss_mb_max": report["attacked"]["rss_mb"]["max"],
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for arm in arms:
            s = report[arm]
            print(
                f"{arm:13s} answered {s['answered']['median']}/{SCRAPES} (range {s['answered']['min']}-"
                f"{s['answered']['max']})  peak RSS {s['rss_mb']['median']} MB (range {s['rss_mb']['min']}-"
                f"{s['rss_mb']['max']})  sockets held at the end {s['held']['median']}"
            )
    # Every legitimate scrape answered in every attacked round; memory under the DaemonSet's limit.
    targets = (Target("attacked_answered_min", ">=", SCRAPES), Target("attacked_rss_mb_max", "<", 256))
    return finish("bench_agent_abuse", targets, figures, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
