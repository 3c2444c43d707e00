"""Running the agent: the sampling thread, the HTTP server and the signals, until SIGTERM.

    run_agent(config, thresholds)     # what `trainguard agent` calls

SIGTERM and SIGINT stop it cleanly (the server stops accepting, the loop finishes its tick, the
store and the state are closed); SIGHUP re-reads the config file and the token files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.agent import AgentConfig, AgentDaemon
from trainguard.agent.api import Api
from trainguard.agent.assemble import assemble
from trainguard.agent.config import host_port
from trainguard.agent.ratelimit import RateLimiter
from trainguard.agent.server import HttpServer, Limits
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import ConfigError
from trainguard.tokens import TokenCheck, create_token_file

log = logging.getLogger(__name__)

Reload = Callable[[], tuple[AgentConfig, Thresholds | None]]


def token_path(config: AgentConfig, daemon: AgentDaemon) -> Path:
    if config.token_file:
        return Path(config.token_file)
    path = daemon.state_dir / "agent.token"
    if create_token_file(path):
        log.warning("created a new API token in %s (mode 0600)", path)
    return path


def scrape_token_path(config: AgentConfig, daemon: AgentDaemon) -> Path:
    """Prometheus's token: ``scrape_token_file``, or ``<state_dir>/scrape.token`` (created 0600)."""
    if config.scrape_token_file:
        return Path(config.scrape_token_file)
    path = daemon.state_dir / "scrape.token"
    if create_token_file(path):
        log.warning("created a new scrape token in %s (mode 0600): Prometheus's credentials_file", path)
    return path


def tls_context(config: AgentConfig) -> ssl.SSLContext | None:
    """The server's TLS context; refuses a private key that group or others can read."""
    if not config.tls_cert:
        return None
    try:
        mode = os.stat(config.tls_key).st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read TLS key {config.tls_key}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"TLS key {config.tls_key} is readable by group or others (mode {stat.S_IMODE(mode):04o}): "
            f"chmod 600 {config.tls_key}"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load TLS certificate {config.tls_cert} / key {config.tls_key}: {exc}"
        ) from None
    return ctx


def limits(cfg: AgentConfig) -> Limits:
    return Limits(
        max_header_bytes=cfg.max_header_bytes,
        max_body_bytes=cfg.max_body_bytes,
        max_connections=cfg.max_connections,
        max_connections_per_client=cfg.max_connections_per_client,
        idle_timeout_s=cfg.idle_timeout_s,
        tls_handshake_timeout_s=cfg.tls_handshake_timeout_s,
        write_timeout_s=cfg.write_timeout_s,
    )


class AgentService:
    """The daemon plus its server, started and stopped together (tests drive it directly)."""

    def __init__(self, daemon: AgentDaemon) -> None:
        from trainguard.agent.prometheus import MetricsView

        cfg = daemon.config
        self.daemon = daemon
        self.tokens = TokenCheck(token_path(cfg, daemon))
        self.scrape_tokens = TokenCheck(scrape_token_path(cfg, daemon))
        self.limiter = RateLimiter(cfg.rate_limit_rps, cfg.rate_limit_burst)
        self.api = Api(daemon, MetricsView(daemon), self.tokens, self.limiter, self.scrape_tokens)
        self.http = HttpServer(self.api, limits(cfg), daemon.tally.refuse)
        self.stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self.port = 0

    async def start(self) -> int:
        cfg = self.daemon.config
        host, port = host_port(cfg.listen)
        self.daemon.step()  # the first reading is there before the first request
        self.port = await self.http.start(host, port, tls_context(cfg))
        self._thread = threading.Thread(target=self._loop, name="trainguard-agent-loop", daemon=True)
        self._thread.start()
        scheme = "https" if cfg.tls_cert else "http"
        log.warning(
            "trainguard agent serving %s://%s:%d/ (token in %s)", scheme, host, self.port, self.tokens.path
        )
        return self.port

    def _loop(self) -> None:
        self.daemon.wake.wait(self.daemon.config.interval_s)  # start() already ticked once
        self.daemon.run(self.stop_event)

    def reload(self, config: AgentConfig, thresholds: Thresholds | None) -> None:
        """Apply a re-read config whole, or (ConfigError) none of it."""
        # Both token files first: either may refuse, and then nothing changes.
        scrape = scrape_token_path(config, self.daemon)
        TokenCheck(scrape)
        self.tokens.reload(Path(config.token_file) if config.token_file else None)
        self.scrape_tokens.reload(scrape)
        restart = self.daemon.reload(config, thresholds)
        self.limiter.rate, self.limiter.burst = config.rate_limit_rps, config.rate_limit_burst
        if restart:
            log.warning("config reloaded; %s change(s) need a restart", ", ".join(restart))
        else:
            log.warning("config reloaded")

    async def stop(self) -> None:
        await self.http.stop()
        await self.api.close()
        self.stop_event.set()
        self.daemon.wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
        self.daemon.close()


def run_agent(
    config: AgentConfig, thresholds: Thresholds | None, reload: Reload | None = None, **kw: Any
) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    if not config.loopback:
        log.warning("listening beyond loopback on %s (as configured)", config.listen)
    daemon = assemble(config, thresholds, **kw)
    try:
        service = AgentService(daemon)
    except BaseException:
        daemon.close()
        raise
    return asyncio.run(_serve(service, reload))


async def _serve(service: AgentService, reload: Reload | None) -> int:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    try:
        await service.start()
    except OSError as exc:
        service.daemon.close()
        raise ConfigError(f"cannot listen on {service.daemon.config.listen}: {exc.strerror or exc}") from None

    def on_hup() -> None:
        if reload is None:
            return
        try:
            service.reload(*reload())
        except ConfigError as exc:  # a broken edit keeps the running config
            log.error("config reload refused, keeping the running config: %s", exc)

    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_signal_handler(signal.SIGINT, done.set)
    loop.add_signal_handler(signal.SIGHUP, on_hup)
    await done.wait()
    log.warning("stopping")
    await service.stop()
    return 0
