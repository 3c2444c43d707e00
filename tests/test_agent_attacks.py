"""The agent's HTTP side, attacked as a stranger on the node's loopback would: each test is one
attack that took the hand-written server down (issue 19), bounded in size and time.

Strangers connect from 127.0.0.2 (all of 127/8 is loopback), the scraper from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from agent_service import TOKEN, Running, self_signed_cert, sim_config, write_token
from real_parts import require_real
from trainguard.agent.assemble import remediation_of
from trainguard.agent.serve import tls_context
from trainguard.errors import ConfigError

STRANGER = "127.0.0.2"


def connect(port: int, source: str = STRANGER) -> socket.socket:
    s = socket.socket()
    s.settimeout(10)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s: socket.socket, ceiling_s: float = 30.0) -> bool:
    """True once the agent has closed ``s`` (EOF or reset), reading and dropping what it sent."""
    s.settimeout(ceiling_s)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def scrapes(agent: Running, n: int = 10) -> list[int]:
    return [agent.get("/metrics")[0] for _ in range(n)]


def wait_for(pred, what: str, ceiling_s: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + ceiling_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def held_by_server(port: int) -> int:
    """Established TCP connections whose local end is the agent's port (from the kernel)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as fh:
            for row in fh.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                n += int(local.rsplit(":", 1)[1], 16) == port and state == "01"
    return n


def test_idle_keep_alives_of_a_stranger_deny_no_scrape(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path, max_connections=32)) as agent:
        refused = []
        for _ in range(64):  # ask without a token, then hold the connection
            s = connect(agent.port)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 401")
            refused.append(s)
        assert all(closed_by_server(s) for s in refused)  # every error answer ends its connection
        idle = [connect(agent.port) for _ in range(64)]  # and connections that never ask
        try:
            assert scrapes(agent) == [200] * 10
            assert agent.service.http.connections <= 32
        finally:
            for s in [*refused, *idle]:
                s.close()


def test_silent_tls_connections_are_timed_out_and_deny_no_scrape(tmp_path: Path) -> None:
    require_real("openssl", install="apt-get install openssl")
    cert, key = self_signed_cert(tmp_path)
    config = sim_config(
        tmp_path, tls_cert=str(cert), tls_key=str(key), max_connections=32, tls_handshake_timeout_s=1.0
    )
    with Running(config) as agent:
        silent = [connect(agent.port) for _ in range(64)]  # TCP, and never a ClientHello
        try:
            assert scrapes(agent) == [200] * 10
            assert agent.service.http.connections <= 32
            held = [s for s in silent if not closed_by_server(s, 0.01)]
            assert all(closed_by_server(s) for s in held)  # the handshake timed out
        finally:
            for s in silent:
                s.close()


def test_an_unauthenticated_flood_from_the_scrapers_address_spends_none_of_its_requests(
    tmp_path: Path,
) -> None:
    with Running(sim_config(tmp_path, rate_limit_rps=0.001, rate_limit_burst=5)) as agent:
        flood = [agent.get("/metrics", token=None)[0] for _ in range(40)]  # same address, no token
        assert set(flood) == {401, 429}
        assert scrapes(agent, 5) == [200] * 5


@pytest.mark.parametrize("length", [b"\xb2", "\u00b2".encode(), b"9" * 5000, b"-1", b"1, 2"])
def test_a_bad_content_length_is_answered_and_closed_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, length: bytes
) -> None:
    caplog.set_level(logging.DEBUG)
    with Running(sim_config(tmp_path)) as agent:
        s = connect(agent.port)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
        assert s.recv(4096).split(b"\r\n")[0].endswith(b" 400 Bad Request")
        assert closed_by_server(s)
        s.close()
        assert agent.daemon.tally.copy().refusals["bad_request"] == 1
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.exc_info]
    assert loud == []


BAD_NUMBERS = ["limit=inf", "limit=nan", "limit=1e400", "since=nan", "limit=1e3"]


