"""Who may ask the agent anything: the bearer token and the per-client rate limit.

The token lives in a file only its owner can read (the agent refuses to start otherwise). It is
compared in constant time, as SHA-256 digests so not even its length leaks, and never logged.
Browsers send it as the password of HTTP Basic auth (any user name), so the dashboard works
without a login page; API clients send ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import stat
import time
from pathlib import Path

from trainguard.errors import ConfigError

log = logging.getLogger(__name__)


def create_token_file(path: Path) -> bool:
    """Create ``path`` (mode 0600) holding a new random token; False when it already exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return True


class TokenCheck:
    """The digest of the token in ``path``; ``reload()`` re-reads it (token rotation on SIGHUP)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._digest = _digest(read_token(path))

    def reload(self, path: Path | None = None) -> None:
        """Re-read the token (from ``path`` when given); on ConfigError nothing changes."""
        path = self.path if path is None else path
        digest = _digest(read_token(path))
        self.path, self._digest = path, digest

    def verify(self, authorization: str | None) -> bool | None:
        """True: the right token; False: a wrong one; None: no credentials at all."""
        if not authorization:
            return None
        scheme, _, value = authorization.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(_digest(value), self._digest)


def read_token(path: Path) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(
            f"token file {path} does not exist: create it (mode 0600) or leave token_file unset"
        ) from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"token file {path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}"
        )
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read token file {path}: {exc}") from None
    if len(token) < 16:
        raise ConfigError(
            f"token file {path} holds a token shorter than 16 characters: use a longer random one"
        )
    return token


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class RateLimiter:
    """A token bucket per client address: ``rate`` requests per second, ``burst`` at once.

    Bounded: past ``max_clients`` addresses the buckets that are full again are forgotten.
    """

    def __init__(
        self, rate: float, burst: int, max_clients: int = 4096, clock: object = time.monotonic
    ) -> None:
        self.rate, self.burst, self.max_clients = rate, burst, max_clients
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when)

    def allow(self, client: str) -> bool:
        now: float = self._clock()  # type: ignore[operator]
        tokens, when = self._buckets.get(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return False
        if client not in self._buckets and len(self._buckets) >= self.max_clients:
            self._forget_full(now)
        self._buckets[client] = (tokens - 1.0, now)
        return True

    def _forget_full(self, now: float) -> None:
        full = [c for c, (t, w) in self._buckets.items() if t + (now - w) * self.rate >= self.burst]
        for c in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[c]
