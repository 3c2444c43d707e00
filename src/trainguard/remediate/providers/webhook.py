"""Webhook: the incident as a JSON POST, signed with HMAC-SHA256 so the receiver can trust it.

    POST <url>
    Content-Type: application/json
    X-Trainguard-Timestamp: 1732600000
    X-Trainguard-Signature: sha256=<hex of HMAC-SHA256(secret, timestamp + "." + key + "." + body)>
    Idempotency-Key: <node>-<incident id>  (an incident not yet stored: <node>-<digest of it>)

The receiver checks the signature and that the timestamp is within five minutes
(``verify_signature``: a captured request replayed later fails), and drops a repeated
Idempotency-Key, which the signature covers: a POST whose answer was lost (a timeout) is
ambiguous, and is repeated only with the same key, so the receiver sees it once. The URL must be
``https://`` (``http://`` only to a loopback address, e.g. a local relay), and a redirect is
refused, not followed: the signed incident goes where it was configured to, or nowhere.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError
from trainguard.remediate.providers import Outcome, Status, Target

__all__ = ["WebhookProvider", "idempotency_key", "sign", "verify_signature"]


MAX_AGE_S = 300.0  # a signed request older (or newer) than this is refused by verify_signature


def sign(secret: bytes, timestamp: str, body: bytes, key: str = "") -> str:
    signed = timestamp.encode() + b"." + key.encode() + b"." + body
    return "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()


def verify_signature(
    secret: bytes,
    timestamp: Any,
    body: bytes,
    signature: Any,
    key: str = "",
    *,
    now: float | None = None,
    max_age_s: float = MAX_AGE_S,
) -> bool:
    """Whether a webhook request is ours and fresh: the signature over timestamp, Idempotency-Key
    and body, and a timestamp within ``max_age_s`` of ``now``. Headers as received: a missing or
    non-ASCII value is False, never an exception."""
    if not isinstance(timestamp, str) or not isinstance(signature, str) or not signature.isascii():
        return False
    if not isinstance(key, str) or not key.isascii():
        return False
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > max_age_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body, key), signature)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kw: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect)


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def idempotency_key(node: str, incident: Any) -> str:
    """``<node>-<incident id>``; an incident the store has not numbered yet (spooled while the
    database is away) gets a digest of itself instead, so two such incidents never share a key."""
    inc_id = incident.get("id") if isinstance(incident, dict) else None
    if inc_id is not None:
        return f"{node}-{inc_id}"
    digest = hashlib.sha256(json.dumps(incident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{node}-{digest}"


class WebhookProvider:
    name = "webhook"

    def __init__(
        self, url: str, secret: bytes, timeout_s: float = 10.0, clock: Callable[[], float] = time.time
    ) -> None:
        if not url.startswith("https://") and not (url.startswith("http://") and _loopback(url)):
            raise ConfigError(
                f"webhook url {url!r} must start with https:// (http:// only to a loopback address): "
                "the incident travels with its signature"
            )
        if len(secret) < 16:
            raise ConfigError("the webhook secret must be at least 16 bytes: use a long random one")
        self.url, self.secret, self.timeout_s, self.clock = url, secret, timeout_s, clock
        self._delivered: set[str] = set()  # keys answered 2xx: never posted again

    @classmethod
    def from_secret_file(cls, url: str, path: str | Path) -> WebhookProvider:
        from trainguard.tokens import read_token  # same rules: mode 0600, long enough

        return cls(url, read_token(Path(path)).encode())

    def apply(self, remedy: str, target: Target) -> Outcome:
        payload = dict(target.payload or {})
        key = idempotency_key(target.node, payload.get("incident"))
        if key in self._delivered:
            return Outcome(Status.ALREADY, f"already delivered ({key})")
        body = json.dumps({"remedy": remedy, "node": target.node, "gpu": target.gpu,
                           "reason": target.reason, **payload}, sort_keys=True).encode()  # fmt: skip
        ts = str(int(self.clock()))
        req = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "trainguard-agent",
                "X-Trainguard-Timestamp": ts,
                "X-Trainguard-Signature": sign(self.secret, ts, body, key),
                "Idempotency-Key": key,
            },
        )
        try:
            with _OPENER.open(req, timeout=self.timeout_s) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = exc.headers.get("Location", "?") if exc.headers else "?"
                return Outcome(Status.FAILED, f"HTTP {exc.code} from {self.url}: redirect to {where} refused")
            # 5xx and 429: the receiver may take it later; other 4xx: it never will
            return Outcome(
                Status.FAILED, f"HTTP {exc.code} from {self.url}", retry=exc.code >= 500 or exc.code == 429
            )
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):  # nothing was sent
                return Outcome(Status.FAILED, f"{self.url}: connection refused", retry=True)
            return Outcome(Status.AMBIGUOUS, f"{self.url}: {exc.reason}")
        except (TimeoutError, OSError) as exc:  # sent, answer lost: the receiver may have it
            return Outcome(Status.AMBIGUOUS, f"{self.url}: {exc}")
        self._delivered.add(key)
        return Outcome(Status.DONE, f"HTTP {status}")

    def verify(self, remedy: str, target: Target) -> bool | None:
        # The receiver cannot be asked; a repeat carries the same Idempotency-Key, which it drops.
        return False
