"""The webhook provider against a real HTTP server on loopback that checks the HMAC signature."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainguard.actions import Advice
from trainguard.errors import ConfigError
from trainguard.incidents.store import IncidentStore
from trainguard.records import Finding, Health
from trainguard.remediate import Remediator, parse_policy
from trainguard.remediate.providers import Status, Target
from trainguard.remediate.providers.webhook import WebhookProvider, sign, verify_signature

SECRET = b"0123456789abcdef-webhook-secret"


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[int] = []  # status codes to give, in order; then 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                code = outer.answers.pop(0) if outer.answers else 200
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


INTRUDER = Finding(
    "unexpected_gpu_process", Health.DEGRADED, Advice.CONTACT_SUPPORT,
    "pid 4242 (user mallory, xmrig --donate 0) on GPU 5 belongs to no job", gpu=5,
)  # fmt: skip


def test_webhook_posts_the_incident_signed(receiver: Receiver, tmp_path: Path) -> None:
    policy = parse_policy(
        {"remediation": {"enforce": True, "actions": {"unexpected_gpu_process": "webhook"}}}
    )
    hook = WebhookProvider(receiver.url, SECRET)
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(policy, "n1", store, state_dir=tmp_path, providers={"webhook": hook}).act(
            [INTRUDER]
        )
    assert rec.resolved and rec.resolution == "done: HTTP 200"
    ((headers, body),) = receiver.requests
    assert verify_signature(
        SECRET,
        headers["x-trainguard-timestamp"],
        body,
        headers["x-trainguard-signature"],
        headers["idempotency-key"],
    )
    assert not verify_signature(b"another-secret-of-16+", headers["x-trainguard-timestamp"], body,
                                headers["x-trainguard-signature"])  # fmt: skip
    sent = json.loads(body)
    assert sent["remedy"] == "webhook" and sent["incident"]["id"] == rec.id
    assert sent["finding"]["rule"] == "unexpected_gpu_process" and "xmrig" in sent["finding"]["reason"]
    assert headers["idempotency-key"] == f"n1-{rec.id}"


def test_tampered_body_fails_the_signature() -> None:
    sig = sign(SECRET, "100", b'{"node": "n1"}')
    assert verify_signature(SECRET, "100", b'{"node": "n1"}', sig, now=100)
    assert not verify_signature(SECRET, "100", b'{"node": "n2"}', sig, now=100)
    assert not verify_signature(SECRET, "101", b'{"node": "n1"}', sig, now=100)


def test_server_errors_are_retried_client_errors_are_not(receiver: Receiver) -> None:
    hook = WebhookProvider(receiver.url, SECRET)
    receiver.answers = [503]
    first = hook.apply("webhook", Target("n1", payload={"incident": {"id": 1}}))
    assert first.status is Status.FAILED and first.retry
    assert hook.apply("webhook", Target("n1", payload={"incident": {"id": 1}})).status is Status.DONE
    # delivered: asking again posts nothing (idempotent)
    assert hook.apply("webhook", Target("n1", payload={"incident": {"id": 1}})).status is Status.ALREADY
    receiver.answers = [400]
    bad = hook.apply("webhook", Target("n1", payload={"incident": {"id": 2}}))
    assert bad.status is Status.FAILED and not bad.retry
    assert len(receiver.requests) == 3


def test_nobody_listening_is_a_retryable_failure(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = WebhookProvider(f"http://127.0.0.1:{port}/", SECRET).apply("webhook", Target("n1"))
    assert out.status is Status.FAILED and out.retry


def test_bad_webhook_settings_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="https"):
        WebhookProvider("ftp://x", SECRET)
    with pytest.raises(ConfigError, match="loopback"):
        WebhookProvider("http://hooks.example.com/", SECRET)
    with pytest.raises(ConfigError, match="16 bytes"):
        WebhookProvider("http://127.0.0.1/", b"short")


def test_a_tripping_breaker_is_announced_once(receiver: Receiver, tmp_path: Path) -> None:
    from trainguard.remediate.policy import BreakerLimits, Policy
    from trainguard.remediate.providers.sim import SimScheduler

    xid = Finding("xid", Health.FAILED, Advice.REBOOT_NODE, "Xid 79: GPU has fallen off the bus.", gpu=1)
    lost = Finding("gpu_lost", Health.FAILED, Advice.REBOOT_NODE, "GPU stopped answering", gpu=1)  # NVML
    policy = Policy(enforce=True, breaker=BreakerLimits(max_nodes=1, max_fraction=1.0))
    hook = WebhookProvider(receiver.url, SECRET)
    with IncidentStore(tmp_path / "tg.db") as store:
        for node in ["a", "b", "c"]:
            Remediator(policy, node, store, state_dir=tmp_path / node, breaker_path=tmp_path / "b.json",
                       providers={"node": SimScheduler([node]), "webhook": hook}).act([xid, lost])  # fmt: skip
    ((_headers, body),) = receiver.requests  # b trips it (announced); c is held quietly
    sent = json.loads(body)
    assert sent["node"] == "b" and sent["incident"]["resolution"].startswith("held: fleet breaker tripped")
