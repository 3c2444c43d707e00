"""The agent's refusals, each counted: no token, a wrong one, a token in the URL, oversized
requests, path traversal, writes, floods; and the token never reaches a log line."""

from __future__ import annotations

import base64
import logging
import socket
from pathlib import Path

import pytest

from agent_service import TOKEN, Running, self_signed_cert, sim_config, write_token
from real_parts import require_real
from trainguard.agent.ratelimit import RateLimiter
from trainguard.errors import ConfigError
from trainguard.tokens import TokenCheck


@pytest.fixture
def agent(tmp_path: Path):
    with Running(sim_config(tmp_path)) as running:
        yield running


def closed_unanswered(s: socket.socket) -> bool:
    """The agent closed this connection without a word (a reset, or EOF before any byte)."""
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        return s.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def refusals(running: Running) -> dict[str, int]:
    return dict(running.daemon.tally.copy().refusals)


def test_every_refusal_is_answered_and_counted(agent: Running) -> None:
    assert agent.get("/api/v1/node", token=None)[0] == 401
    assert agent.get("/metrics", token="not-the-token-at-all")[0] == 401
    assert agent.get(f"/api/v1/node?token={TOKEN}", token=None)[0] == 400
    assert agent.get(f"/api/v1/node?access_token={TOKEN}")[0] == 400  # refused even with a good header
    assert agent.get("/static/../../../etc/passwd")[0] == 400
    assert agent.get("/static/%2e%2e/%2e%2e/etc/passwd")[0] == 400
    assert agent.get("/static/..%5c..%5cetc%5cpasswd")[0] == 400
    assert agent.get("/api/v1/node", headers={"X-Big": "x" * 20000})[0] == 431
    assert agent.get("/api/v1/node", method="POST", body=b"x" * 5000)[0] == 413
    assert agent.get("/api/v1/node", method="PUT", body=b"{}")[0] == 405
    assert agent.get("/api/v1/node", method="DELETE")[0] == 405
    counted = refusals(agent)
    assert counted == {
        "unauthenticated": 1,
        "wrong_token": 1,
        "token_in_query": 2,
        "path_traversal": 3,
        "oversized": 2,
        "method": 2,
    }


def test_oversized_body_is_refused_before_it_is_read(agent: Running) -> None:
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
        s.sendall(b"GET /api/v1/node HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413")
    assert refusals(agent) == {"oversized": 1}


def test_the_right_token_opens_everything_but_writes(agent: Running) -> None:
    assert agent.get("/api/v1/node")[0] == 200
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert agent.get("/", token=None, headers={"Authorization": f"Basic {basic}"})[0] == 200
    status, headers, _ = agent.get("/", token=None)
    assert status == 401 and "Basic" in headers["www-authenticate"]  # the browser asks for it
    assert agent.get("/healthz", token=None)[0] == 200  # the one open route
    assert refusals(agent) == {"unauthenticated": 1}


