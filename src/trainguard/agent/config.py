"""The ``[agent]`` section of the config file: how the node agent samples, stores and serves.

    # /etc/trainguard/agent.toml
    [agent]
    listen = "0.0.0.0:9410"          # beyond loopback only when set here (or by --listen)
    token_file = "/etc/trainguard/agent.token"
    tls_cert = "/etc/trainguard/tls.crt"
    tls_key = "/etc/trainguard/tls.key"

Flags of ``trainguard agent`` override the file (``TRAINGUARD_AGENT_*`` variables sit between).
Fields that only matter at start (listen, TLS, db, kernel log) need a restart; SIGHUP re-reads
the rest (interval, tokens, rate limit, thresholds).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from trainguard.errors import ConfigError

DEFAULT_PORT = 9410  # dcgm-exporter keeps 9400


@dataclass(frozen=True, slots=True)
class AgentConfig:
    backend: str = "nvml"  # nvml | sim
    scenario: str = ""  # a simulated scenario (implies backend sim), e.g. "tour"
    gpus: int = 8  # GPUs of the simulated node
    seed: int = 0  # seed of the simulated node
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"  # ADDR:PORT of the HTTP server
    interval_s: float = 1.0  # seconds between samples
    kernel_log: str = ""  # kernel log to follow (file or /dev/kmsg); "" = none
    db: str = ""  # incident store; "" = $TRAINGUARD_DB or ./trainguard.db
    state_dir: str = ""  # where the token and the kernel-log cursor live; "" = $STATE_DIRECTORY or ~/.local/state/trainguard
    token_file: str = ""  # bearer token (mode 0600); "" = <state_dir>/agent.token, created if missing
    scrape_token_file: str = ""  # Prometheus's token: /metrics only, a reserved lane; "" = <state_dir>/scrape.token, created if missing
    tls_cert: str = ""  # PEM certificate; with tls_key, serve HTTPS
    tls_key: str = ""  # PEM private key
    rate_limit_rps: float = 50.0  # requests per second per client address
    rate_limit_burst: int = 100  # requests a client may make at once
    max_header_bytes: int = 16384  # request line plus headers
    max_body_bytes: int = 1024  # the API is read-only: bodies are refused beyond this
    max_connections: int = 128  # open connections at once, all clients (oldest without a token evicted)
    max_connections_per_client: int = 16  # open connections at once from one address
    idle_timeout_s: float = 15.0  # a connection without a request in flight is closed after this
    tls_handshake_timeout_s: float = 5.0  # a TLS connection that has not finished its handshake
    write_timeout_s: float = 10.0  # an answer the client leaves unread this long: connection aborted
    history_s: float = 600.0  # seconds of readings kept per GPU for the charts
    hostname: str = ""  # Hostname label; "" = this host's name
    policy: str = ""  # remediation policy file (docs/remediation.md); "" = built-in defaults, dry run
    enforce: bool = False  # act on the policy's decisions (default: dry run, every decision recorded)
    admin_token_file: str = ""  # for remediation endpoints; "" = <state_dir>/admin.token
    series_step_s: float = 60.0  # seconds per point of the telemetry series (docs/agent.md)
    series_points: int = 360  # series points kept in memory per GPU (6 h at 60 s); 0 = no series
    series_keep_days: float = 7.0  # series points older than this leave the store; 0 = never stored
    predictor: str = ""  # failure-predictor model file (docs/predictor.md); "" = none

    def __post_init__(self) -> None:
        host_port(self.listen)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both tls_cert and tls_key (one of them is empty)")
        if self.backend not in ("nvml", "sim"):
            raise ConfigError(f"agent backend must be nvml or sim (got {self.backend!r})")
        if not 0 < self.rate_limit_rps < math.inf or self.rate_limit_burst < 1:
            raise ConfigError("agent rate_limit_rps must be a finite number > 0 and rate_limit_burst >= 1")
        for name in (
            "interval_s",
            "idle_timeout_s",
            "tls_handshake_timeout_s",
            "write_timeout_s",
            "history_s",
        ):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ConfigError(f"agent {name} must be a finite number of seconds > 0 (got {value})")
        for name in ("max_connections", "max_connections_per_client", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"agent {name} must be at least 1 (got {getattr(self, name)})")
        if not 0 < self.series_step_s < math.inf:
            raise ConfigError(
                f"agent series_step_s must be a finite number of seconds > 0 (got {self.series_step_s})"
            )
        if self.series_points < 0 or not 0 <= self.series_keep_days < math.inf:
            raise ConfigError(
                "agent series_points must be >= 0 and series_keep_days a finite number >= 0 "
                f"(got {self.series_points}, {self.series_keep_days})"
            )

    @property
    def sim(self) -> bool:
        return self.backend == "sim" or bool(self.scenario)

    @property
    def loopback(self) -> bool:
        host, _ = host_port(self.listen)
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host == "localhost"


def host_port(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9410"`` -> ("127.0.0.1", 9410); ``"[::1]:9410"`` -> ("::1", 9410)."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {listen!r} is not ADDR:PORT (e.g. 127.0.0.1:{DEFAULT_PORT})")
    return host, int(port)