@pytest.mark.parametrize(
    ("path", "query"),
    [("/api/v1/incidents", q) for q in [*BAD_NUMBERS, "offset=inf"]]
    + [("/api/v1/fleet/incidents", q) for q in BAD_NUMBERS],
)
def test_non_finite_numbers_in_a_query_are_a_clear_400(tmp_path: Path, path: str, query: str) -> None:
    with Running(sim_config(tmp_path)) as agent:
        status, _, body = agent.get(f"{path}?{query}")
        assert status == 400 and query.split("=")[0] in json.loads(body)["error"]


def test_a_client_that_never_reads_its_answers_is_cut_off(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path, write_timeout_s=1.0)) as agent:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", agent.port))
        ask = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
        s.settimeout(5)
        with contextlib.suppress(OSError):  # megabytes of answers queued, none read
            for _ in range(400):
                s.sendall(ask)
        try:
            wait_for(lambda: held_by_server(agent.port) == 0, "the server let go of the socket")
            assert agent.service.http.connections == 0
            assert agent.daemon.tally.copy().refusals["write_timeout"] == 1
        finally:
            s.close()


def test_a_reload_that_fails_on_the_token_file_changes_nothing(tmp_path: Path) -> None:
    config = sim_config(tmp_path)
    with Running(config) as agent:
        bad = write_token(tmp_path / "world-readable.token", mode=0o644)
        changed = dataclasses.replace(config, rate_limit_rps=1234.0, token_file=str(bad))
        with pytest.raises(ConfigError, match="chmod 600"):
            agent.service.reload(changed, None)
        assert agent.service.limiter.rate == config.rate_limit_rps
        assert agent.daemon.config is config
        assert agent.get("/api/v1/node")[0] == 200  # the old token still opens it


def test_a_world_readable_tls_key_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "tls.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    key.chmod(0o644)
    config = sim_config(tmp_path, tls_cert=str(tmp_path / "tls.crt"), tls_key=str(key))
    with pytest.raises(ConfigError, match=f"chmod 600 {key}"):
        tls_context(config)


def test_the_incident_store_is_private_to_the_agent(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path)) as agent:
        agent.daemon.sim.now().xid(79, gpu=3)
        agent.daemon.step()
        assert agent.json("/api/v1/incidents")["total"] == 1
    for path in tmp_path.glob("tg.db*"):
        assert path.stat().st_mode & 0o077 == 0, path


def test_incidents_are_counted_when_written_not_when_created(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file where the store's directory should be")
    with Running(sim_config(tmp_path, db=str(tmp_path / "blocked" / "tg.db"))) as agent:
        agent.daemon.sim.now().xid(79, gpu=3)
        agent.daemon.step()
        assert agent.daemon.pending == 1
        text = agent.get("/metrics")[2].decode()
        assert "trainguard_incidents_total{" not in text  # nothing written yet


def test_silent_connections_on_the_scrapers_own_address_cannot_keep_it_out(tmp_path: Path) -> None:
    """A stranger sharing the scraper's address holds its whole share without a word: each new
    connection evicts the oldest silent one."""
    with Running(sim_config(tmp_path, max_connections_per_client=4)) as agent:
        mine = [connect(agent.port, "127.0.0.1") for _ in range(4)]
        try:
            assert scrapes(agent, 5) == [200] * 5
        finally:
            for s in mine:
                s.close()


def test_probes_of_healthz_pass_a_flood_from_their_own_address(tmp_path: Path) -> None:
    """Issue 34: /healthz shared the unauthenticated bucket, so a flood from the probe's address
    made kubelet-style probes fail (429 in 13 and 14 of 15). It has no limit now: answering it
    costs what a 429 would."""
    with Running(sim_config(tmp_path, rate_limit_rps=0.001, rate_limit_burst=5)) as agent:
        probes = []
        for _ in range(15):
            flood = [agent.get(p, token=None)[0] for p in ("/metrics", "/healthz") * 4]  # same address
            assert 429 in flood or 401 in flood
            probes.append(agent.get("/healthz", token=None)[0])
        assert probes == [200] * 15
        assert agent.daemon.tally.copy().refusals["rate_limited"] > 0  # the flood was limited


def release_fifo(path: Path) -> None:
    """Let a read hung on the FIFO at ``path`` finish (it reads an empty breaker), then put an
    ordinary file's absence in its place."""
    with contextlib.suppress(OSError):  # ENXIO: no reader waits on it
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"{}")
        os.close(fd)
    path.unlink(missing_ok=True)


