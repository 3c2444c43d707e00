"""The Guard answers the supervisor's flight-recorder dump requests on a gloo job (#23): NCCL's
monitor thread answers its debug-info pipe by itself, gloo's process group has none."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from trainguard.incidents.flight import judge  # noqa: E402
from trainguard.supervisor.hang import request_flight_dumps  # noqa: E402
from trainguard.torch import Guard  # noqa: E402
from trainguard.torch.flight_recorder import load_dumps  # noqa: E402


@pytest.fixture
def gloo(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def test_guard_on_a_gloo_job_answers_dump_requests_and_stops_with_it(
    tmp_path: Path, gloo, monkeypatch
) -> None:
    prefix = str(tmp_path / "dumps" / "fr_rank_")  # the dumps folder does not exist yet
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", prefix)
    threads = {t.name for t in threading.enumerate()}
    with Guard(watchdog=False, chaos=False):
        x = torch.ones(4)
        dist.all_reduce(x)
        got = request_flight_dumps(prefix, [0], wait_s=30.0)
        assert got == {0: Path(f"{prefix}0")}
        dumps = load_dumps(tmp_path / "dumps")
        assert [d.rank for d in dumps] == [0]
        # gloo lists its default group without its name; the writer completes it from the live groups
        assert dumps[0].groups.get("0") == ("default_pg", (0,)), dumps[0].groups
        assert judge(dumps).ranks == ()  # one healthy rank: no culprit
    assert not Path(f"{prefix}0.pipe").exists()
    assert {t.name for t in threading.enumerate()} - threads == set()  # the server stopped


def test_guard_without_the_supervisors_pipe_serves_nothing(tmp_path: Path, gloo, monkeypatch) -> None:
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", raising=False)
    with Guard(watchdog=False, chaos=False):
        assert not any(t.name == "trainguard-fr-dump" for t in threading.enumerate())
