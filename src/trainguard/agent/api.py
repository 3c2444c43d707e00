"""The agent's routes: ``/healthz``, ``/metrics``, ``/api/v1/...`` and the dashboard at ``/``.

Every route but ``/healthz`` needs a token; the API is read-only (GET and HEAD). Three tokens:
the **read** token opens every route, the **scrape** token (Prometheus) ``/metrics`` alone, the
**admin** token the one write (agent/admin.py). Refusals come back as JSON errors (each closes
its connection) and are counted by reason: ``method``, ``path_traversal``, ``token_in_query``,
``rate_limited``, ``unauthenticated``, ``wrong_token``, ``forbidden``, ``not_found`` (plus the
server's ``oversized``, ``bad_request``, ``too_many_connections``, ``evicted``, ``write_timeout``).

    request -> refusals (method, path, token in the URL) -> /healthz: answered, no limit
            -> token (read | scrape | none) -> rate limit (a bucket per token and address)
            -> a turn in the FairQueue (the scrape token's reserved lane first; the others
               round robin per token and address) -> the route

The token is checked before the rate limit, and each kind of client has its own bucket per
address: a flood without a token from the scraper's own address spends none of its requests.
``/healthz`` has no limit (answering it costs what a 429 would) and takes no turn, so a flood
cannot make a kubelet's probe fail. Routes that show the breaker await its file off the event
loop for at most its view's timeout (remediate/breaker_view.py), and a breaker reset runs on a
thread of its own, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from dataclasses import replace
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from trainguard.agent import fleet_views, views
from trainguard.agent.admin import ADMIN_PATHS, admin_refusal, remediation_status, reset_breaker
from trainguard.agent.assemble import remediation_of
from trainguard.agent.fairqueue import LANE, FairQueue
from trainguard.agent.messages import Request, Response
from trainguard.remediate.breaker_view import SingleFlight

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon
    from trainguard.agent.prometheus import MetricsView
    from trainguard.agent.ratelimit import RateLimiter
    from trainguard.tokens import TokenCheck

JSON = "application/json"
RESET_WAIT_S = 5.0  # a breaker reset waits this long for the breaker file before answering 503
BREAKER_ROUTES = frozenset({"/metrics", "/api/v1/remediation"})  # they show the breaker's state
SCRAPE_ROUTES = frozenset({"/metrics"})  # all the scrape token opens
TOKEN_PARAMS = frozenset({"token", "access_token", "auth", "bearer", "api_key", "apikey", "key"})
CHALLENGE = (
    ("WWW-Authenticate", 'Bearer realm="trainguard"'),
    ("WWW-Authenticate", 'Basic realm="trainguard"'),
)
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css",
}


def load_static() -> dict[str, tuple[bytes, str]]:
    """Every dashboard asset, read once at start: URL path -> (body, content type)."""
    out: dict[str, tuple[bytes, str]] = {}
    root = resources.files("trainguard.agent") / "static"
    for item in root.iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in STATIC_TYPES:
            out[f"/static/{item.name}"] = (item.read_bytes(), STATIC_TYPES[suffix])
    out["/"] = out["/static/index.html"]
    out["/fleet"] = out["/static/fleet.html"]
    return out


class Api:
    def __init__(
        self,
        daemon: AgentDaemon,
        metrics: MetricsView,
        tokens: TokenCheck,
        limiter: RateLimiter,
        scrape_tokens: TokenCheck | None = None,
        queue: FairQueue | None = None,
    ) -> None:
        self.daemon, self.metrics, self.tokens, self.limiter = daemon, metrics, tokens, limiter
        self.scrape_tokens = scrape_tokens
        self.queue = queue or FairQueue()
        self.static = load_static()
        self._cache: dict[str, tuple[int, bytes]] = {}  # path -> (snapshot seq, body)
        self._resets: SingleFlight[tuple[int, dict[str, Any]]] = SingleFlight("trainguard-breaker-reset")
        self.routes: dict[str, Any] = {
            "/api/v1/node": views.node,
            "/api/v1/verdict": views.verdict,
            "/api/v1/gpus": views.gpus,
            "/api/v1/findings": views.findings,
            "/api/v1/history": views.history,
        }

    async def __call__(self, req: Request) -> Response:
        checked = self.gate(req)
        if isinstance(checked, Response):
            return checked
        if req.path == "/healthz":
            return self.healthz()
        if req.path in BREAKER_ROUTES:
            await self._fresh_breaker()
        key = LANE if checked == "scrape" else f"{checked or 'anon'}:{req.client}"
        async with self.queue.turn(key):
            answer = await self._route(req)
        if req.path in ADMIN_PATHS:
            return replace(answer, identity="admin") if answer.status == 200 else answer
        return replace(answer, identity=checked)

    async def _route(self, req: Request) -> Response:
        path = req.path
        if path == "/metrics":
            from trainguard.agent.prometheus import CONTENT_TYPE

            return Response(200, self.metrics.render(), CONTENT_TYPE)
        if path in self.static:
            body, kind = self.static[path]
            return Response(200, body, kind)
        if path in ADMIN_PATHS:  # remediation: the admin token, checked there
            code, answer = await self._reset(req)
            return Response(code, json.dumps(answer).encode(), JSON)
        if path == "/api/v1/remediation":
            code, answer = remediation_status(self.daemon)
            return Response(code, json.dumps(answer).encode(), JSON)
        if path == "/api/v1/openapi.json":
            from trainguard.agent.openapi import spec_bytes

            return Response(200, spec_bytes(), JSON)
        try:
            if path in self.routes:
                if req.query:
                    return self._json(self.routes[path](self.daemon, req.query))
                return Response(200, self._per_tick(path), JSON)
            if path.startswith("/api/v1/gpus/"):
                return self._json(views.gpu(self.daemon, path.rsplit("/", 1)[1]))
            if path in ("/api/v1/incidents", "/api/v1/jobs"):
                fn = views.incidents if path.endswith("incidents") else views.jobs
                return self._json(await asyncio.to_thread(fn, self.daemon, req.query))
            if path.startswith(fleet_views.PREFIX):  # the fleet page's API (agent/fleet_views.py)
                return self._json(await asyncio.to_thread(fleet_views.route, self.daemon, path, req.query))
        except views.NotFound as exc:
            return Response.error(404, str(exc), "not_found")
        except views.BadQuery as exc:
            return Response.error(400, str(exc), "bad_request")
        except views.Unavailable as exc:
            return Response.error(503, str(exc))
        return Response.error(404, f"no such path: {path}", "not_found")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Wait (at most ``timeout_s``) for a breaker reset still running: it writes the store,
        which closes next. One still hung on the breaker file after that has not reached it."""
        future = self._resets.in_flight()
        if future is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout_s)

    def gate(self, req: Request) -> Response | str:
        """The refusals, cheapest first; else who asks: ``read``, ``scrape``, or "" (no token
        needed: ``/healthz``, the admin route, which checks its own)."""
        if req.method not in ("GET", "HEAD") and not (req.method == "POST" and req.path in ADMIN_PATHS):
            return Response.error(
                405, "the agent's API is read-only (GET, HEAD)", "method", headers=(("Allow", "GET, HEAD"),)
            )
        decoded = unquote(unquote(req.path))
        if ".." in decoded.split("/") or "\\" in decoded or "\x00" in decoded or not req.path.startswith("/"):
            return Response.error(400, "path traversal refused", "path_traversal")
        if TOKEN_PARAMS & {k.lower() for k in req.query}:
            return Response.error(
                400,
                "never put the token in the URL (it ends up in logs): send Authorization: Bearer",
                "token_in_query",
            )
        if req.path == "/healthz":  # cheap and constant: no limit, so probes pass any flood
            return ""
        if req.path in ADMIN_PATHS:  # the admin token is checked there
            return self._limit("anon", req) or ""
        authorization = req.headers.get("authorization")
        ok = self.tokens.verify(authorization)
        if ok is not True and self.scrape_tokens is not None and self.scrape_tokens.verify(authorization):
            if req.path not in SCRAPE_ROUTES:
                return Response.error(403, "the scrape token reads /metrics only", "forbidden")
            return self._limit("scrape", req) or "scrape"
        if ok is not True:
            refused = self._limit("anon", req)
            if refused is not None:
                return refused
            if ok is None:
                return Response.error(
                    401,
                    "authentication required: Authorization: Bearer <token>",
                    "unauthenticated",
                    headers=CHALLENGE,
                )
            return Response.error(401, "wrong token", "wrong_token", headers=CHALLENGE)
        return self._limit("token", req) or "read"

    def _limit(self, kind: str, req: Request) -> Response | None:
        if self.limiter.allow(f"{kind}:{req.client}"):
            return None
        return Response.error(429, "rate limit exceeded", "rate_limited", headers=(("Retry-After", "1"),))

    async def _fresh_breaker(self) -> None:
        """A fresh read of the breaker file for the route about to show it, awaited off the
        event loop for at most its view's timeout; past that the route shows the last good
        state, marked stale (and no second read starts while this one hangs)."""
        remediation = remediation_of(self.daemon)
        if remediation is None:
            return
        view = remediation.breaker_view
        read = asyncio.wrap_future(view.refresh())
        try:
            await asyncio.wait_for(asyncio.shield(read), view.wait_s())
        except TimeoutError:
            view.gave_up()
        except Exception:
            pass
        if not read.done():  # nobody awaits it now: its outcome is the view's, not an unretrieved error
            read.add_done_callback(_ignore)

    async def _reset(self, req: Request) -> tuple[int, dict[str, Any]]:
        """``POST /api/v1/breaker/reset``: the admin check here, the reset (which reads and
        writes the breaker file) on a thread of its own, one at a time, awaited for at most
        ``RESET_WAIT_S``."""
        refused = admin_refusal(self.daemon, req.method, req.headers.get("authorization"))
        if refused is not None:
            return refused
        work = functools.partial(reset_breaker, self.daemon, req.query, req.client)
        future, started = self._resets.start(work)
        if not started:
            return 503, {"error": "a breaker reset is still waiting for the breaker file", "reason": "busy"}
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), RESET_WAIT_S)
        except TimeoutError:
            return 503, {
                "error": f"the breaker file did not answer within {RESET_WAIT_S:g} s (a hung filesystem?); "
                "the reset is applied when it does",
                "reason": "breaker_hung",
            }

    def healthz(self) -> Response:
        """Liveness for anyone: the state only. Why (paths, store errors) is behind the token,
        in /api/v1/node."""
        snap = self.daemon.snapshot
        if self.daemon.stalled():
            return Response(503, b'{"status":"failed"}', JSON)
        status = snap.health.value if snap.seq else "starting"
        return Response(200, json.dumps({"status": status}).encode(), JSON)

    def _per_tick(self, path: str) -> bytes:
        """The body of a query-less snapshot route, computed once per tick."""
        seq = self.daemon.snapshot.seq
        cached = self._cache.get(path)
        if cached is None or cached[0] != seq:
            # read seq first: a tick landing meanwhile leaves a body one tick old tagged as such
            cached = (seq, json.dumps(self.routes[path](self.daemon, {}), separators=(",", ":")).encode())
            self._cache[path] = cached
        return cached[1]

    def _json(self, value: Any) -> Response:
        return Response(200, json.dumps(value, separators=(",", ":")).encode(), JSON)


def _ignore(future: asyncio.Future[Any]) -> None:
    with contextlib.suppress(BaseException):
        future.exception()
