"""The background checkpoint writer: a persistent child process, started lazily, once.

The training process copies the state into a shared-memory staging buffer (see ``staging``) and
sends the writer a small message (step, skeleton, slot layout); the writer builds tensors over the
same memory, ``torch.save``s them, checksums, commits and applies retention, then answers. Nothing
big crosses the socket and the training process's GIL is not involved in the write.

The writer dies with its parent (``PR_SET_PDEATHSIG`` plus a parent-pid watchdog), so a killed
trainer leaves at worst a ``.tmp-*`` directory that readers ignore and the next save removes.

The process side is ``trainguard.torch.writer_process``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import struct
import subprocess
import sys
from typing import Any

from trainguard.errors import CheckpointError

_HEADER = struct.Struct("!Q")


def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    frame = _HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [frame], fds)
        frame = frame[sent:]
    sock.sendall(frame)


def recv_msg(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message and any file descriptors that came with it; EOFError when the peer is gone."""
    header, fds = b"", []
    while len(header) < _HEADER.size:
        chunk, got, _flags, _addr = socket.recv_fds(sock, _HEADER.size - len(header), 4)
        if not chunk:
            raise EOFError("peer closed the connection")
        header += chunk
        fds += got
    (size,) = _HEADER.unpack(header)
    body = bytearray()
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        if not chunk:
            raise EOFError("peer closed the connection")
        body += chunk
    return pickle.loads(body), fds


class BackgroundWriter:
    """Client side, in the training process. Not thread-safe; one per Checkpointer."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._buffer_id = -1  # id of the staging buffer the writer currently maps
        self.in_flight: int | None = None  # step being written

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "trainguard.torch.writer_process", str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            child.close()
        self._sock = parent
        self._buffer_id = -1

    def start(self) -> None:
        """Start the writer process now (it is otherwise started by the first submit)."""
        if not self.alive:
            self._start()

    def submit(self, job: dict[str, Any], buffer_id: int, buffer_fd: int, buffer_size: int) -> None:
        """Hand a save to the writer (the previous one must be finished: call wait() first)."""
        if self.in_flight is not None:
            raise CheckpointError("internal: a save is already in flight; wait() for it first")
        self.start()
        assert self._sock is not None
        try:
            if buffer_id != self._buffer_id:
                send_msg(self._sock, {"op": "buffer", "size": buffer_size}, [buffer_fd])
                self._buffer_id = buffer_id
            send_msg(self._sock, {"op": "save", **job})
        except OSError as exc:
            self._fail()
            raise CheckpointError(f"could not reach the checkpoint writer process: {exc}") from exc
        self.in_flight = int(job["step"])

    def done(self) -> bool:
        """True if no save is in flight or its answer is ready (never blocks)."""
        if self.in_flight is None:
            return True
        assert self._sock is not None
        import select

        readable, _, _ = select.select([self._sock], [], [], 0)
        return bool(readable)

    def wait(self) -> dict[str, Any] | None:
        """Block until the in-flight save is durable; its result, or None if nothing was in flight.
        Raises CheckpointError if it failed or the writer died."""
        if self.in_flight is None:
            return None
        assert self._sock is not None
        step, self.in_flight = self.in_flight, None
        try:
            reply, _ = recv_msg(self._sock)
        except (EOFError, OSError):
            code = self._fail()
            raise CheckpointError(
                f"the checkpoint writer process died (exit code {code}) while saving step {step}; "
                "that checkpoint is not valid (check disk space and the writer's stderr)"
            ) from None
        if reply.get("ok"):
            return dict(reply["result"])
        raise CheckpointError(
            f"background save of step {step} failed: {reply.get('error')}\n{reply.get('traceback', '')}"
        )

    def _fail(self) -> int | None:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=5)
            if code is None:
                self._proc.kill()
                code = self._proc.wait()
        if self._sock is not None:
            self._sock.close()
        self._proc, self._sock, self._buffer_id = None, None, -1
        return code

    def close(self) -> None:
        """Stop the writer (after the caller waited for the in-flight save)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                send_msg(self._sock, {"op": "exit"})
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self.in_flight = None
