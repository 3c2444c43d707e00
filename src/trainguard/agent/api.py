"""The agent's routes: ``/healthz``, ``/metrics``, ``/api/v1/...`` and the dashboard at ``/``.

Every route but ``/healthz`` needs the token; the API is read-only (GET and HEAD). Refusals come
back as JSON errors (each closes its connection) and are counted by reason: ``method``,
``path_traversal``, ``token_in_query``, ``rate_limited``, ``unauthenticated``, ``wrong_token``,
``not_found`` (plus the server's ``oversized``, ``bad_request``, ``too_many_connections``,
``evicted``, ``write_timeout``).

The token is checked before the rate limit, and the two kinds of client have separate buckets
per address: requests with the right token, and everything else (no token, a wrong one,
``/healthz``). A flood without the token from the scraper's own address cannot spend the
scraper's requests.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from trainguard.agent import fleet_views, views
from trainguard.agent.admin import ADMIN_PATHS, breaker_reset, remediation_status
from trainguard.agent.messages import Request, Response

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon
    from trainguard.agent.prometheus import MetricsView
    from trainguard.agent.ratelimit import RateLimiter
    from trainguard.tokens import TokenCheck

JSON = "application/json"
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
        self, daemon: AgentDaemon, metrics: MetricsView, tokens: TokenCheck, limiter: RateLimiter
    ) -> None:
        self.daemon, self.metrics, self.tokens, self.limiter = daemon, metrics, tokens, limiter
        self.static = load_static()
        self._cache: dict[str, tuple[int, bytes]] = {}  # path -> (snapshot seq, body)
        self.routes: dict[str, Any] = {
            "/api/v1/node": views.node,
            "/api/v1/verdict": views.verdict,
            "/api/v1/gpus": views.gpus,
            "/api/v1/findings": views.findings,
            "/api/v1/history": views.history,
        }

    async def __call__(self, req: Request) -> Response:
        refused = self.gate(req)
        if refused is not None:
            return refused
        answer = await self._route(req)
        return replace(answer, authenticated=True) if req.path != "/healthz" else answer

    async def _route(self, req: Request) -> Response:
        path = req.path
        if path == "/healthz":
            return self.healthz()
        if path == "/metrics":
            from trainguard.agent.prometheus import CONTENT_TYPE

            return Response(200, self.metrics.render(), CONTENT_TYPE)
        if path in self.static:
            body, kind = self.static[path]
            return Response(200, body, kind)
        if path in ADMIN_PATHS:  # remediation: the admin token, checked there
            code, answer = breaker_reset(
                self.daemon, req.method, req.headers.get("authorization"), req.query, req.client
            )
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

    def gate(self, req: Request) -> Response | None:
        """The refusals, cheapest first; None lets the request through."""
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
        if req.path == "/healthz" or req.path in ADMIN_PATHS:  # the admin token is checked there
            return self._limit("anon", req)
        ok = self.tokens.verify(req.headers.get("authorization"))
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
        return self._limit("token", req)

    def _limit(self, kind: str, req: Request) -> Response | None:
        if self.limiter.allow(f"{kind}:{req.client}"):
            return None
        return Response.error(429, "rate limit exceeded", "rate_limited", headers=(("Retry-After", "1"),))

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
