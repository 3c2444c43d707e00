"""Checkpoint files encrypted at rest: AES-256-GCM from ``cryptography`` (its only importer).

A sealed file is its plaintext in ``chunk``-byte pieces, each encrypted and authenticated on its
own (ciphertext + 16-byte tag), so neither side holds more than a piece beyond the payload. Each
file gets a fresh random salt; its key is HKDF-SHA256 of the signing key, the salt and the file's
name, so a piece's nonce is just its index. The manifest (signed) records salt, piece size and
plaintext size: a truncated, reordered, swapped or edited piece fails to decrypt. Checksums in
the manifest are of the ciphertext, so the supervisor verifies a sealed checkpoint without the
library or the key. ``pip install 'trainguard[encrypt]'``.

    >>> from pathlib import Path; import tempfile
    >>> from trainguard.checkpoint.signing import Keyring
    >>> key = Keyring.generate().signing
    >>> path = Path(tempfile.mkdtemp()) / "state.pt"
    >>> sink = SealingFile(path, key, chunk=4)
    >>> _ = sink.write(b"hello, world")
    >>> entry = sink.close()
    >>> open_sealed(path, entry, key)
    bytearray(b'hello, world')
"""

from __future__ import annotations

import io
import queue
import secrets
import threading
from pathlib import Path
from typing import Any

from trainguard.checkpoint.atomic import ChecksumFile
from trainguard.checkpoint.manifest import FileEntry, Sealed
from trainguard.checkpoint.signing import Key
from trainguard.errors import CheckpointCorrupt, MissingDependency

CHUNK = 8 << 20  # small enough that a few reused buffers carry any file
TAG = 16
_INFO = b"trainguard checkpoint aes-256-gcm\0"


def _aead(key: Key, salt: bytes, name: str) -> Any:
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError:
        raise MissingDependency(
            "encrypted checkpoints need the cryptography library: pip install 'trainguard[encrypt]'"
        ) from None
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_INFO + name.encode()).derive(
        key.secret
    )
    return AESGCM(derived)


def _nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")


class SealingFile:
    """A write-only file (``write``/``close``, as ``ChecksumFile``) that encrypts on the way.

    With ``overlap=True`` pieces are encrypted, written and checksummed on a helper thread
    (cryptography and hashlib release the GIL) while the caller serializes the next; as with
    ``ChecksumFile``, a buffer handed to ``write`` must then stay unchanged until ``close()``.
    Small writes are gathered into piece buffers, and every buffer is reused, so a save touches
    a few pieces' worth of fresh memory whatever its size."""

    def __init__(self, path: Path, key: Key, chunk: int = CHUNK, overlap: bool = False) -> None:
        self._salt = secrets.token_bytes(16)
        self._aead = _aead(key, self._salt, path.name)
        self._sink = ChecksumFile(path)  # written and checksummed on the thread that encrypts
        self._out = bytearray(chunk + TAG)  # ciphertext of one piece, reused
        self._chunk = chunk
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()  # pieces' buffers, reused
        self._buffer = self._take()
        self._filled = 0
        self._index = 0
        self._plain = 0
        self._error: BaseException | None = None
        self._queue: queue.Queue[tuple[int, Any] | None] | None = None
        self._thread: threading.Thread | None = None
        if overlap:
            self._queue = queue.Queue(maxsize=2)  # at most two pieces waiting: bounded memory
            self._thread = threading.Thread(target=self._seal_loop, daemon=True, name="aes-gcm")
            self._thread.start()

    def _seal(self, piece: Any) -> None:
        if self._queue is not None:
            self._queue.put((self._index, piece))
        else:
            self._encrypt(self._index, piece)
        self._index += 1

    def _take(self) -> bytearray:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            return bytearray(self._chunk)

    def _encrypt(self, index: int, piece: Any) -> None:
        data = memoryview(piece[0])[: piece[1]] if isinstance(piece, tuple) else piece
        if hasattr(self._aead, "encrypt_into"):  # cryptography >= 47: into our buffer, no allocation
            out = memoryview(self._out)[: len(data) + TAG]
            self._aead.encrypt_into(_nonce(index), data, None, out)
            self._sink.write(out)
        else:
            self._sink.write(self._aead.encrypt(_nonce(index), data, None))
        if isinstance(piece, tuple):  # one of our buffers: free for the next piece
            self._free.put(piece[0])

    def _seal_loop(self) -> None:
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._encrypt(*item)
                except BaseException as exc:  # reported by close()
                    self._error = exc

    def _join(self) -> None:
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def write(self, data: object) -> int:
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
        total = len(view)
        self._plain += total
        while len(view):
            if self._filled == 0 and len(view) >= self._chunk:  # a whole piece of the caller's buffer
                self._seal(view[: self._chunk])
                view = view[self._chunk :]
                continue
            take = min(len(view), self._chunk - self._filled)  # else into our piece buffer
            self._buffer[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == self._chunk:
                self._flush_buffer()
        return total

    def _flush_buffer(self, last: bool = False) -> None:
        """Hand the piece buffer to the encryption (with its length); start a fresh one."""
        if self._filled:
            self._seal((self._buffer, self._filled))
            self._buffer, self._filled = bytearray() if last else self._take(), 0

    def flush(self) -> None:
        """Nothing to do before close()."""

    def close(self) -> FileEntry:
        self._flush_buffer(last=True)
        self._join()
        if self._error is not None:
            self._sink.abort()
            raise self._error
        entry = self._sink.close()
        sealed = Sealed(self._salt.hex(), self._chunk, self._plain)
        return FileEntry(entry.size, entry.crc32, entry.sha256, sealed)

    def abort(self) -> None:
        self._join()
        self._sink.abort()


def open_sealed(path: Path, entry: FileEntry, key: Key) -> bytearray:
    """The plaintext of the sealed file at ``path``; CheckpointCorrupt if any piece fails."""
    sealed = entry.sealed
    if sealed is None:
        raise ValueError(f"{path} is not sealed")
    if sealed.alg != "aes-256-gcm":
        raise CheckpointCorrupt(f"{path}: unknown encryption {sealed.alg!r}")
    aead = _aead(key, bytes.fromhex(sealed.salt), path.name)
    plain = bytearray(sealed.plain_size)
    out = memoryview(plain)
    with open(path, "rb", buffering=0) as f:
        for index, start in enumerate(range(0, sealed.plain_size, sealed.chunk)):
            size = min(sealed.chunk, sealed.plain_size - start)
            data = f.read(size + TAG)
            try:
                if len(data) != size + TAG:
                    raise ValueError("short piece")
                if hasattr(aead, "decrypt_into"):  # cryptography >= 47: no copy
                    aead.decrypt_into(_nonce(index), data, None, out[start : start + size])
                else:
                    out[start : start + size] = aead.decrypt(_nonce(index), data, None)
            except Exception:  # cryptography's InvalidTag, or a short read
                raise CheckpointCorrupt(
                    f"{path}: piece {index} does not decrypt (tampered, truncated, or another key)"
                ) from None
        if f.read(1):
            raise CheckpointCorrupt(f"{path}: data after the last encrypted piece")
    return plain


class MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it (``torch.load`` reads it)."""

    def __init__(self, buffer: bytearray) -> None:
        super().__init__()
        self._view = memoryview(buffer)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos
