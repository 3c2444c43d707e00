"""The agent's HTTPS side under abuse: legitimate scrapes answered, and the agent's memory, while
strangers (and a holder of the read token) attack it four ways.

    python benchmarks/bench_agent_abuse.py                # 3 rounds, every attack, a table
    python benchmarks/bench_agent_abuse.py --json --rounds 5 --attacks heads,churn
    python benchmarks/bench_agent_abuse.py --old-src /tmp/main/src   # old figures beside the new

Each round starts `trainguard agent --backend sim` with TLS (an ECDSA certificate) in its own
process, with the usual 1,024 file descriptors, then runs one attack from this process while 50
scrapes of /metrics with the token come from 127.0.0.1, one every 0.1 s:

* ``idle``: 1,000 connections that finish their TLS handshake and send nothing, and 1,000 that
  never start one, over 100 loopback addresses (127.0.1.x: a share per client does not refuse
  them all at once);
* ``heads``: 128 connections from 8 addresses (127.0.2.x), each sending a request line and then
  header lines of 8 KB (within every per-line limit), 100 of them, never the blank line that ends
  the head; held while the scrapes run;
* ``churn``: 8 threads, one per address (127.0.3.x), opening TCP connections and closing them at
  once, as fast as they can, for as long as the scrapes run (every slot taken, over and over);
* ``tokens``: a holder of the read token keeping 128 TLS connections busy from 8 addresses
  (127.0.4.x, 16 each: every slot), each asking for /metrics every 0.35 s (46 requests a second
  per address, under the rate limit of 50: no 429 ends a connection) and connecting again at
  once when the agent closes one.

Under ``tokens`` the scrapes use Prometheus's scrape token where the agent has one (this tree:
``scrape_token_file``), the read token otherwise; ``tokens_read`` is this tree's agent scraped
with the read token (the connection gate alone, without the scrape lane).

The baseline, interleaved with the attacks round by round, is the same agent with no attacker.
With ``--old-src`` each attack also runs against the agent of that source tree, in the same
round. Keys per arm: answered (of 50, median and range), scrape_ms_median and scrape_ms_max (of
the answered scrapes, connect to last byte), rss_mb (peak, VmHWM), rss_after_mb (resident 5 s
after the attacker let go), held (the agent's open sockets to its port at the end, from
/proc/net/tcp).
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
import threading
import time
from collections.abc import Callable
from pathlib import Path

from arm_procs import free_port
from targets import Target, finish
from trainguard.procs import parent_death

TOKEN = "bench-token-0123456789abcdef"
SCRAPE_TOKEN = "bench-scrape-token-0123456789abcdef"
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


def start_agent(tmp: Path, src: str | None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    token, scrape = tmp / "token", tmp / "scrape.token"
    for path, value in ((token, TOKEN), (scrape, SCRAPE_TOKEN)):
        path.write_text(value)
        path.chmod(0o600)
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
    if src is None:  # this tree's agent has a scrape token; an old one may not
        cmd += ["--set", f"agent.scrape_token_file={scrape}"]
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


def attack_idle(port: int, n_idle: int, n_silent: int) -> list[socket.socket]:
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


HEAD_LINE = b"X-Padding: " + b"a" * 8000 + b"\r\n"


def attack_heads(port: int, n: int = 128, lines: int = 100) -> list[socket.socket]:
    """``n`` TLS connections from 8 addresses, each sending ``lines`` header lines and never
    finishing its request head."""
    held: list[socket.socket] = []
    ctx = client_context()
    for i in range(n):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.bind((f"127.0.2.{i % 8 + 1}", 0))
            s.connect(("127.0.0.1", port))
            s = ctx.wrap_socket(s)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            s.close()
            continue
        held.append(s)
    for _ in range(lines):
        for s in held:
            with contextlib.suppress(OSError):  # refused and closed by the agent
                s.settimeout(0.05)
                s.sendall(HEAD_LINE)
    return held


class Churn:
    """8 threads, one address each, opening TCP connections and closing them, until stopped."""

    def __init__(self, port: int) -> None:
        self.port, self.stop, self.opened = port, threading.Event(), 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(8)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        while not self.stop.is_set():
            s = socket.socket()
            s.settimeout(2)
            try:
                s.bind((f"127.0.3.{i + 1}", 0))
                s.connect(("127.0.0.1", self.port))
                self.opened += 1
            except OSError:
                pass
            finally:
                s.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


PACE_S = 0.35  # a token holder's connection asks this often: 16 a address, 46/s, under the limit


class TokenHolder:
    """128 threads, one TLS connection each, from 8 addresses: /metrics with the read token
    every ``PACE_S``; a new connection at once when the agent closes one."""

    def __init__(self, port: int, n: int = 128) -> None:
        self.port, self.stop, self.answered, self.connected = port, threading.Event(), 0, 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        ctx = client_context()
        while not self.stop.is_set():
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=5, context=ctx, source_address=(f"127.0.4.{i % 8 + 1}", 0)
            )
            try:
                conn.connect()
                self.connected += 1
                while not self.stop.is_set():
                    asked = time.monotonic()
                    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
                    r = conn.getresponse()
                    r.read()
                    self.answered += r.status == 200
                    if r.status != 200:
                        break
                    self.stop.wait(max(0.0, PACE_S - (time.monotonic() - asked)))
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def scrape_all(port: int, token: str) -> tuple[int, list[float]]:
    """(scrapes answered, each answered one's milliseconds from connect to its last byte)."""
    answered, took = 0, []
    ctx = client_context()
    for _ in range(SCRAPES):
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
        t0 = time.perf_counter()
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                answered += 1
                took.append((time.perf_counter() - t0) * 1000)
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    return answered, took


def peak_rss_mb(pid: int, field: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
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


def one_round(attack: str, src: str | None, n_idle: int, n_silent: int, token: str) -> dict[str, float]:
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
        churn: Churn | TokenHolder | None = None
        try:
            if attack == "idle":
                held = attack_idle(port, n_idle, n_silent)
            elif attack == "heads":
                held = attack_heads(port)
            elif attack == "churn":
                churn = Churn(port)
            elif attack == "tokens":
                churn = TokenHolder(port)
                time.sleep(3)  # every slot taken and busy before the first scrape
            answered, took = scrape_all(port, token)
            at_end = held_by(port)
            for s in held:
                s.close()
            if churn is not None:
                churn.close()
            time.sleep(5)
            nan = float("nan")
            return {
                "answered": answered,
                "scrape_ms_median": round(statistics.median(took), 1) if took else nan,
                "scrape_ms_max": round(max(took), 1) if took else nan,
                "rss_mb": round(peak_rss_mb(proc.pid), 1),
                "rss_after_mb": round(peak_rss_mb(proc.pid, "VmRSS"), 1),
                "held": at_end,
                "attacker_connected": len(held) if churn is None else _opened(churn),
            }
        finally:
            for s in held:
                s.close()
            if churn is not None:
                churn.close()
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _opened(attacker: Churn | TokenHolder) -> int:
    return attacker.opened if isinstance(attacker, Churn) else attacker.connected


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
    p.add_argument(
        "--attacks", default="idle,heads,churn,tokens", help="a comma list of idle, heads, churn, tokens"
    )
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--silent", type=int, default=1000)
    p.add_argument("--old-src", help="a source tree whose agent runs each attack too (e.g. main's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * (args.idle + args.silent) + 256)), hard)
    )
    attacks = [a for a in args.attacks.split(",") if a]
    # arm -> (attack, source tree (None: this one), the scrapes' token)
    arms: dict[str, tuple[str, str | None, str]] = {"baseline": ("none", None, SCRAPE_TOKEN)}
    for attack in attacks:
        arms[attack] = (attack, None, SCRAPE_TOKEN)
        if attack == "tokens":
            arms["tokens_read"] = (attack, None, TOKEN)
        if args.old_src:
            arms[f"old_{attack}"] = (attack, args.old_src, TOKEN)
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):  # interleaved: every arm once per round
        for arm, (attack, src, token) in arms.items():
            results[arm].append(one_round(attack, src, args.idle, args.silent, token))
    report: dict[str, object] = {arm: summary(rows) for arm, rows in results.items()}
    report["setup"] = {
        "attacks": attacks,
        "idle": args.idle,
        "silent": args.silent,
        "scrapes": SCRAPES,
        "rounds": args.rounds,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    figures: dict[str, float] = {}  # the worst round of each attack on this source tree
    mine = [arm for arm in arms if arm != "baseline" and not arm.startswith("old_")]
    for arm in mine:
        figures[f"{arm}_answered_min"] = min(r["answered"] for r in results[arm])
        figures[f"{arm}_rss_mb_max"] = max(r["rss_mb"] for r in results[arm])
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for arm in arms:
            s = report[arm]
            assert isinstance(s, dict)
            print(
                f"{arm:13s} answered {s['answered']['median']}/{SCRAPES} (range {s['answered']['min']}-"
                f"{s['answered']['max']})  scrape {s['scrape_ms_median']['median']} ms median, "
                f"{s['scrape_ms_max']['max']} ms worst  peak RSS {s['rss_mb']['median']} MB (range {s['rss_mb']['min']}-"
                f"{s['rss_mb']['max']})  RSS 5 s after {s['rss_after_mb']['median']} MB  "
                f"sockets held at the end {s['held']['median']}"
            )
    # Every legitimate scrape answered in every attacked round; memory under the DaemonSet's limit.
    targets = [Target(f"{a}_answered_min", ">=", SCRAPES) for a in mine]
    targets += [Target(f"{a}_rss_mb_max", "<", 256) for a in mine]
    return finish("bench_agent_abuse", targets, figures, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
