"""Bearer tokens in files: created mode 0600, refused when others can read them, compared in
constant time.

The node agent's read token (the dashboard), its scrape token (Prometheus: /metrics only), its
admin token (a breaker reset) and a remediation webhook's shared secret are all such files. A token is compared as a SHA-256 digest,
so not even its length leaks, and never logged. Browsers send it as the password of HTTP Basic
auth (any user name); API clients send ``Authorization: Bearer <token>``::

    >>> import os, tempfile
    >>> path = Path(tempfile.mkdtemp()) / "agent.token"
    >>> create_token_file(path), create_token_file(path)
    (True, False)
    >>> check = TokenCheck(path)
    >>> check.verify("Bearer " + path.read_text().strip()), check.verify("Bearer nope"), check.verify(None)
    (True, False, None)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from trainguard.errors import ConfigError

__all__ = ["TokenCheck", "create_token_file", "read_token"]


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
    """The token in ``path``; ConfigError (saying the fix) when it is missing, readable by group
    or others, unreadable, or shorter than 16 characters."""
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
