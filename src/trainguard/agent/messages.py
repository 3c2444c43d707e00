"""What the agent's API speaks: a ``Request`` in, a ``Response`` out (plain values, no server).

The server (``server.py``, the one module that imports aiohttp) turns HTTP into these and back,
so the routes (``api.py``) are plain functions that tests call without a socket.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str  # as sent: path and query, still percent-encoded
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    client: str  # the peer's address


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    refusal: str | None = None  # why the request was refused (for the counter), None if served
    identity: str = ""  # the token the request carried (read, scrape, admin); "": none

    @staticmethod
    def error(
        status: int, message: str, refusal: str | None = None, *, headers: tuple[tuple[str, str], ...] = ()
    ) -> Response:
        """An error answer; the server closes the connection after every one."""
        body = json.dumps({"error": message, "status": status}).encode()
        return Response(status, body, headers=headers, refusal=refusal)
