"""The agent's HTTP server: aiohttp's HTTP/1.1 behind a connection gate. The only aiohttp importer.

aiohttp parses and answers (keep-alive, header limits, a timeout on connections that never send
a request); the gate in front of it decides, before a TLS handshake costs anything, who may hold
a connection at all::

    accept -> the client's share full?  -> the total full?  (either: the holder of the most
           connections there gives one up) -> TLS handshake (timed out) -> aiohttp -> Api

A connection's **holder** is the token it has shown (read, scrape, admin), or its address while
it has shown none. When the agent is full, the holder with the most connections gives up its
oldest one with no request in flight (else its oldest); on a tie an address gives way before a
token. So strangers holding or churning connections from many addresses evict their own, and a
holder of the read token keeping every connection busy (or reconnecting as fast as it is
evicted) evicts its own, never the scraper's one fresh connection.

Every error answer closes its connection; a connection whose answer the client does not read
is aborted after ``write_timeout_s``; a connection counts until its socket is closed.

A request's head (request line and headers) is bounded before aiohttp parses it: the bytes a
connection sends before its request is complete are counted, and past ``max_header_bytes`` it is
answered 431 and closed (aiohttp's keep-alive timeout already closes a head trickled byte by
byte). aiohttp's parser keeps copies of an unfinished head (about twice its size), so what all
unfinished requests can hold is bounded by max_connections x max_header_bytes x a small factor
(128 x 16 KiB: a few MiB). When many connections go at once, freed memory is handed back to the system
(``malloc_trim``), so a burst does not leave the agent's resident size high. docs/agent.md says
why aiohttp and what each limit defends against.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

try:
    from aiohttp import web
    from aiohttp.http_exceptions import LineTooLong
    from aiohttp.web_protocol import RequestHandler
except ImportError:
    raise ImportError("the agent's HTTP server needs aiohttp: pip install 'trainguard[agent]'") from None

from trainguard.agent.messages import SECURITY_HEADERS, Request, Response

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
MAX_HEADERS = 32  # Prometheus sends 6, a browser about 15
MAX_LINE = 8190  # request line, and each header line (aiohttp's own default)
SWEEP_S = 0.5  # how often stuck writers are looked for
LINGER_S = 2.0  # a refused connection's unread input is dropped this long before it is closed
TRIM_AFTER = 16  # connections closed since the last trim that make the next sweep trim
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 24\r\n\r\nrequest head is too large"
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 16384  # a request's head: request line plus every header
    max_body_bytes: int = 1024
    max_connections: int = 128  # held at once, all clients
    max_connections_per_client: int = 16  # held at once by one address
    idle_timeout_s: float = 15.0  # a connection with no request in flight is closed after this
    tls_handshake_timeout_s: float = 5.0
    write_timeout_s: float = 10.0  # an answer the client does not read for this long: aborted


class _Conn:
    """One accepted connection: its client, the token it showed, whether a request is in flight."""

    __slots__ = (
        "busy",
        "client",
        "handler",
        "head_bytes",
        "identity",
        "lingering",
        "sock",
        "stuck_since",
        "tail",
        "waiting",
    )

    def __init__(self, client: str, sock: socket.socket) -> None:
        self.client, self.sock = client, sock
        self.handler: Any = None
        self.waiting: asyncio.Task[Any] | None = None  # waiting for a ClientHello: still ours to close
        self.identity = ""  # the token its requests showed (read, scrape, admin); "": none yet
        self.busy = 0  # requests being handled now
        self.stuck_since: float | None = None
        self.head_bytes = 0  # bytes received since the last request was complete
        self.tail = b""  # the last bytes received: a head's end may be split between reads
        self.lingering: float | None = None  # refused at: reading and dropping what the client sends

    @property
    def holder(self) -> tuple[str, str]:
        """Whose connection this counts as: (``"token"``, the token) or (``"address"``, the client)."""
        return ("token", self.identity) if self.identity else ("address", self.client)


class _Protocol(RequestHandler):
    """aiohttp's connection handler; what its parser refuses is counted, and logged without a
    traceback (a malformed request is the client's problem, not ours)."""

    on_refusal: Callable[[str], None] = staticmethod(lambda reason: None)
    on_data: Callable[[Any, bytes], bool] = staticmethod(lambda handler, data: True)

    def data_received(self, data: bytes) -> None:
        if self.on_data(self, data):  # False: the head is too large, the gate has closed us
            super().data_received(data)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if isinstance(exc, LineTooLong):
            status = 431
        if 400 <= status < 500:
            self.on_refusal("oversized" if status in (413, 431) else "bad_request")
        return super().handle_error(request, status, exc, message)

    def log_exception(self, *args: Any, **kw: Any) -> None:
        log.debug(*args, exc_info=kw.get("exc_info"))


class _AiohttpServer(web.Server):
    """aiohttp's low-level server, telling the gate when a connection is gone."""

    def __init__(
        self,
        *args: Any,
        on_lost: Callable[[Any], None],
        on_refusal: Callable[[str], None],
        on_data: Callable[[Any, bytes], bool],
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self._on_lost, self._on_refusal, self._on_data = on_lost, on_refusal, on_data

    def __call__(self) -> RequestHandler:
        handler = _Protocol(self, loop=self._loop, **self._kwargs)
        handler.on_refusal = self._on_refusal
        handler.on_data = self._on_data
        return handler

    def connection_lost(self, handler: Any, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._on_lost(handler)


class HttpServer:
    def __init__(self, handler: Handler, limits: Limits, on_refusal: Callable[[str], None]) -> None:
        self.handler, self.limits, self.on_refusal = handler, limits, on_refusal
        self._conns: dict[int, _Conn] = {}  # id(socket) -> connection, in accept order
        self._by_handler: dict[int, _Conn] = {}
        self._per_client: Counter[str] = Counter()
        self._server: Any = None  # made in start(): aiohttp needs the running loop
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tls: ssl.SSLContext | None = None
        self._closed_since_trim = 0

    @property
    def connections(self) -> int:
        """Connections held now (accepted, not yet closed)."""
        return len(self._conns)

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen; returns the port (useful with port 0)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock, self._tls = sock, tls
        self._server = _AiohttpServer(
            self._handle,
            on_lost=self._lost,
            on_refusal=self.on_refusal,
            on_data=self._on_data,
            keepalive_timeout=self.limits.idle_timeout_s,
            max_line_size=min(MAX_LINE, self.limits.max_header_bytes),
            max_field_size=min(MAX_LINE, self.limits.max_header_bytes),
            max_headers=MAX_HEADERS,
            lingering_time=1.0,
            access_log=None,
        )
        self._spawn(self._accept_loop())
        self._spawn(self._sweep_loop())
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.shutdown(2.0)
        for conn in list(self._conns.values()):
            self._abort(conn)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the gate ---------------------------------------------------------------------------

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                sock, addr = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and friends: wait for descriptors to come back
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            client = str(addr[0]) if isinstance(addr, tuple) else "local"
            if not self._admit(client):
                self.on_refusal("too_many_connections")
                _reset(sock)
                continue
            with contextlib.suppress(OSError):  # headers and body may go out in two writes
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, sock)
            self._conns[id(sock)] = conn
            self._per_client[client] += 1
            self._spawn(self._open(conn))

    def _admit(self, client: str) -> bool:
        """Room for one more connection from ``client``, within its own share and the total;
        when either is full, the holder of the most connections there gives one up."""
        if self._per_client[client] >= self.limits.max_connections_per_client:
            return self._evict([c for c in self._conns.values() if c.client == client])
        if len(self._conns) >= self.limits.max_connections:
            return self._evict(list(self._conns.values()))
        return True

    def _evict(self, among: list[_Conn]) -> bool:
        """Abort one of ``among`` (in accept order): of the holder with the most connections
        (an address before a token on a tie), the oldest with no request in flight, else its
        oldest. False when there is none."""
        held = Counter(c.holder for c in among)
        if not held:
            return False
        holder = max(held, key=lambda h: (held[h], h[0] == "address"))
        theirs = [c for c in among if c.holder == holder]
        victim = next((c for c in theirs if not c.busy), theirs[0])
        self.on_refusal("evicted")
        self._abort(victim)
        return True

    async def _open(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        factory = functools.partial(self._new_handler, conn)
        timeout = self.limits.tls_handshake_timeout_s
        deadline = loop.time() + timeout
        try:
            if not self._holds(conn):  # evicted before this task ran
                raise ConnectionAbortedError("evicted before it was served")
            if self._tls is not None:
                # asyncio's TLS transport takes a 256 KiB buffer at once: only for a client that
                # has sent its ClientHello. A silent one costs a socket until the deadline.
                conn.waiting = asyncio.current_task()
                try:
                    await asyncio.wait_for(_readable(loop, conn.sock), timeout)
                finally:
                    conn.waiting = None
                if not self._holds(conn):
                    raise ConnectionAbortedError("evicted before its handshake")
                if _closed_by_peer(conn.sock):  # a churned connection: no TLS state for it
                    raise ConnectionAbortedError("closed before its ClientHello")
            await loop.connect_accepted_socket(
                factory,
                conn.sock,
                ssl=self._tls,
                ssl_handshake_timeout=max(0.1, deadline - loop.time()) if self._tls else None,
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError, asyncio.CancelledError) as exc:
            log.debug("connection from %s dropped before HTTP: %r", conn.client, exc)
            self._release(conn)
            _reset(conn.sock)

    def _new_handler(self, conn: _Conn) -> Any:
        handler = self._server()
        conn.handler = handler
        self._by_handler[id(handler)] = conn
        return handler

    def _lost(self, handler: Any) -> None:
        conn = self._by_handler.pop(id(handler), None)
        if conn is not None:
            self._release(conn)
        self._closed_since_trim += 1

    def _on_data(self, handler: Any, data: bytes) -> bool:
        """Count what a connection sends until its request head is complete; False (the data
        is dropped) once that is more than a request head may be: the connection is answered
        431, its sending side shut, and what the client still sends is read and dropped until
        it closes or ``LINGER_S`` passes (closing at once would make the client's kernel drop
        the answer when the next bytes it sends are answered with a reset)."""
        conn = self._by_handler.get(id(handler))
        if conn is None:
            return True
        if conn.lingering is not None:
            return False
        seen = conn.tail + data
        end = seen.rfind(b"\r\n\r\n")  # the last complete head: the count starts after it
        conn.head_bytes = len(seen) - end - 4 if end >= 0 else conn.head_bytes + len(data)
        conn.tail = seen[-3:]
        if conn.head_bytes <= self.limits.max_header_bytes + self.limits.max_body_bytes:
            return True
        self.on_refusal("oversized")
        conn.lingering = asyncio.get_running_loop().time()
        transport = handler.transport
        if transport is not None:
            transport.write(_TOO_LARGE)
            if transport.can_write_eof():
                transport.write_eof()
            else:  # TLS: no half-close
                transport.close()
        return False

    def _holds(self, conn: _Conn) -> bool:
        return self._conns.get(id(conn.sock)) is conn

    def _release(self, conn: _Conn) -> None:
        if self._conns.pop(id(conn.sock), None) is not None:
            self._per_client[conn.client] -= 1
            if self._per_client[conn.client] <= 0:
                del self._per_client[conn.client]
        if conn.handler is not None:
            self._by_handler.pop(id(conn.handler), None)

    def _abort(self, conn: _Conn) -> None:
        self._release(conn)  # now: a burst of accepts must not pick the same victim twice
        transport = getattr(conn.handler, "transport", None)
        if transport is not None:
            transport.abort()
            return
        if conn.waiting is not None:  # no ClientHello yet: the socket is still ours
            conn.waiting.cancel()
            return
        if conn.handler is None:  # its task has not started: it sees the eviction and closes
            return
        # In its TLS handshake: the socket belongs to asyncio's transport. Shutting it down
        # makes the handshake fail at once, and the transport closes it.
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)

    async def _sweep_loop(self) -> None:
        """Abort connections whose answers sit unread past the write timeout, and refused ones
        past their lingering time; hand memory back after many connections closed."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            if self._closed_since_trim >= TRIM_AFTER:
                self._closed_since_trim = 0
                _trim()
            for conn in list(self._conns.values()):
                if conn.lingering is not None and now - conn.lingering > LINGER_S:
                    self._abort(conn)
                    continue
                transport = getattr(conn.handler, "transport", None)
                if transport is None or transport.get_write_buffer_size() == 0:
                    conn.stuck_since = None
                elif conn.stuck_since is None:
                    conn.stuck_since = now
                elif now - conn.stuck_since > self.limits.write_timeout_s:
                    log.debug("aborting %s: its answer sat unread", conn.client)
                    self.on_refusal("write_timeout")
                    self._abort(conn)

    # -- one request ------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        client = str(peer[0]) if isinstance(peer, tuple) else "local"
        target = urlsplit(request.raw_path)
        req = Request(
            request.method,
            request.raw_path,
            target.path,
            parse_qs(target.query, keep_blank_values=True),
            {k.lower(): v for k, v in request.headers.items()},
            client,
        )
        conn = self._by_handler.get(id(request.protocol))
        if conn is not None:
            conn.busy += 1
        try:
            answer = self._body_check(request) or _header_check(req) or await self.handler(req)
        finally:
            if conn is not None:
                conn.busy -= 1
        if answer.refusal:
            self.on_refusal(answer.refusal)
        if answer.identity and conn is not None:
            conn.identity = answer.identity  # it counts as its token's from now on
        resp = web.Response(
            status=answer.status,
            body=answer.body,  # aiohttp leaves it out of a HEAD answer, keeping its length
            headers={**dict(SECURITY_HEADERS), "Content-Type": answer.content_type},
        )
        for name, value in answer.headers:  # add: two WWW-Authenticate challenges stay two headers
            resp.headers.add(name, value)
        if answer.status >= 400:
            resp.force_close()  # every error answer ends its connection
        return resp

    def _body_check(self, request: web.BaseRequest) -> Response | None:
        if "Transfer-Encoding" in request.headers:
            return Response.error(413, "request bodies are not accepted", "oversized")
        length = request.content_length  # aiohttp has refused a malformed Content-Length already
        if length is not None and length > self.limits.max_body_bytes:
            return Response.error(413, f"request body over {self.limits.max_body_bytes} bytes", "oversized")
        return None


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether a readable socket's client has already gone (EOF or reset, nothing to read)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _header_check(req: Request) -> Response | None:
    """A credential header that is not ASCII cannot hold a token (ours are hex): a 400 here,
    before the API compares it (where encoding it failed as a 500)."""
    value = req.headers.get("authorization")
    if value is not None and not value.isascii():
        return Response.error(400, "the Authorization header must be ASCII", "bad_request")
    return None


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Until ``sock`` has bytes to read (or is closed)."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _trim() -> None:
    """Hand freed heap memory back to the system (glibc's malloc_trim; elsewhere nothing): after
    many connections closed, their parsers' buffers would otherwise stay in the resident size."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset(sock: socket.socket) -> None:
    """Close at once, with a reset: nothing lingers in TIME_WAIT or on a full send buffer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
