"""Test helper: a node agent (daemon + HTTP server) running in this process on a free port.

The sampling loop waits a whole ``interval_s`` between ticks; tests that want a reading now call
``running.daemon.step()`` themselves.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from trainguard.agent import AgentConfig
from trainguard.agent.assemble import assemble
from trainguard.agent.serve import AgentService

TOKEN = "test-token-0123456789abcdef"


def self_signed_cert(tmp: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by openssl; the key private (0600), as the agent asks."""
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def write_token(path: Path, token: str = TOKEN, mode: int = 0o600) -> Path:
    path.write_text(token + "\n")
    os.chmod(path, mode)
    return path


def sim_config(tmp: Path, **kw: Any) -> AgentConfig:
    token = tmp / "token"
    if not token.exists():
        write_token(token)
    fields: dict[str, Any] = {
        "backend": "sim",
        "listen": "127.0.0.1:0",
        "interval_s": 3600.0,
        "db": str(tmp / "tg.db"),
        "state_dir": str(tmp / "state"),
        "token_file": str(token),
        "hostname": "node-a",
        **kw,
    }
    return AgentConfig(**fields)


class Running:
    def __init__(self, config: AgentConfig, **kw: Any) -> None:
        self.daemon = assemble(config, **kw)  # as `trainguard agent` runs it: remediation is its act
        self.service = AgentService(self.daemon)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.service.start(), self.loop).result(30)
        self.tls = bool(config.tls_cert)

    def connection(self, timeout: float = 10.0) -> http.client.HTTPConnection:
        if self.tls:
            import ssl

            ctx = ssl.create_default_context(cafile=self.daemon.config.tls_cert)
            ctx.check_hostname = False
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(
        self,
        path: str,
        token: str | None = TOKEN,
        headers: dict[str, str] | None = None,
        method: str = "GET",
        body: bytes | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = self.connection()
        try:
            h = dict(headers or {})
            if token is not None:
                h["Authorization"] = f"Bearer {token}"
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, path: str) -> Any:
        import json

        status, _, body = self.get(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
