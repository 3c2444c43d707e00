"""The order of `Supervisor.run`'s start: the workers first, the machinery they do not need after.

A launcher here starts no process: its workers' `start` writes down what the supervisor had done
by then (the store's job row, the loop's machinery), then ends the run as a released spare would.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from trainguard.incidents import IncidentStore
from trainguard.rundir import ATTEMPT_ENV
from trainguard.supervisor import ExitCode, LaunchConfig, RecordConfig, SupervisorConfig
from trainguard.supervisor.launch import LaunchJob, Monitor, SpareReleased
from trainguard.supervisor.supervisor import Supervisor


class SeenAtStart:
    """`Workers` whose start records what it found, then ends the run (no process is started)."""

    def __init__(self, job: LaunchJob, db: Path) -> None:
        self.job, self.db = job, db
        self.seen: dict[str, Any] = {}

    def start(self, local_world_size: int | None = None) -> None:
        env: dict[str, str] = {}
        self.job.worker_env(0, env)
        with IncidentStore(self.db) as store:
            self.seen = {"job_row": store.get_job(self.job.job_id) is not None, "attempt": env[ATTEMPT_ENV]}
        raise SpareReleased("the test's workers end here")


class RecordingLauncher:
    name = "recording"

    def __init__(self, db: Path, fail: bool = False) -> None:
        self.db, self.fail = db, fail
        self.workers: SeenAtStart | None = None

    def check(self) -> None:
        pass

    def launch(self, job: LaunchJob, monitor: Monitor) -> str | None:
        if self.fail:  # as torch's rendezvous failing before any worker starts
            raise RuntimeError("rendezvous failed")
        self.workers = SeenAtStart(job, self.db)
        monitor(self.workers)  # type: ignore[arg-type]
        return None


def _config(tmp_path: Path) -> SupervisorConfig:
    launch = LaunchConfig(cmd=("python", "train.py"), nproc_per_node=2, standalone=True)
    return SupervisorConfig(
        launch, RecordConfig(job_id="job7", runs_root=tmp_path / "runs", db=tmp_path / "tg.db")
    )


def test_a_new_job_starts_its_workers_before_its_store_row_and_records_it_after(tmp_path):
    launcher = RecordingLauncher(tmp_path / "tg.db")
    result = Supervisor(_config(tmp_path), launcher=launcher).run()
    assert launcher.workers is not None
    assert launcher.workers.seen == {"job_row": False, "attempt": "0"}  # nothing the workers wait for
    assert result.exit_code is ExitCode.OK
    with IncidentStore(tmp_path / "tg.db") as store:
        job = store.get_job("job7")
    assert job is not None and job.status == "succeeded"


def test_a_rerun_of_a_job_id_judges_the_previous_run_before_its_workers_start(tmp_path):
    # a previous supervisor of job7 on this host left its logs (attempt 0); its pid is not alive
    (tmp_path / "runs" / "job7" / "logs" / f"{socket.gethostname()}-999999999" / "attempt0").mkdir(
        parents=True
    )
    launcher = RecordingLauncher(tmp_path / "tg.db")
    Supervisor(_config(tmp_path), launcher=launcher).run()
    assert launcher.workers is not None
    assert launcher.workers.seen == {"job_row": True, "attempt": "1"}  # the lost-run check came first


def test_a_launcher_that_fails_before_any_worker_starts_still_records_the_job(tmp_path):
    result = Supervisor(_config(tmp_path), launcher=RecordingLauncher(tmp_path / "tg.db", fail=True)).run()
    assert result.exit_code is ExitCode.FAILED and "rendezvous failed" in result.reason
    with IncidentStore(tmp_path / "tg.db") as store:
        job = store.get_job("job7")
    assert job is not None and job.status == "failed" and job.command == "python train.py"
