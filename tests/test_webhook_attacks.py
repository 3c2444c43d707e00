"""The webhook attacked (issue 34): a key shared by every incident the store had not numbered,
a year-old capture that still verified, an Idempotency-Key outside the signature, headers that
crashed the check, a plain-http URL and redirects followed. Against a real HTTP server on
loopback (test_remediate_webhook.Receiver)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from test_remediate_webhook import SECRET, Receiver, receiver  # noqa: F401 (the fixture)
from trainguard.errors import ConfigError
from trainguard.remediate.providers import Status, Target
from trainguard.remediate.providers.webhook import WebhookProvider, sign, verify_signature


def unnumbered(summary: str) -> Target:
    """An incident spooled while the store was away: it has no id yet."""
    return Target("n1", payload={"incident": {"id": None, "time": 1.0, "summary": summary}})


def test_incidents_the_store_has_not_numbered_are_each_delivered(receiver: Receiver) -> None:  # noqa: F811
    hook = WebhookProvider(receiver.url, SECRET)
    assert hook.apply("webhook", unnumbered("Xid 79 on GPU 1")).status is Status.DONE
    assert hook.apply("webhook", unnumbered("ECC DBE on GPU 2")).status is Status.DONE
    assert hook.apply("webhook", unnumbered("Xid 79 on GPU 1")).status is Status.ALREADY  # itself again
    keys = [headers["idempotency-key"] for headers, _ in receiver.requests]
    assert len(keys) == 2 and len(set(keys)) == 2


def test_a_capture_replayed_later_or_with_another_key_does_not_verify(receiver: Receiver) -> None:  # noqa: F811
    clock = [1_700_000_000.0]
    WebhookProvider(receiver.url, SECRET, clock=lambda: clock[0]).apply(
        "webhook", Target("n1", payload={"incident": {"id": 7}})
    )
    ((headers, body),) = receiver.requests
    ts, sig, key = (
        headers["x-trainguard-timestamp"],
        headers["x-trainguard-signature"],
        headers["idempotency-key"],
    )
    assert verify_signature(SECRET, ts, body, sig, key, now=clock[0] + 10)
    assert not verify_signature(SECRET, ts, body, sig, key, now=clock[0] + 365 * 86400)  # a year on
    assert not verify_signature(SECRET, ts, body, sig, "n1-8", now=clock[0])  # the key is signed


@pytest.mark.parametrize("signature", [None, "sha256=ünïcode", "", 42])
def test_a_missing_or_odd_signature_is_false_not_an_exception(signature: object) -> None:
    assert verify_signature(SECRET, "100", b"{}", signature, now=100) is False
    assert verify_signature(SECRET, None, b"{}", sign(SECRET, "100", b"{}"), now=100) is False


def test_plain_http_is_refused_unless_it_stays_on_this_host() -> None:
    with pytest.raises(ConfigError, match="https://"):
        WebhookProvider("http://hooks.example.com/trainguard", SECRET)
    WebhookProvider("http://127.0.0.1:8080/relay", SECRET)
    WebhookProvider("https://hooks.example.com/trainguard", SECRET)


@pytest.fixture
def redirector(receiver: Receiver) -> Iterator[str]:  # noqa: F811
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(302)  # urllib would follow it (as a GET)
            self.send_header("Location", receiver.url)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_a_redirect_is_refused_not_followed(redirector: str, receiver: Receiver) -> None:  # noqa: F811
    out = WebhookProvider(redirector, SECRET).apply("webhook", Target("n1", payload={"incident": {"id": 1}}))
    assert out.status is Status.FAILED and "redirect" in out.detail and not out.retry
    assert receiver.requests == []  # the signed incident went nowhere else