def test_a_breaker_file_that_hangs_blocks_no_route(tmp_path: Path) -> None:
    """Issue 34: a FIFO in the breaker file's place (a hung NFS mount) hung every route, /healthz
    included. The file is read on one thread of its own: routes answer, /metrics shows the last
    good state marked stale, the agent says degraded, and however often it is asked, one read
    waits on the file."""
    with Running(sim_config(tmp_path)) as agent:
        path = remediation_of(agent.daemon).remediator.breaker.path
        assert agent.get("/metrics")[0] == 200  # read once, fine: no file is a closed breaker
        os.mkfifo(path)  # no writer: open() blocks until one comes, as on a hung mount
        try:
            agent.daemon.step()  # a tick passes (every second in a real agent): /metrics is new
            for _ in range(5):
                status, _, body = agent.get("/metrics")
                assert status == 200
                text = body.decode()
                assert "trainguard_remediation_breaker_open 0.0" in text  # the last good state
                assert "trainguard_remediation_breaker_stale 1.0" in text
            assert agent.get("/healthz", token=None)[0] == 200
            assert agent.json("/api/v1/remediation")["breaker"]["stale"] is True
            agent.daemon.step()  # this tick waits on no hung read
            assert json.loads(agent.get("/healthz", token=None)[2]) == {"status": "degraded"}
            problems = agent.json("/api/v1/node")["agent"]["problems"]
            assert any("breaker file" in p and "has not returned" in p for p in problems), problems
            readers = [t for t in threading.enumerate() if t.name == "trainguard-breaker-read"]
            assert len(readers) == 1
        finally:
            release_fifo(path)
        wait_for(
            lambda: "trainguard_remediation_breaker_stale 0.0" in agent.get("/metrics")[2].decode(),
            "a fresh read once the file answers",
        )
        agent.daemon.step()
        assert json.loads(agent.get("/healthz", token=None)[2]) == {"status": "ok"}


def test_a_breaker_reset_waits_on_a_hung_file_off_the_loop_one_at_a_time(tmp_path: Path) -> None:
    admin = write_token(tmp_path / "admin.token", "admin-token-0123456789abcdef")
    with Running(sim_config(tmp_path, admin_token_file=str(admin))) as agent:
        path = remediation_of(agent.daemon).remediator.breaker.path
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        try:
            with mock.patch("trainguard.agent.api.RESET_WAIT_S", 0.5, create=True):
                code, _, body = agent.get(
                    "/api/v1/breaker/reset", token="admin-token-0123456789abcdef", method="POST"
                )
                assert code == 503 and json.loads(body)["reason"] == "breaker_hung"
                code, _, body = agent.get(
                    "/api/v1/breaker/reset", token="admin-token-0123456789abcdef", method="POST"
                )
                assert code == 503 and json.loads(body)["reason"] == "busy"  # no second thread on the file
            assert agent.get("/healthz", token=None)[0] == 200
        finally:
            release_fifo(path)


def test_the_admin_refusal_names_no_path(tmp_path: Path) -> None:
    """Issue 34: the 403 to a wrong admin token named the admin token's file."""
    (tmp_path / "secret-place").mkdir()
    admin = write_token(tmp_path / "secret-place" / "admin.token", "admin-token-0123456789abcdef")
    with Running(sim_config(tmp_path, admin_token_file=str(admin))) as agent:
        for token in (TOKEN, None, "guess-0123456789abcdef"):
            code, _, body = agent.get("/api/v1/breaker/reset", token=token, method="POST")
            assert code == 403
            assert b"secret-place" not in body and str(tmp_path).encode() not in body, body
