"""The two newline counters of the first pass (StringZilla's SIMD count, ``bytes.count`` without
it) give the same candidate lines and line count."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.detect import prefilter

pytest.importorskip("hyperscan")


@pytest.mark.parametrize("engine", ["hyperscan", "stdlib"])
def test_stringzilla_and_bytes_count_agree_on_candidates_and_lines(monkeypatch, engine: str) -> None:
    pytest.importorskip("stringzilla")
    lines = [b"node1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"] * 50
    lines[7] = b"[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered"
    lines[31] = b"node1:1:1 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer"
    buf = bytearray(b"\n".join(lines) + b"\npartial\n\n\n")  # a reused buffer: stale lines past end
    end = buf.find(b"partial")
    assert prefilter._newline_count() is not prefilter._count_bytes  # StringZilla's
    fast = prefilter.first_pass(engine)(buf, end)
    monkeypatch.setattr(prefilter, "_newline_count", lambda: prefilter._count_bytes)
    slow = prefilter.first_pass(engine)(buf, end)
    assert fast[:2] == slow[:2]
    spans, newlines, _ = fast
    assert [i for i, _, _ in spans] == [7, 31] and newlines == 50


def test_stringzilla_counts_every_range_as_bytes_count_does() -> None:
    pytest.importorskip("stringzilla")
    import random

    rng = random.Random(0)
    buf = bytes(rng.choice(b"ab\n\r\x00\xff") for _ in range(5000))
    count = prefilter._newline_count()
    for _ in range(500):
        a = rng.randrange(len(buf) + 1)
        b = rng.randrange(a, len(buf) + 1)
        assert count(buf, a, b) == buf.count(b"\n", a, b)


def test_a_torn_hyperscan_cache_is_compiled_again_and_rewritten(tmp_path, monkeypatch) -> None:
    import hyperscan

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TRAINGUARD_NO_CACHE", raising=False)
    cache = prefilter._db_cache_path(getattr(hyperscan, "__version__", "?"))
    assert cache is not None and cache.startswith(str(tmp_path))
    path = Path(cache)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"torn")
    db = prefilter._hyperscan_db.__wrapped__()
    assert db is not None and path.read_bytes() != b"torn"
    found: list[int] = []
    db.scan(b"x NCCL WARN y", match_event_handler=lambda *a: found.append(1))
    assert found


@pytest.mark.parametrize(
    ("text", "garbage"),
    [
        (b"step 1 loss 2.0\n" * 100, False),
        (b"step 1 loss 2.0\n" * 50 + b"\x00\x00\x00\n" + b"step 2\n", True),
        (b"[rank0]: RuntimeError: Connection closed by peer. GLHF! \xf0\x9f\x8f\x96\n", True),
    ],
)
def test_hyperscan_finds_garbage_bytes_in_the_same_scan_as_stdlib_does(text: bytes, garbage: bool) -> None:
    assert prefilter.hits_hyperscan(text, len(text))[1] is garbage
    assert prefilter.hits_stdlib(text, len(text))[1] is garbage
    # only the scanned part counts for hyperscan (the stdlib test looks at the whole buffer)
    assert prefilter.hits_hyperscan(text + b"\x00", len(text))[1] is garbage
