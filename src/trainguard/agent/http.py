"""A small HTTP/1.1 server on asyncio streams: keep-alive, TLS, and hard limits on what a client
may send or hold. The agent's API is read-only and its answers are cached per tick, so one event
loop thread serves thousands of requests a second on two cores (docs/agent.md compares stacks).

Limits, each counted by reason in ``trainguard_http_refusals_total`` when a request is refused:
the request line plus headers (``max_header_bytes``, 431), bodies (``max_body_bytes``, 413), open
connections (``max_connections``), and a client that sends or reads too slowly (timeouts).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0  # a client has this long to send its request (slowloris)
IDLE_TIMEOUT_S = 60.0  # an idle keep-alive connection is closed after this
WRITE_TIMEOUT_S = 10.0  # a client that does not read its answer is dropped
MAX_HEADERS = 100


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str  # as sent: path and query, still percent-encoded
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    client: str


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False
    refusal: str | None = None  # why the request was refused (for the counter), None if served

    @staticmethod
    def error(
        status: int,
        message: str,
        refusal: str | None = None,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        close: bool = False,
    ) -> Response:
        body = json.dumps({"error": message, "status": status}).encode()
        return Response(status, body, headers=headers, close=close, refusal=refusal)


Handler = Callable[[Request], Awaitable[Response]]
SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)


@dataclass(slots=True)
class Limits:
    max_header_bytes: int = 16384
    max_body_bytes: int = 1024
    max_connections: int = 256


@dataclass(slots=True)
class HttpServer:
    handler: Handler
    limits: Limits
    on_refusal: Callable[[str], None]
    connections: int = 0
    server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen; returns the port (useful with port 0)."""
        self.server = await asyncio.start_server(
            self._connection, host, port, ssl=tls, limit=self.limits.max_header_bytes, backlog=1024
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            if self.connections > self.limits.max_connections:
                self.on_refusal("too_many_connections")
                await self._send(writer, Response.error(503, "too many connections", close=True), head=False)
                return
            peer = writer.get_extra_info("peername")
            client = str(peer[0]) if isinstance(peer, tuple) else "local"
            first = True
            while await self._one(reader, writer, client, HEADER_TIMEOUT_S if first else IDLE_TIMEOUT_S):
                first = False
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client went away or was too slow: nothing to answer
        finally:
            self.connections -= 1
            self._tasks.discard(task)
            writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str, wait: float
    ) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
        except asyncio.IncompleteReadError:
            return False  # closed between requests
        except (asyncio.LimitOverrunError, ValueError):
            self.on_refusal("oversized")
            await self._send(
                writer, Response.error(431, "request header fields too large", close=True), head=False
            )
            return False
        request, problem = parse_head(head, client)
        if problem is not None or request is None:
            response = problem or Response.error(400, "bad request", "bad_request", close=True)
        else:
            response = await self._body_check(reader, request) or await self.handler(request)
        if response.refusal:
            self.on_refusal(response.refusal)
        keep = not response.close and request is not None and _keep_alive(request)
        await self._send(writer, response, head=request is not None and request.method == "HEAD", keep=keep)
        return keep

    async def _body_check(self, reader: asyncio.StreamReader, request: Request) -> Response | None:
        if "transfer-encoding" in request.headers:
            return Response.error(413, "request bodies are not accepted", "oversized", close=True)
        length_text = request.headers.get("content-length", "0").strip()
        if not length_text.isdigit():
            return Response.error(400, "bad Content-Length", "bad_request", close=True)
        length = int(length_text)
        if length > self.limits.max_body_bytes:
            return Response.error(
                413, f"request body over {self.limits.max_body_bytes} bytes", "oversized", close=True
            )
        if length:
            await asyncio.wait_for(reader.readexactly(length), HEADER_TIMEOUT_S)
        return None

    async def _send(self, writer: asyncio.StreamWriter, r: Response, head: bool, keep: bool = False) -> None:
        reason = HTTPStatus(r.status).phrase if r.status in HTTPStatus._value2member_map_ else ""
        lines = [
            f"HTTP/1.1 {r.status} {reason}",
            f"Content-Type: {r.content_type}",
            f"Content-Length: {len(r.body)}",
            f"Connection: {'keep-alive' if keep else 'close'}",
            *(f"{k}: {v}" for k, v in (*SECURITY_HEADERS, *r.headers)),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else r.body))
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


def parse_head(head: bytes, client: str) -> tuple[Request | None, Response | None]:
    """The request in ``head`` (request line + headers), or the error response to send."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        return None, None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None, Response.error(400, "malformed request line", "bad_request", close=True)
    method, target, version = parts
    headers: dict[str, str] = {"_version": version}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None, Response.error(400, "malformed header", "bad_request", close=True)
        headers[name.lower()] = value.strip()
    if len(headers) > MAX_HEADERS:
        return None, Response.error(431, "too many header fields", "oversized", close=True)
    split = urlsplit(target)
    query = parse_qs(split.query, keep_blank_values=True)
    return Request(method, target, split.path, query, headers, client), None


def _keep_alive(request: Request) -> bool:
    conn = request.headers.get("connection", "").lower()
    if request.headers.get("_version") == "HTTP/1.0":
        return conn == "keep-alive"
    return conn != "close"
