"""``logs scan`` reports the same lines, numbered the same, on the benchmark's log shapes (the
NCCL_DEBUG=INFO job with real failure lines, the training log, the node syslog) however the file
is cut into runs and whichever thread searches a run: the answer is the line-by-line
classification, merged as the CLI merges it, with failures as the last line of a run and as the
first line of the next."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import random
from pathlib import Path

import pytest

from trainguard.cli.logs import emit_events
from trainguard.detect.scan import BurstTracker, classify_line, merge_events, scan_engine, scan_file

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ["stdlib", *(["hyperscan"] if scan_engine() == "hyperscan" else [])]


def _loggen():
    spec = importlib.util.spec_from_file_location("loggen", ROOT / "benchmarks" / "loggen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(shape: str) -> bytes:
    loggen, rng = _loggen(), random.Random(7)
    if shape == "nccl_info":
        real = loggen.real_failure_lines(ROOT / "tests" / "data" / "real")
        return loggen.nccl_info_block(rng, real, events=12)[0]
    if shape == "training":
        return loggen.training_block(rng, events=12)[0]
    return loggen.syslog_block(rng, nvidia_rate=0.004)[0]


def _json(events) -> list[str]:
    out = io.StringIO()
    emit_events(merge_events(events), True, out)
    return out.getvalue().splitlines()


@pytest.fixture(scope="module", params=["nccl_info", "training", "syslog"])
def corpus(request, tmp_path_factory) -> tuple[Path, list[str], list[int]]:
    """The log, the CLI's JSON lines from line-by-line classification, and the byte offset of each
    finding's line."""
    data = _block(request.param)
    path = tmp_path_factory.mktemp(request.param) / "job.log"
    path.write_bytes(data)
    name, starts, events, tracker = str(path), [0], [], BurstTracker()
    for no, raw in enumerate(data.split(b"\n")[:-1], 1):
        starts.append(starts[-1] + len(raw) + 1)
        if (event := classify_line(raw.decode("utf-8"))) is not None:
            events.append(tracker.observe(dataclasses.replace(event, path=name, line_no=no)))
    want = _json(events)
    assert len(want) >= 10, request.param  # the block holds failures to find
    return path, want, [starts[e.line_no - 1] for e in events]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("chunk", "threads"), [(1 << 20, None), (1 << 12, 1), (1 << 12, 3), (65_537, 2)])
def test_scan_reports_what_line_by_line_classification_reports(corpus, engine, chunk, threads) -> None:
    path, want, _ = corpus
    assert _json(scan_file(path, engine=engine, chunk_size=chunk, threads=threads)) == want


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["last line of a run", "first line of the next"])
def test_a_failure_at_a_run_boundary_is_reported_once_at_its_line(corpus, engine, where) -> None:
    path, want, offsets = corpus
    at = next(o for o in offsets if o > 1 << 12)  # runs are 4 KiB at least
    # a run ends at the first newline at or after start + chunk - 1
    chunk = at + 1 if where == "last line of a run" else at
    for threads in (1, 2):
        assert _json(scan_file(path, engine=engine, chunk_size=chunk, threads=threads)) == want
