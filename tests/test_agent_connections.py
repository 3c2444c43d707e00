"""The agent's connections attacked from the node's loopback (issue 34): many connections each
sending header lines that every per-line limit allows, never the blank line that ends them;
strangers taking every connection slot; and a holder of the read token keeping every slot busy. Strangers connect from 127.0.0.2-9 (all of 127/8 is
loopback), the scraper from 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.client
import selectors
import socket
import threading
import time
from pathlib import Path

import pytest

from agent_service import TOKEN, Running, sim_config
from test_agent_attacks import closed_by_server, connect, scrapes, wait_for

LINE = b"X-Padding: " + b"a" * 8000 + b"\r\n"  # under every per-line limit, old and new


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def unfinished_heads(port: int, n: int, lines: int) -> list[socket.socket]:
    """``n`` connections from 8 addresses, each sending a request line and ``lines`` header
    lines (90 x 8 KB: within the old and new count and size limits), never finishing the head."""
    held = []
    for i in range(n):
        s = connect(port, f"127.0.0.{i % 8 + 2}")
        s.setblocking(False)
        held.append(s)
    for s in held:
        s.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    for _ in range(lines):
        for s in held:
            with contextlib.suppress(BlockingIOError, OSError):  # buffers full, or the agent closed it
                s.send(LINE)
    for s in held:
        s.setblocking(True)
    return held


def first_lines(socks: list[socket.socket], ceiling_s: float) -> list[bytes]:
    """The first line each socket receives (b"" if none within ``ceiling_s`` in all)."""
    got = {s: b"" for s in socks}
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + ceiling_s
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(0.5):
                s = key.fileobj  # type: ignore[assignment]
                try:
                    chunk = s.recv(4096)
                except ConnectionResetError:
                    chunk = b""
                got[s] += chunk
                if not chunk or b"\r\n" in got[s]:
                    sel.unregister(s)
    return [got[s].split(b"\r\n")[0] for s in socks]


def test_unfinished_request_heads_are_refused_at_the_head_limit_and_cost_no_memory(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path, max_connections_per_client=16)) as agent:
        before = rss_mb()
        held = unfinished_heads(agent.port, 128, 90)
        try:
            time.sleep(0.5)  # let the agent read what it will
            grown = rss_mb() - before
            answers = first_lines(held, ceiling_s=20)
            assert answers == [b"HTTP/1.1 431 Request Header Fields Too Large"] * 128
            assert all(closed_by_server(s, 10) for s in held)
            assert grown < 64, f"the agent grew {grown:.0f} MB holding unfinished heads"
            assert agent.daemon.tally.copy().refusals["oversized"] == 128
            assert scrapes(agent, 5) == [200] * 5
        finally:
            for s in held:
                s.close()


def test_a_full_head_within_the_limit_is_served(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path)) as agent:
        s = connect(agent.port, "127.0.0.1")
        cookie = b"Cookie: " + b"b" * 6000 + b"\r\n"  # two 6 KB lines: a 12 KB head
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + cookie + cookie + b"\r\n"
        s.sendall(head + head)  # twice on one connection: the count starts again per request
        data = b""
        while data.count(b"HTTP/1.1 200") < 2:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        s.close()


def test_strangers_filling_every_connection_evict_their_own_not_the_scrapers(tmp_path: Path) -> None:
    """Connection churn from 8 addresses starved Prometheus (issue 34): with every slot taken,
    each newcomer evicted the oldest connection without a token, and that was the scraper's,
    accepted before the churn and not yet asked. Now the address holding the most gives way."""
    config = sim_config(tmp_path, max_connections=32, max_connections_per_client=8)
    with Running(config) as agent:
        scraper = connect(agent.port, "127.0.0.1")
        wait_for(lambda: agent.service.http.connections == 1, "the scraper's connection accepted")
        strangers = [connect(agent.port, f"127.0.0.{i % 8 + 2}") for i in range(40)]
        try:
            wait_for(
                lambda: agent.daemon.tally.copy().refusals["evicted"] >= 9, "the strangers filled every slot"
            )
            scraper.sendall(
                f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
            )
            assert scraper.recv(64).startswith(b"HTTP/1.1 200")
        finally:
            for s in [scraper, *strangers]:
                s.close()


def test_a_non_ascii_authorization_header_is_a_400_not_a_500(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path)) as agent:
        s = connect(agent.port)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xb2\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 400")
        s.close()
        assert agent.daemon.tally.copy().refusals["bad_request"] == 1


class BusyTokenHolder:
    """A holder of the read token keeping ``n`` connections from 8 addresses (127.0.0.2-9) busy:
    each asks for /metrics again as soon as an answer starts, and a connection the agent closes
    is opened again at once. ``answered`` counts answers; ``ready`` is set once every connection
    has had one (so each has shown the token)."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.ask = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
        self.answered, self.reopened = 0, 0
        self.served: set[int] = set()
        self.ready, self.stop = threading.Event(), threading.Event()
        self.sel = selectors.DefaultSelector()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BusyTokenHolder:
        for i in range(self.n):
            self._open(i)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()

    def _open(self, i: int) -> None:
        s = socket.socket()
        try:
            s.bind((f"127.0.0.{i % 8 + 2}", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", self.port))
            s.setblocking(False)
            s.send(self.ask)
        except OSError:
            s.close()
            return  # tried again on the next turn of the loop
        self.sel.register(s, selectors.EVENT_READ, i)

    def _run(self) -> None:
        while not self.stop.is_set():
            open_slots = {key.data for key in self.sel.get_map().values()}
            for i in set(range(self.n)) - open_slots:
                self.reopened += 1
                self._open(i)
            for key, _ in self.sel.select(0.05):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    chunk = s.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:  # evicted (or refused): open it again at once
                    self.sel.unregister(s)
                    s.close()
                    continue
                starts = chunk.count(b"HTTP/1.1 200")
                if starts:
                    self.answered += starts
                    self.served.add(key.data)
                    if len(self.served) == self.n:
                        self.ready.set()
                    with contextlib.suppress(OSError):
                        s.send(self.ask * starts)


def answered(agent: Running, token: str, n: int) -> int:
    ok = 0
    for _ in range(n):
        with contextlib.suppress(OSError, http.client.HTTPException):
            ok += agent.get("/metrics", token=token)[0] == 200
    return ok


@pytest.mark.parametrize("scraper", ["scrape", "read"])
def test_a_read_token_holder_keeping_every_connection_busy_cannot_starve_the_scrape(
    tmp_path: Path, scraper: str
) -> None:
    """Issue 34: a holder of the read token keeping every connection busy answered 0 of 20
    scrapes: every slot had shown the token, and none could be evicted. Now the token holding
    the most connections gives one up, whoever asks; Prometheus's own token (or the read token,
    as before the scrape token existed) gets all 20."""
    config = sim_config(tmp_path, max_connections=32, max_connections_per_client=4, rate_limit_rps=1e6)
    with Running(config) as agent, BusyTokenHolder(agent.port, 32) as holder:
        assert holder.ready.wait(60), f"only {len(holder.served)} of 32 connections served"
        assert agent.service.http.connections == 32
        token = (tmp_path / "state" / "scrape.token").read_text().strip() if scraper == "scrape" else TOKEN
        assert answered(agent, token, 20) == 20
        assert holder.answered > 32  # it was served all along: busy, not shut out
        assert agent.daemon.tally.copy().refusals["evicted"] >= 20
