"""Webhook: the incident as a JSON POST, signed with HMAC-SHA256 so the receiver can trust it.

    POST <url>
    Content-Type: application/json
    X-Trainguard-Timestamp: 1732600000
    X-Trainguard-Signature: sha256=<hex of HMAC-SHA256(secret, timestamp + "." + body)>
    Idempotency-Key: <node>-<incident id>

The receiver checks the signature (``verify_signature``) and that the timestamp is recent, and
drops a repeated Idempotency-Key: a POST whose answer was lost (a timeout) is ambiguous, and is
repeated only with the same key, so the receiver sees it once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from trainguard.errors import ConfigError
from trainguard.remediate.providers import Outcome, Status, Target

__all__ = ["WebhookProvider", "sign", "verify_signature"]


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, timestamp: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


class WebhookProvider:
    name = "webhook"

    def __init__(
        self, url: str, secret: bytes, timeout_s: float = 10.0, clock: Callable[[], float] = time.time
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"webhook url {url!r} must start with http:// or https://")
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
        incident = payload.get("incident")
        inc_id = incident.get("id") if isinstance(incident, dict) else None
        key = f"{target.node}-{inc_id}"
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
                "X-Trainguard-Signature": sign(self.secret, ts, body),
                "Idempotency-Key": key,
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
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
