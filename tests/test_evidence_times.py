"""When an incident started, and what a fault cost, come from what the run saw (the first
timestamped evidence, the last progress before a hang, the measured step times), never from a
chaos drill's plan or its injection time; and a drill's faults leave the text real ones do."""

from __future__ import annotations

import pytest

from trainguard.actions import Advice
from trainguard.chaos import Fault, FaultKind, Injected
from trainguard.records import Finding, Health
from trainguard.rundir import ErrorRecord
from trainguard.supervisor.assess import assess
from trainguard.supervisor.attempt import Attempt, History
from trainguard.supervisor.hang import HangReport
from trainguard.supervisor.health import GpuMap
from trainguard.supervisor.observe import Observation
from trainguard.supervisor.watch import ProgressView

INJECTED_AT = 4.0  # a drill fired here; the run saw its first evidence later


def _attempt() -> Attempt:
    return Attempt(number=0, started=0.0, rank_of={0: 0, 1: 1, 2: 2, 3: 3}, gpu_map=GpuMap((0, 1, 2, 3)),
                   resume_step=0, world_size=4)  # fmt: skip


def _drilled(kind: FaultKind, rank: int) -> History:
    history = History()
    fault = Fault(kind, rank=rank, step=20)
    history.injected.append(Injected(0, fault, INJECTED_AT, 20, rank, rank, 123, "drill"))
    return history


def _look(**fields) -> Observation:
    prog = fields.pop("progress", ProgressView(20, 20, 7.0, 1.0, 30.0, False, (), 0.1, 1.0))
    codes = fields.pop("codes", {0: None, 1: None, 2: None, 3: None})
    return Observation(time=10.0, codes=codes, progress=prog, **fields)


def test_a_crash_starts_at_its_error_file_not_at_the_drills_injection():
    error = ErrorRecord(rank=1, time=9.2, exc_type="ValueError", message="malformed sample")
    obs = _look(codes={0: None, 1: 1, 2: None, 3: None}, errors=(error,))
    trouble = assess(obs, _attempt(), _drilled(FaultKind.RAISE, 1))
    assert trouble is not None and trouble.rank == 1
    assert trouble.started == 9.2 and "injected" not in trouble.extra


def test_a_failed_gpu_starts_at_its_first_finding_not_at_the_drills_injection():
    from trainguard.records import Gpu, GpuVerdict, NodeVerdict

    lost = Finding(
        "xid", Health.FAILED, Advice.RESET_GPU, "Xid 79: GPU has fallen off the bus", gpu=3, time=8.5
    )
    verdict = NodeVerdict(
        Health.FAILED, Advice.RESET_GPU, (GpuVerdict(Gpu(3), Health.FAILED, Advice.RESET_GPU, (lost,)),)
    )
    trouble = assess(_look(verdict=verdict), _attempt(), _drilled(FaultKind.XID, 3))
    assert trouble is not None and trouble.gpu == 3
    assert trouble.started == 8.5 and "injected" not in trouble.extra


def test_a_hang_starts_at_the_last_progress_not_at_the_drills_injection():
    prog = ProgressView(20, 18, 7.0, 1.0, 3.0, True, (), 0.1, 1.0)
    report = HangReport((2,), {2: "stack is not inside a collective"}, (), "stacks")
    trouble = assess(_look(progress=prog, hang=report), _attempt(), _drilled(FaultKind.HANG, 2))
    assert trouble is not None and trouble.rank == 2
    assert trouble.started == 7.0 and "injected" not in trouble.extra


def test_a_save_that_waits_for_a_starting_writer_is_no_hang_after_a_quick_first_save(tmp_path):
    """The first save of an attempt returns at once (handed to a writer still importing torch); the
    second waits for that writer. Seen under load: a false hang alarm 6 s into the second save."""
    import json

    from trainguard.rundir import heartbeat_path
    from trainguard.supervisor.watch import ProgressWatch

    def beat(step: int, t: float, phase: str = "train") -> None:
        path = heartbeat_path(tmp_path, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        rec = {"rank": 0, "step": step, "time": t, "step_time": 0.1, "attempt": 0, "phase": phase}
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    watch = ProgressWatch(tmp_path, hang_timeout_floor=6.0, hang_step_factor=3.0, startup_timeout=100)
    watch.begin_attempt(0, [0], started=0.0)
    for step in range(15):
        beat(step, 1.0 + step * 0.1)
    beat(14, 2.45, "checkpoint")  # the first save: handed off in 0.15 s
    for step in range(15, 30):
        beat(step, 2.6 + (step - 15) * 0.1)
    beat(29, 4.1, "checkpoint")  # the second waits for the writer
    view = watch.poll(now=12.0)  # 7.9 s into the save
    assert not view.hung and view.timeout >= 18.0  # factor x floor at least
    assert watch.poll(now=4.1 + view.timeout + 0.1).hung  # a save that never ends is still a hang


def test_a_drilled_xid_79_raises_what_torch_raises_not_the_kernel_drivers_words():
    from trainguard.detect.kernel_log import parse_kernel_line
    from trainguard.supervisor.logs import default_classifier

    message = Fault(FaultKind.XID, rank=3, xid=79).cuda_message()
    first = message.splitlines()[0]
    assert first == "CUDA error: unspecified launch failure"  # cudaErrorLaunchFailure's string
    assert "CUDA kernel errors might be asynchronously reported at some other API call" in message
    assert "fallen off the bus" not in message and "Xid" not in message and "NVRM" not in message
    assert parse_kernel_line(first) is None  # no kernel-log rule can take it for the driver's line
    event = default_classifier()(f"RuntimeError: {first}")
    assert event is not None and event.category.value == "gpu_hardware"  # a launch failure, as such
    ecc = Fault(FaultKind.XID, rank=0, xid=48).cuda_message().splitlines()[0]
    assert ecc == "CUDA error: uncorrectable ECC error encountered"
    illegal = Fault(FaultKind.XID, rank=0, xid=13).cuda_message().splitlines()[0]
    assert illegal == "CUDA error: an illegal memory access was encountered"


def test_the_work_redone_after_a_failure_starts_where_the_heartbeats_reached_the_resume_step():
    from trainguard.rundir import Heartbeat
    from trainguard.supervisor.bookkeeping import redone_since

    # Attempt 1's first step (45) is at t=48; on a loaded host (0.2 s a step) it finishes step 59 at
    # t=50.8 and step 80 at t=55, and fails; attempt 2 resumes from the checkpoint of 60 steps done.
    beats = [Heartbeat(0, 10 + i, 10 + i * 0.05, attempt=0) for i in range(30)]  # an earlier attempt
    beats += [Heartbeat(0, 45 + i, 48.0 + i * 0.2, attempt=1) for i in range(36)]
    # Steps 60-80 ran from 50.8 to 55 s: 4.2 s redone. The count times the step time learned on the
    # quiet start (0.05 s) says 1 s; at 0.5 s a step it would reach back to t=44.5, before the
    # attempt's first step.
    assert redone_since(beats, 55.0, 60, 0.05) == pytest.approx(50.8)
    assert redone_since(beats, 55.0, 45, 0.5) == 48.0  # never before the attempt's first step
    assert redone_since(beats, 55.0, 62, 0.2) == pytest.approx(51.2)
    assert redone_since(beats, 55.0, 90, 0.2) is None  # no beat that far: the caller estimates
