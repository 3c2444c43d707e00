"""A real PostgreSQL server for the tests, from Debian's package (postgresql-15).

``initdb`` into a temporary directory, ``postgres`` on 127.0.0.1 at a random port with its unix
socket in that directory, started as a child of the test process that dies with it (parent-death
signal). initdb refuses root: as root the server runs as the ``postgres`` user (setpriv). Host
connections need a password (scram-sha-256), so the tests exercise real credentials.

Where the server cannot start the test fails naming how to install it under `make test-all` and CI,
and is skipped saying why elsewhere (``real_parts.missing``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from real_parts import missing
from trainguard.procs import parent_death

PASSWORD = "tg-test-" + uuid.uuid4().hex[:8]
USER = "trainguard"
INSTALL = "apt-get install postgresql (Debian's postgresql-15: initdb, postgres) and pip install 'trainguard[fleet]'"


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    exe = shutil.which("initdb")
    return Path(exe).parent if exe else None


def unavailable(reason: str) -> NoReturn:
    missing(f"PostgreSQL for the fleet-store tests ({reason})", INSTALL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="tg-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.as_root = os.geteuid() == 0
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_root:
            os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
        out = subprocess.run(
            [*self._as_user(), str(bindir / "initdb"), "-D", str(self.data), "-U", USER, "-E", "UTF8",
             "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "--no-sync"],
            capture_output=True, text=True, cwd=self.dir, timeout=120,
        )  # fmt: skip
        pwfile.unlink()
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr.strip() or out.stdout.strip()}")

    def _as_user(self) -> list[str]:
        if not self.as_root:
            return []
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--pdeathsig=KILL"]

    def start(self) -> None:
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - the server writes it while it runs
        self.proc = subprocess.Popen(
            [*self._as_user(), str(self.bindir / "postgres"), "-D", str(self.data),
             "-c", "listen_addresses=127.0.0.1", "-p", str(self.port), "-c", f"unix_socket_directories={self.dir}",
             "-c", "max_connections=200", "-c", "shared_buffers=64MB"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, preexec_fn=parent_death(),
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.dir / 'server.log').read_text()[-2000:]}")
            ready = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"], timeout=30
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("postgres did not accept connections within 60 s")

    def stop(self) -> None:
        """Fast shutdown (what an operator's ``pg_ctl stop -m fast`` does)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def url(self, db: str = "postgres", password: bool = True) -> str:
        secret = f":{PASSWORD}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{db}"

    def create_db(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:10]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    bindir = _bindir()
    if bindir is None:
        unavailable("initdb not found")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed")
    server = None
    try:
        server = PgServer(bindir)  # type: ignore[arg-type]
        server.start()
    except (RuntimeError, OSError, KeyError, subprocess.SubprocessError) as exc:
        if server is not None:
            server.close()
        unavailable(f"cannot start a server: {exc}")
    assert server is not None
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def postgres() -> Iterator[PgServer]:
    with running_server() as server:
        yield server


@pytest.fixture
def pg_url(postgres: PgServer) -> str:
    """A fresh, empty database on the module's server (URL with the password)."""
    return postgres.url(postgres.create_db())