def test_a_client_flooding_the_agent_is_rate_limited(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path, rate_limit_rps=0.001, rate_limit_burst=3)) as agent:
        codes = [agent.get("/metrics", token=None)[0] for _ in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        assert refusals(agent) == {"unauthenticated": 3, "rate_limited": 2}
        assert [agent.get("/metrics")[0] for _ in range(3)] == [200] * 3  # the token's own bucket


def test_rate_limiter_refills_and_stays_bounded() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=2, max_clients=10, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    now[0] += 1.0
    assert limiter.allow("a")
    for i in range(100):
        limiter.allow(f"10.0.0.{i}")
    assert len(limiter._buckets) <= 10


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_agent_refuses_a_token_file_others_can_read(tmp_path: Path, mode: int) -> None:
    path = write_token(tmp_path / "token", mode=mode)
    with pytest.raises(ConfigError, match="chmod 600"):
        TokenCheck(path)


def test_token_check_accepts_only_the_token(tmp_path: Path) -> None:
    check = TokenCheck(write_token(tmp_path / "token"))
    assert check.verify(f"Bearer {TOKEN}") is True
    assert check.verify(f"Bearer {TOKEN}x") is False
    assert check.verify(f"Bearer {TOKEN[:-1]}") is False
    assert check.verify(f"Token {TOKEN}") is False
    assert check.verify("Basic !!!notbase64") is False
    assert check.verify(None) is None


def test_token_is_rotated_by_a_reload(tmp_path: Path) -> None:
    path = write_token(tmp_path / "token")
    check = TokenCheck(path)
    write_token(path, "another-token-0123456789")
    check.reload()
    assert check.verify(f"Bearer {TOKEN}") is False
    assert check.verify("Bearer another-token-0123456789") is True


def test_no_token_appears_in_any_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with Running(sim_config(tmp_path)) as agent:
        agent.get("/api/v1/node")
        agent.get("/api/v1/node", token=TOKEN + "wrong")
        agent.get(f"/api/v1/node?token={TOKEN}", token=None)
    assert caplog.records  # the agent did log (start, stop)
    assert not [r for r in caplog.records if TOKEN in r.getMessage()]


def test_agent_creates_a_private_token_when_none_is_configured(tmp_path: Path) -> None:
    config = sim_config(tmp_path, token_file="")
    with Running(config) as agent:
        path = Path(config.state_dir) / "agent.token"
        assert path.stat().st_mode & 0o077 == 0
        assert agent.get("/api/v1/node", token=path.read_text().strip())[0] == 200


def test_a_slow_client_is_dropped_and_others_are_served(tmp_path: Path) -> None:
    with (
        Running(sim_config(tmp_path, idle_timeout_s=0.3)) as agent,
        socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s,
    ):
        s.sendall(b"GET /api/v1/node HTTP/1.1\r\n")  # and never the rest
        assert agent.get("/api/v1/node")[0] == 200  # served meanwhile
        assert s.recv(100) == b""  # then the slow one is closed


def test_agent_serves_https_when_given_a_certificate(tmp_path: Path) -> None:
    require_real("openssl", install="apt-get install openssl")
    cert, key = self_signed_cert(tmp_path)
    with Running(sim_config(tmp_path, tls_cert=str(cert), tls_key=str(key))) as agent:
        assert agent.get("/api/v1/node")[0] == 200
        with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as s:
            s.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            )  # plain HTTP to a TLS port: no answer in clear
            assert not s.recv(100).startswith(b"HTTP/")


def ask(s: socket.socket, path: str = "/api/v1/node", token: str = TOKEN) -> bytes:
    """One request with ``token`` on a kept-alive connection; its answer read whole (b"" if
    the connection was closed)."""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(v)
        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
        if k.lower() == b"content-length"
    )
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_share_full_of_token_connections_gives_up_its_oldest_idle_one(tmp_path: Path) -> None:
    """A client's share held by keep-alives that showed the token: a newcomer takes the oldest's
    place (the token, holding the most, gives way); the others stay served."""
    with Running(sim_config(tmp_path, max_connections_per_client=2)) as agent:
        held = [socket.create_connection(("127.0.0.1", agent.port), timeout=10) for _ in range(2)]
        try:
            for s in held:
                assert ask(s).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as third:
                assert ask(third).startswith(b"HTTP/1.1 200")
                assert closed_unanswered(held[0])
                assert ask(held[1]).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        assert refusals(agent) == {"evicted": 1}


def test_a_new_connection_evicts_the_clients_oldest_one_without_a_token(tmp_path: Path) -> None:
    with Running(sim_config(tmp_path, max_connections_per_client=2)) as agent:
        silent = [socket.create_connection(("127.0.0.1", agent.port), timeout=10) for _ in range(2)]
        try:
            assert agent.get("/api/v1/node")[0] == 200  # room made by evicting a silent one
            assert closed_unanswered(silent[0])
        finally:
            for s in silent:
                s.close()
        assert refusals(agent)["evicted"] >= 1
