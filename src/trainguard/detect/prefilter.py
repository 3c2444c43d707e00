"""The scanner's first pass: find, in bulk, the few lines of a buffer that can be findings.

Sits under ``scan``: the line parsers (``kernel_log``, ``training_log``) are exact but cost a
Python call per line, so ``scan_file`` hands them only the lines this pass returns. A candidate
line holds one of the literals that every finding's pattern requires (``NCCL WARN``, ``CUDA
error: ``, ``collective operation timeout``, ``NVRM``...: the rules' needles, not anchor words
like ``NCCL``), so the ``NCCL INFO`` lines that fill a training log run with ``NCCL_DEBUG=INFO``
never reach Python. Two engines find the same lines:

- ``hyperscan`` (``pip install 'trainguard[logscan]'``): the literals in one Hyperscan
  block-mode database, run over the whole buffer (tens of GB/s: literals, unlike the rules'
  regexes, compile to Hyperscan's SIMD literal matchers);
- ``stdlib``: one ``re`` alternation and ``bytes.find`` passes; several times slower.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from trainguard.detect.training_log import NEEDLE_CONTEXT, TRAINING_ANCHORS
from trainguard.errors import InputError

__all__ = ["ANCHORS", "Hits", "hits_hyperscan", "hits_stdlib", "scan_engine"]

Hits = tuple[list[int], bool]  # offsets inside candidate lines (sorted), and "may hold garbage bytes"


def _minimal(needles: list[bytes]) -> tuple[bytes, ...]:
    """The needles without those that contain another one (finding the shorter one suffices);
    a needle searched for in context (``NEEDLE_CONTEXT``) does not stand in for the others."""
    unique = list(dict.fromkeys(needles))
    plain = [n for n in unique if n.decode() not in NEEDLE_CONTEXT]
    return tuple(n for n in unique if not any(o != n and o in n for o in plain))


# parse_kernel_line answers only lines with "NVRM" (Xid, fallen off the bus, GPU map) or "SXid"
ANCHORS: tuple[bytes, ...] = _minimal([b"NVRM", b"SXid", *(a.encode() for a in TRAINING_ANCHORS)])


@functools.cache
def _bulk_expressions() -> tuple[bytes, ...]:
    """The anchors as Hyperscan expressions: literals, or a needle's context regex (kept to one
    line: ``\\s`` would also match the newline)."""
    narrow = {k: v.replace(r"\s", r"[ \t\r\f\v]").replace(r"\S", r"[^\s]") for k, v in NEEDLE_CONTEXT.items()}
    return tuple(
        dict.fromkeys(narrow[a.decode()].encode() if a.decode() in narrow else re.escape(a) for a in ANCHORS)
    )


@functools.cache
def _hyperscan_db() -> Any | None:
    try:
        import hyperscan  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    # plus one pattern that flags (once per scan) a NUL or non-ASCII byte: cheaper than a second
    # pass, and it sees only the bytes scanned
    expressions = [*_bulk_expressions(), rb"[\x00\x80-\xff]"]
    flags = [hyperscan.HS_FLAG_MULTILINE] * (len(expressions) - 1) + [hyperscan.HS_FLAG_SINGLEMATCH]
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(
        expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags
    )
    return db


def scan_engine(engine: str = "auto") -> str:
    """The bulk-search engine that will run: "hyperscan" or "stdlib" (``re`` + ``bytes.find``)."""
    if engine not in ("auto", "hyperscan", "stdlib"):
        raise InputError(f"unknown scan engine {engine!r}: use auto, hyperscan or stdlib")
    if engine == "stdlib" or (engine == "auto" and _hyperscan_db() is None):
        return "stdlib"
    if _hyperscan_db() is None:
        raise InputError("engine 'hyperscan' needs the hyperscan package: pip install 'trainguard[logscan]'")
    return "hyperscan"


def hits_hyperscan(buf: bytes | bytearray, end: int) -> Hits:
    """Offsets inside candidate lines of ``buf[:end]``, and whether it may hold garbage bytes."""
    db: Any = _hyperscan_db()
    flagged = len(_bulk_expressions())  # the garbage-byte pattern comes last
    found: list[int] = []
    binary = False

    def on_match(pattern: int, _start: int, stop: int, _flags: int, _ctx: object) -> None:
        nonlocal binary
        if pattern == flagged:
            binary = True
        else:
            found.append(stop - 1 if stop else 0)

    db.scan(memoryview(buf)[:end], match_event_handler=on_match)
    found.sort()
    return found, binary


def _maybe_binary(buf: bytes | bytearray, end: int) -> bool:
    # the whole buffer (stale tail included) being ASCII is a cheap sufficient test
    return buf.find(b"\x00", 0, end) >= 0 or not buf.isascii()


@functools.cache
def _stdlib_search() -> tuple[re.Pattern[bytes], tuple[bytes, ...]]:
    # re's alternation is quick when every branch starts with an upper-case letter (few text
    # positions can start a match) and slow otherwise, so the other anchors get one
    # bytes.find pass each instead.
    upper = tuple(a for a in ANCHORS if a[:1].isupper())
    return re.compile(b"|".join(map(re.escape, upper))), tuple(a for a in ANCHORS if a not in upper)


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
