"""The scanner's first pass: find, in bulk, the few lines of a buffer that can be findings.

Sits under ``scan``: the line parsers (``kernel_log``, ``training_log``) are exact but cost a
Python call per line, so ``scan_file`` hands them only the lines this pass returns. A candidate
line holds one of the literals that every finding's pattern requires (``NCCL WARN``, ``CUDA
error: ``, ``collective operation timeout``, ``NVRM``...: the rules' needles, not anchor words
like ``NCCL``), so the ``NCCL INFO`` lines that fill a training log run with ``NCCL_DEBUG=INFO``
never reach Python. Two engines find the same lines:

- ``hyperscan`` (``pip install 'trainguard[logscan]'``): the literals in one Hyperscan
  block-mode database, run over the whole buffer (literals, unlike the rules' regexes, compile
  to Hyperscan's SIMD literal matchers); it releases the GIL, so ``scan_file`` runs chunks on
  several threads;
- ``stdlib``: one ``re`` pattern (the needles as a trie) and ``bytes.find`` passes; several times
  slower.

Both count the newlines between candidates with StringZilla's SIMD ``count`` when the
``logscan`` extra is installed (3-4x less CPU per byte than ``bytes.count``'s byte-at-a-time loop,
and a 1 ms import where numpy's took 0.1 s), else with ``bytes.count``.

``first_pass(engine)`` returns the candidate lines with their line indexes, and the newline count.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from trainguard.detect.training_log import NEEDLE_CONTEXT, TRAINING_ANCHORS, UNKNOWN_ANCHORS
from trainguard.errors import InputError

__all__ = ["Hits", "Lines", "anchors", "first_pass", "hits_hyperscan", "hits_stdlib", "scan_engine"]

Hits = tuple[list[int], bool]  # offsets inside candidate lines (sorted), and "may hold garbage bytes"
# (index, start, stop) of each candidate line, the number of newlines, and "may hold garbage bytes"
Lines = tuple[list[tuple[int, int, int]], int, bool]


def _minimal(needles: list[bytes]) -> tuple[bytes, ...]:
    """The needles without those that contain another one (finding the shorter one suffices);
    a needle searched for in context (``NEEDLE_CONTEXT``) does not stand in for the others."""
    unique = list(dict.fromkeys(needles))
    plain = [n for n in unique if n.decode() not in NEEDLE_CONTEXT]
    return tuple(n for n in unique if not any(o != n and o in n for o in plain))


# parse_kernel_line answers only lines with "NVRM" (Xid, fallen off the bus, GPU map) or "SXid"
_NEEDLES: tuple[str, ...] = ("NVRM", "SXid", *TRAINING_ANCHORS, *UNKNOWN_ANCHORS)
# Bump when the code that turns the needles into the database changes (the cache key holds it).
_DB_FORMAT = 2
# Garbage bytes (NUL, non-ASCII): the database reports the first one (``_maybe_binary``'s test).
_BINARY = rb"[\x00\x80-\xff]"
_BINARY_ID = 1 << 20


@functools.cache
def anchors() -> tuple[bytes, ...]:
    """The needles the first pass searches for (computed on first need: a cached Hyperscan
    database does not need them)."""
    return _minimal([n.encode() for n in _NEEDLES])


@functools.cache
def _bulk_expressions() -> tuple[bytes, ...]:
    """The anchors as Hyperscan expressions: literals, or a needle's context regex (kept to one
    line: ``\\s`` would also match the newline)."""
    narrow = {k: v.replace(r"\s", r"[ \t\r\f\v]").replace(r"\S", r"[^\s]") for k, v in NEEDLE_CONTEXT.items()}
    return tuple(
        dict.fromkeys(
            narrow[a.decode()].encode() if a.decode() in narrow else re.escape(a) for a in anchors()
        )
    )


@functools.cache
def _hyperscan_db() -> Any | None:
    """The first pass's database: the anchors (ids ``0..n-1``) and ``_BINARY`` (``_BINARY_ID``,
    reported once per scan)."""
    try:
        import hyperscan  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    cache = _db_cache_path(getattr(hyperscan, "__version__", "?"))
    if cache is not None:
        try:
            with open(cache, "rb") as fh:
                return hyperscan.loadb(fh.read(), hyperscan.HS_MODE_BLOCK)
        except (OSError, hyperscan.error):
            pass  # absent, torn or from another Hyperscan build: compile it again
    expressions = [*_bulk_expressions(), _BINARY]
    ids = [*range(len(expressions) - 1), _BINARY_ID]
    flags = [hyperscan.HS_FLAG_MULTILINE] * (len(expressions) - 1) + [hyperscan.HS_FLAG_SINGLEMATCH]
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=expressions, ids=ids, elements=len(expressions), flags=flags)
    if cache is not None:
        _store(cache, hyperscan.dumpb(db))
    return db


def _db_cache_path(version: str) -> str | None:
    """Where the compiled database is kept between runs (compiling it is most of `logs scan`'s
    start-up): ``$XDG_CACHE_HOME/trainguard/`` (``~/.cache``), keyed by what it is built from
    (the needles, their context regexes, ``_DB_FORMAT``), the Hyperscan version and the CPU
    (two 32-bit checksums: zlib's, as hashlib's import costs more than the key is worth; a str,
    as pathlib's import costs `logs scan` as much again);
    ``TRAINGUARD_NO_CACHE=1`` turns it off."""
    import zlib

    if os.environ.get("TRAINGUARD_NO_CACHE"):
        return None
    parts = [*_NEEDLES, *(f"{k}={v}" for k, v in sorted(NEEDLE_CONTEXT.items())), str(_DB_FORMAT), version]
    raw = "\0".join([*parts, os.uname().machine]).encode()
    key = f"{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}"
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "trainguard", f"hyperscan-{key}.db")


def _store(path: str, data: bytes) -> None:
    """Atomically, and never an error: a cache that cannot be written only costs the compile."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        pass


def scan_engine(engine: str = "auto") -> str:
    """The bulk-search engine that will run: "hyperscan" or "stdlib" (``re`` + ``bytes.find``)."""
    if engine not in ("auto", "hyperscan", "stdlib"):
        raise InputError(f"unknown scan engine {engine!r}: use auto, hyperscan or stdlib")
    if engine == "stdlib" or (engine == "auto" and _hyperscan_db() is None):
        return "stdlib"
    if _hyperscan_db() is None:
        raise InputError("engine 'hyperscan' needs the hyperscan package: pip install 'trainguard[logscan]'")
    return "hyperscan"


_per_thread = threading.local()


def hits_hyperscan(buf: bytes | bytearray, end: int) -> Hits:
    """Offsets inside candidate lines of ``buf[:end]``, and whether it may hold garbage bytes
    (found by the same scan: no second pass over the buffer)."""
    db: Any = _hyperscan_db()
    if (scratch := getattr(_per_thread, "scratch", None)) is None:
        import hyperscan  # type: ignore[import-not-found,unused-ignore]

        scratch = _per_thread.scratch = hyperscan.Scratch(db)  # one scan at a time per scratch
    found: list[int] = []
    binary = [False]

    def on_match(pattern: int, _start: int, stop: int, _flags: int, _ctx: object) -> None:
        if pattern == _BINARY_ID:
            binary[0] = True
        else:
            found.append(stop - 1 if stop else 0)

    db.scan(memoryview(buf)[:end], match_event_handler=on_match, scratch=scratch)
    found.sort()
    return found, binary[0]


def _maybe_binary(buf: bytes | bytearray, end: int) -> bool:
    # the whole buffer (stale tail included) being ASCII is a cheap sufficient test
    return buf.find(b"\x00", 0, end) >= 0 or not buf.isascii()


@functools.cache
def _stdlib_search() -> tuple[re.Pattern[bytes], tuple[bytes, ...]]:
    # re's alternation is quick when every branch starts with an upper-case letter (few text
    # positions can start a match) and slow otherwise, so the other anchors get one
    # bytes.find pass each instead.
    upper = tuple(a for a in anchors() if a[:1].isupper())
    return re.compile(_trie(upper)), tuple(a for a in anchors() if a not in upper)


def _trie(needles: tuple[bytes, ...]) -> bytes:
    """The needles as one regex with their common prefixes factored out (``CUDA_ERROR_``, ``NCCL
    WARN``...): at each position ``re`` tries an alternation's branches one by one, a trie one
    branch per distinct next byte. No needle is a prefix of another (``anchors`` drops those)."""
    root: dict[int, dict[int, Any]] = {}
    for needle in needles:
        node = root
        for byte in needle:
            node = node.setdefault(byte, {})

    def emit(node: dict[int, Any]) -> bytes:
        branches = [re.escape(bytes([byte])) + emit(child) for byte, child in sorted(node.items())]
        if len(branches) <= 1:
            return b"".join(branches)  # the end of a needle, or one way on
        return b"(?:" + b"|".join(branches) + b")"

    return emit(root)


def hits_stdlib(buf: bytes | bytearray, end: int) -> Hits:
    """The stdlib engine: same contract as ``hits_hyperscan``."""
    found: list[int] = []
    upper, lower = _stdlib_search()
    find, pos = buf.find, 0
    while (m := upper.search(buf, pos, end)) is not None:
        found.append(m.start())
        nl = find(b"\n", m.end(), end)
        pos = end if nl < 0 else nl + 1  # one hit per line is enough
    for anchor in lower:
        pos = 0
        while (pos := find(anchor, pos, end)) >= 0:
            found.append(pos)
            nl = find(b"\n", pos, end)
            pos = end if nl < 0 else nl + 1
    found.sort()
    return found, _maybe_binary(buf, end)


def first_pass(engine: str) -> Callable[[bytes | bytearray, int], Lines]:
    """The candidate lines of ``buf[:end]`` for ``engine`` (see ``Lines``); ``buf[:end]`` holds whole
    lines."""
    hits = hits_hyperscan if engine == "hyperscan" else hits_stdlib
    count = _newline_count()

    def lines(buf: bytes | bytearray, end: int) -> Lines:
        return _spans(buf, end, *hits(buf, end), lambda a, b: count(buf, a, b))

    return lines


@functools.cache
def _newline_count() -> Callable[[bytes | bytearray, int, int], int]:
    """``count(buf, a, b)``: the newlines in ``buf[a:b]``; StringZilla's when installed."""
    try:
        import stringzilla  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _count_bytes
    sz_count = stringzilla.count
    return lambda buf, a, b: int(sz_count(buf, "\n", a, b))


def _count_bytes(buf: bytes | bytearray, a: int, b: int) -> int:
    return buf.count(b"\n", a, b)


def _spans(
    buf: bytes | bytearray, end: int, positions: list[int], binary: bool, count: Callable[[int, int], int]
) -> Lines:
    """The lines holding ``positions``; newlines are counted between candidates, once over the buffer."""
    spans: list[tuple[int, int, int]] = []
    cursor, line, done_until = 0, 0, -1
    for pos in positions:
        if pos <= done_until:
            continue  # another anchor on a line already taken
        start = buf.rfind(b"\n", 0, pos) + 1
        stop = buf.find(b"\n", pos, end)
        done_until = stop = end if stop < 0 else stop
        line += count(cursor, start)
        cursor = start
        spans.append((line, start, stop))
    return spans, line + count(cursor, end), binary
