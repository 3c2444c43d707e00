"""A small state file: JSON, read-modify-write under an exclusive lock, written atomically.

The breaker and the escalation history live in these, so a crash at any moment leaves either the
old or the new state, and agents sharing a filesystem never interleave their updates.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from trainguard.errors import StoreError

T = TypeVar("T")

__all__ = ["JsonFile"]


class JsonFile(Generic[T]):
    def __init__(
        self,
        path: str | os.PathLike[str],
        decode: Callable[[dict[str, Any]], T],
        encode: Callable[[T], dict[str, Any]],
        empty: Callable[[], T],
    ) -> None:
        self.path = Path(path)
        self._decode, self._encode, self._empty = decode, encode, empty

    def load(self) -> T:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError(f"a JSON {type(data).__name__}, not an object")
            return self._decode(data)
        except FileNotFoundError:
            return self._empty()
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            # Unreadable state must not silently become empty (an open breaker closing itself).
            raise StoreError(f"state file {self.path} unreadable ({exc}): fix or remove it") from None

    @contextlib.contextmanager
    def update(self) -> Iterator[list[T]]:
        """``with f.update() as box: box[0] = new_state``: saved on exit when it changed."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(lock_fd, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            box = [self.load()]
            before = box[0]
            yield box
            if box[0] != before:
                self.save(box[0])

    def save(self, value: T) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._encode(value), fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
