"""Supervisor pieces without processes: hang timeout learning, laggard analysis, root cause of
an exit, worker-command parsing."""

from __future__ import annotations

import doctest
import json
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from trainguard.rundir import ErrorRecord, Heartbeat, append_discarded, heartbeat_path
from trainguard.supervisor.config import checkpoint_dir_from_cmd
from trainguard.supervisor.exits import Exited, aborted_after_finishing, exit_trouble
from trainguard.supervisor.hang import analyze
from trainguard.supervisor.warm import _script_argv
from trainguard.supervisor.watch import ProgressWatch


def beat(
    run_dir: Path,
    rank: int,
    step: int,
    t: float,
    step_time: float | None = 0.1,
    phase: str = "train",
    loss: float | None = 1.0,
) -> None:
    path = heartbeat_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {
        "rank": rank,
        "step": step,
        "time": t,
        "loss": loss,
        "step_time": step_time,
        "attempt": 0,
        "phase": phase,
    }
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def test_hang_timeout_is_learned_from_step_times_with_a_floor(tmp_path):
    watch = ProgressWatch(tmp_path, hang_timeout_floor=2.0, hang_step_factor=5.0, startup_timeout=100)
    watch.begin_attempt(0, [0, 1], started=0.0)
    for i in range(10):
        beat(tmp_path, 0, i, 10 + i, step_time=0.2 if i else 9.0)  # the first step's warm-up is ignored
        beat(tmp_path, 1, i, 10 + i, step_time=0.2 if i else 9.0)
    view = watch.poll(now=20.0)
    assert view.timeout == 2.0 and not view.hung
    assert watch.poll(now=21.5).hung  # last progress at t=19, timeout 2 s
    beat(tmp_path, 0, 10, 22, step_time=1.0)
    assert watch.poll(now=23.0).timeout == 5.0  # 5 x the slowest recent step


def _train_with_saves(run_dir: Path, ranks: tuple[int, ...], save_s: float) -> float:
    """Steps 0..28 every 0.1 s on every rank, a save after every 5th taking ``save_s`` (its
    checkpoint beat, then the next step's beat); returns the time of step 28's beat."""
    t = 10.0
    for step in range(29):
        t += 0.1
        for rank in ranks:
            beat(run_dir, rank, step, t)
        if (step + 1) % 5 == 0:
            for rank in ranks:
                beat(run_dir, rank, step, t + 0.01, step_time=None, phase="checkpoint")
            t += save_s
    return t


@pytest.mark.parametrize("save_s", [0.05, 2.0])  # asynchronous saves (return at once), slow ones
@pytest.mark.parametrize("saver", [0, 1])
def test_a_hang_that_begins_while_another_rank_saves_is_caught_at_the_floor(tmp_path, saver, save_s):
    # Both seen in bench_recovery's SIGSTOP of rank 1 (of 2, saves every 5 steps). saver 0: rank 1
    # stopped in step 29 after its all-reduce; rank 0 finished step 29, beat "checkpoint" and
    # waits in the save's collective. saver 1: rank 1 saved after step 29, then stopped in step
    # 30 after its all-reduce, before its beat: its last beat is still "checkpoint", rank 0
    # finished step 30. Either way one rank is in no save: the hang is due at the floor.
    watch = ProgressWatch(tmp_path, hang_timeout_floor=3.0, hang_step_factor=5.0, startup_timeout=100)
    watch.begin_attempt(0, [0, 1], started=0.0)
    t = _train_with_saves(tmp_path, (0, 1), save_s) + 0.1
    for rank in (0,) if saver == 0 else (0, 1):
        beat(tmp_path, rank, 29, t)
        beat(tmp_path, rank, 29, t + 0.01, step_time=None, phase="checkpoint")
    if saver == 1:
        t += save_s + 0.1
        beat(tmp_path, 0, 30, t)
    view = watch.poll(now=t + 2.9)
    assert view.timeout == 3.0 and not view.hung
    assert watch.poll(now=t + 3.1).hung


def test_a_save_every_rank_is_in_may_take_factor_x_its_slowest_save_then_is_a_hang(tmp_path):
    watch = ProgressWatch(tmp_path, hang_timeout_floor=3.0, hang_step_factor=5.0, startup_timeout=100)
    watch.begin_attempt(0, [0, 1], started=0.0)
    t = _train_with_saves(tmp_path, (0, 1), save_s=2.0) + 0.1
    for rank in (0, 1):
        beat(tmp_path, rank, 29, t)
        beat(tmp_path, rank, 29, t + 0.01, step_time=None, phase="checkpoint")
    allowance = 5.0 * 2.09  # each save measured from its checkpoint beat to the next step's beat
    assert not watch.poll(now=t + 0.01 + allowance - 0.1).hung
    assert watch.save_allowance(0) == pytest.approx(allowance)
    assert watch.poll(now=t + 0.01 + allowance + 0.1).hung  # a save that never ends is a hang


def test_a_ranks_save_allowance_follows_its_own_saves(tmp_path):
    watch = ProgressWatch(tmp_path, hang_timeout_floor=3.0, hang_step_factor=5.0, startup_timeout=100)
    watch.begin_attempt(0, [0, 1], started=0.0)
    _train_with_saves(tmp_path, (0,), save_s=2.0)
    _train_with_saves(tmp_path, (1,), save_s=0.05)
    watch.poll(now=30.0)
    assert watch.save_allowance(0) == pytest.approx(5.0 * 2.09)
    assert watch.save_allowance(1) == 3.0  # 5 x 0.14 s: the floor


def test_a_replica_group_that_discards_a_step_is_alive_until_it_tries_the_same_step_too_long(tmp_path):
    # A healthy group waits on its hung peer in the all-reduce, discards the step, steps on
    # without it: no new step for a while, but the discard is progress. A group that discards
    # the same step again and again is not (and a hung group discards nothing).
    watch = ProgressWatch(tmp_path, hang_timeout_floor=2.0, startup_timeout=100)
    watch.begin_attempt(0, [0, 1], started=5.0)
    append_discarded(tmp_path, 0, 3, 3.0, 4.0)  # an earlier attempt's: no progress of this one
    for i in range(10):
        beat(tmp_path, 0, i, 10 + i)
        beat(tmp_path, 1, i, 10 + i)
    assert not watch.poll(now=20.0).hung
    append_discarded(tmp_path, 0, 10, 19.0, 21.0)
    view = watch.poll(now=22.5)
    assert not view.hung and view.last_progress == 21.0
    append_discarded(tmp_path, 0, 10, 21.0, 22.8)  # the same step again: no new progress
    assert watch.poll(now=23.5).hung


def test_before_the_first_step_the_startup_timeout_applies(tmp_path):
    watch = ProgressWatch(tmp_path, hang_timeout_floor=2.0, startup_timeout=60)
    watch.begin_attempt(0, [0], started=0.0)
    beat(tmp_path, 0, 0, 1.0, step_time=None, phase="init")
    assert not watch.poll(now=50.0).hung
    assert watch.poll(now=61.0).hung


def test_a_nan_loss_is_reported_once_per_rank(tmp_path):
    watch = ProgressWatch(tmp_path)
    watch.begin_attempt(0, [0], started=0.0)
    beat(tmp_path, 0, 1, 1.0, loss=float("nan"))
    beat(tmp_path, 0, 2, 2.0, loss=float("nan"))
    assert watch.poll(now=2.0).nan_ranks == (0,)
    beat(tmp_path, 0, 3, 3.0, loss=float("nan"))
    assert watch.poll(now=3.0).nan_ranks == ()


def test_a_stopped_rank_is_the_laggard():
    report = analyze([0, 1], {0: "S", 1: "T"}, {}, {})
    assert report.laggards == (1,) and report.method == "proc_state"


def test_the_rank_whose_stack_is_outside_the_collective_is_the_laggard(tmp_path):
    waiting = tmp_path / "rank0-1.txt"
    waiting.write_text('File "torch/autograd/__init__.py", line 1 in backward\n')
    elsewhere = tmp_path / "rank1-1.txt"
    elsewhere.write_text('File "trainguard/torch/chaos.py", line 1 in _fire\n')
    report = analyze([0, 1], {0: "S", 1: "S"}, {0: [waiting], 1: [elsewhere]}, {})
    assert report.laggards == (1,) and report.method == "stacks"


def test_only_the_training_threads_of_a_faulthandler_dump_say_whether_a_rank_is_in_the_collective(tmp_path):
    # Shaped like the dumps the demo's F5 leaves: the Guard's watchdog thread, the training loop
    # (waiting in the Guard's own all-reduce, or stopped in the injected fault) and the module list.
    def dump(rank: int, training_frames: str) -> Path:
        path = tmp_path / f"rank{rank}-1.txt"
        path.write_text(
            "Fatal Python error: Aborted\n\n"
            "Thread 0x00007f0a1b2c3640 (most recent call first):\n"
            '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
            '  File "/src/trainguard/torch/watchdog.py", line 98 in _run\n\n'
            "Current thread 0x00007f0a2d4e5740 (most recent call first):\n"
            f"{training_frames}"
            '  File "/work/train.py", line 40 in main\n\n'
            "Extension modules: numpy.core._multiarray_umath, torch._C, torch._C._distributed_c10d (total: 3)\n"
        )
        return path

    waiting = '  File "/src/trainguard/torch/agreement.py", line 61 in collect\n'
    fired = '  File "/src/trainguard/torch/chaos.py", line 120 in _fire\n'
    dumps = {0: [dump(0, waiting)], 1: [dump(1, waiting)], 2: [dump(2, fired)]}
    report = analyze([0, 1, 2], {r: "S" for r in range(3)}, dumps, {})
    assert report.laggards == (2,) and report.method == "stacks"


def test_a_collective_frame_in_the_watchdog_thread_alone_does_not_put_a_rank_in_the_collective(tmp_path):
    paths = {}
    for rank, frame in ((0, "torch/distributed/distributed_c10d.py"), (1, "trainguard/torch/chaos.py")):
        paths[rank] = [tmp_path / f"rank{rank}-1.txt"]
        paths[rank][0].write_text(
            "Thread 0x1 (most recent call first):\n"
            '  File "/src/trainguard/torch/watchdog.py", line 1 in all_reduce_probe\n\n'
            f'Current thread 0x2 (most recent call first):\n  File "/src/{frame}", line 1 in f\n'
        )
    assert analyze([0, 1], {0: "S", 1: "S"}, paths, {}).laggards == (1,)


def test_the_rank_behind_in_the_flight_recorder_is_the_laggard(tmp_path):
    dumps = {}
    for rank, seq in ((0, 41), (1, 40), (2, 41)):
        p = tmp_path / f"rank{rank}-1.fr.json"
        p.write_text(json.dumps({"entries": [{"collective_seq_id": s} for s in range(seq - 3, seq + 1)]}))
        dumps[rank] = [p]
    report = analyze([0, 1, 2], {}, dumps, {})
    assert report.laggards == (1,) and report.method == "flight_recorder"


def test_the_only_rank_of_a_one_rank_job_is_the_laggard(tmp_path):
    fired = tmp_path / "rank0-1.txt"
    fired.write_text(
        'Current thread 0x2 (most recent call first):\n  File "/src/trainguard/torch/chaos.py", line 1\n'
    )
    report = analyze([0], {0: "S"}, {0: [fired]}, {})
    assert report.laggards == (0,) and report.method == "stacks"
    assert report.reasons[0] == "the job's only rank; stack is not inside a collective"
    assert analyze([0], {0: "S"}, {}, {}).laggards == (0,)  # no dump: still the only suspect


def test_heartbeats_break_the_tie_when_nothing_else_does():
    beats = {0: Heartbeat(0, 30, 1.0), 1: Heartbeat(1, 29, 1.0)}
    assert analyze([0, 1], {}, {}, beats).laggards == (1,)


def test_the_earliest_causal_failure_is_the_root_cause_not_the_peers_symptoms():
    killed = Exited(rank=1, local_rank=1, code=-9, seen=100.0)
    peer = Exited(rank=0, local_rank=0, code=1, seen=100.3)
    peer_error = ErrorRecord(0, 100.2, "RuntimeError", "Connection reset by peer", attempt=0)
    t = exit_trouble(101.0, [killed, peer], [peer_error], [], [], {0: 0, 1: 1}, {})
    assert t.rank == 1
    assert "SIGKILL" in t.summary
    assert t.signature is None  # a kill is not an application bug: no crash-loop count


def test_a_gpu_that_fell_off_the_bus_names_its_own_rank_whichever_rank_was_seen_exiting_first():
    # The quick demo's F2 under load (CI of stop 28): the agent's Xid 79 finding on GPU 3 came
    # first and names no rank; rank 3 raised CUDA's error, its peer rank 2 lost the connection, and
    # one slow poll saw both exits at once. The rank must be GPU 3's, never the first in the list.
    from trainguard.actions import Advice
    from trainguard.chaos.plan import XID_CUDA_MESSAGE
    from trainguard.records import Category, Finding, Health
    from trainguard.supervisor.logs import default_classifier

    reason = "Xid 79: GPU has fallen off the bus"
    xid = Finding("xid", Health.FAILED, Advice.RESET_GPU, reason, 3, 99.9, Category.GPU_HARDWARE)
    cuda = ErrorRecord(3, 100.0, "RuntimeError", XID_CUDA_MESSAGE[79], attempt=0)
    peer = ErrorRecord(2, 100.1, "RuntimeError", "Connection closed by peer [127.0.0.1]:29500", attempt=0)
    exits = [
        Exited(rank=2, local_rank=2, code=1, seen=100.6),
        Exited(rank=3, local_rank=3, code=1, seen=100.6),
    ]
    gpus, health = {r: r for r in range(4)}, {3: Health.FAILED}
    t = exit_trouble(101.0, exits, [peer, cuda], [], [xid], gpus, health, default_classifier())
    assert (t.rank, t.gpu, t.root_cause.value) == (3, 3, "faulty_gpu")
    # Nothing but the failed GPU names a rank (no error files): still GPU 3's rank.
    t = exit_trouble(101.0, exits, [], [], [xid], gpus, health)
    assert (t.rank, t.gpu) == (3, 3)
    # No GPU evidence: the rank whose exit came first, as before.
    t = exit_trouble(101.0, [exits[0], replace(exits[1], seen=100.8)], [], [], [], gpus, {})
    assert (t.rank, t.gpu) == (2, 2)


def test_a_sigkill_is_the_hosts_only_with_oom_killer_evidence():
    killed = Exited(rank=1, local_rank=1, code=-9, seen=100.0)
    unproven = exit_trouble(101.0, [killed], [], [], [], {1: 1}, {})
    assert unproven.root_cause.value == "unknown"
    assert unproven.evidence[0].startswith("unknown; suspects: host (")
    oom = exit_trouble(101.0, [killed], [], [], [], {1: 1}, {}, oom_killed=True)
    assert oom.root_cause.value == "host"
    assert "OOM killer" in oom.evidence[0]


def test_an_application_error_carries_a_crash_loop_signature():
    err = ErrorRecord(1, 50.0, "ValueError", "bad batch at step 7", 'File "/x/train.py", line 3, in run\n')
    t = exit_trouble(51.0, [Exited(1, 1, 1, 50.1)], [err], [], [], {1: 1}, {})
    assert t.root_cause.value == "software_bug"
    assert t.signature == "ValueError: bad batch at step <n> @ train.py:run"


def test_checkpoint_dir_and_script_are_found_in_the_worker_command(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert checkpoint_dir_from_cmd(["python", "t.py", "--checkpoint-dir", "ck"]) == Path("ck")
    assert checkpoint_dir_from_cmd(["python", "t.py", "--checkpoint-dir=/a/b"]) == Path("/a/b")
    assert _script_argv(("-u", str(script), "--x")) == [str(script), "--x"]
    assert _script_argv(("-m", "pkg.train")) == ["-m", "pkg.train"]
    assert _script_argv(("-c", "print(1)")) is None


TEARDOWN_ABORT = (Path(__file__).parent / "data" / "teardown_abort.stderr").read_text()
# The same abort, with faulthandler crashing (SIGSEGV) while it walked the dying threads.
TEARDOWN_ABORT_SEGV = (Path(__file__).parent / "data" / "teardown_abort_segv.stderr").read_text()
ABORT_IN_PYTHON = (
    "Fatal Python error: Aborted\n\nCurrent thread 0x00007f (most recent call first):\n"
    '  File "/job/train.py", line 88 in evaluate\n'
)


def test_a_rank_that_finished_and_aborted_in_teardown_counts_as_done():
    # The real stderr of a DDP gloo worker that finished, said goodbye and died at interpreter exit.
    assert aborted_after_finishing(-signal.SIGABRT, "exit", False, TEARDOWN_ABORT)
    assert aborted_after_finishing(-signal.SIGSEGV, "exit", False, TEARDOWN_ABORT_SEGV)


def test_an_abort_is_a_failure_unless_the_rank_finished_and_python_was_done():
    assert not aborted_after_finishing(-signal.SIGABRT, "train", False, TEARDOWN_ABORT)  # mid-training
    assert not aborted_after_finishing(-signal.SIGABRT, "exit", True, TEARDOWN_ABORT)  # left an error file
    assert not aborted_after_finishing(-signal.SIGABRT, "exit", False, ABORT_IN_PYTHON)  # inside Python code
    assert not aborted_after_finishing(
        -signal.SIGSEGV, "exit", False, "Fatal Python error: Segmentation fault\n"
    )
    assert not aborted_after_finishing(-signal.SIGKILL, "exit", False, TEARDOWN_ABORT)
    assert not aborted_after_finishing(
        -signal.SIGABRT, None, False, TEARDOWN_ABORT
    )  # no heartbeat this attempt


# -- attribution: the rank and GPU that produced a fault, and causes that follow from evidence --


def _attempt():
    from trainguard.supervisor.attempt import Attempt
    from trainguard.supervisor.health import GpuMap

    return Attempt(number=0, started=0.0, rank_of={0: 0, 1: 1, 2: 2, 3: 3}, gpu_map=GpuMap((0, 1, 2, 3)),
                   resume_step=0, world_size=4)  # fmt: skip


def _look(**fields):
    from trainguard.supervisor.observe import Observation
    from trainguard.supervisor.watch import ProgressView

    prog = fields.pop("progress", ProgressView(20, 20, 1.0, 1.0, 30.0, False, (), 0.1, 1.0))
    return Observation(time=10.0, codes={0: None, 1: None, 2: None, 3: None}, progress=prog, **fields)


def _nan_findings(source: int, writers=(0, 1, 2, 3), step=20):
    from trainguard.actions import Advice
    from trainguard.detect.numerics import with_sources
    from trainguard.records import Category, Finding, Health

    f = Finding("numerics.nonfinite_loss", Health.DEGRADED, Advice.NONE, f"non-finite loss at step {step}",
                time=9.0, category=Category.NUMERICS)  # fmt: skip
    f = with_sources(f, (source,))
    return tuple(((r, step, f.rule, f.time), r, step, f) for r in writers)  # every rank reports it


def test_a_nan_of_one_rank_names_that_rank_and_its_gpu_whichever_rank_reported_first():
    from trainguard.supervisor.assess import assess
    from trainguard.supervisor.attempt import History

    for writers in ((0, 1, 2, 3), (3, 2, 1, 0), (2, 0)):
        t = assess(_look(findings=_nan_findings(0, writers)), _attempt(), History())
        assert t is not None and (t.rank, t.gpu, t.ranks) == (0, 0, (0,))
        assert "rank 0 (GPU 0)" in t.summary
        assert t.root_cause.value == "unknown"  # SDC or the program's: the replay tells
        assert t.evidence[0].startswith("unknown; suspects: silent_data_corruption")


def test_the_heartbeat_path_names_the_ranks_whose_own_loss_was_nan():
    from trainguard.supervisor.assess import assess
    from trainguard.supervisor.attempt import History
    from trainguard.supervisor.watch import ProgressView

    prog = ProgressView(20, 20, 1.0, 1.0, 30.0, False, (2,), 0.1, None)
    t = assess(_look(progress=prog, nan_steps={2: 20}), _attempt(), History())
    assert t is not None and (t.rank, t.gpu, t.detected_by) == (2, 2, "heartbeat")


def test_a_rollback_and_its_replay_verdict_update_the_numerics_incident():
    from trainguard.actions import Advice
    from trainguard.incidents import Incident, RootCause
    from trainguard.records import Finding, Health
    from trainguard.supervisor.assess import numerics_verdicts
    from trainguard.supervisor.attempt import History

    history = History()
    history.numerics_incidents[20] = Incident(job="j", time=1.0, root_cause=RootCause.UNKNOWN, action="continue",
                                              summary="x", evidence=("unknown; suspects: ...",))  # fmt: skip
    rollback = Finding(
        "numerics.rollback", Health.OK, Advice.NONE, "rolled back from step 21 to 15", time=9.5
    )
    transient = Finding(
        "numerics.transient", Health.DEGRADED, Advice.NONE, "gone after the rollback", time=9.8
    )
    rows = (((0, 21, "r", 9.5), 0, 21, rollback), ((0, 20, "t", 9.8), 0, 20, transient))
    updates = numerics_verdicts(_look(findings=rows), history)
    assert [u.step for u in updates] == [20, 20]  # the rollback of step 21 undid the NaN of step 20
    changes = [u.changes for u in updates]
    assert changes[0]["action"] == "rollback"
    assert changes[1]["root_cause"] is RootCause.SILENT_DATA_CORRUPTION
    assert not any(str(e).startswith("unknown;") for e in changes[1]["evidence"])


def test_a_stopped_laggard_is_the_hosts_and_a_laggard_outside_a_collective_is_no_network_fault():
    from trainguard.supervisor.assess import hang_cause
    from trainguard.supervisor.hang import HangReport

    stopped = HangReport((2,), {2: "process stopped (state T)"}, (), "proc_state")
    assert hang_cause(stopped, [])[0].value == "host"
    outside = HangReport((2,), {2: "stack is not inside a collective"}, (), "stacks")
    cause, why = hang_cause(outside, [])
    assert cause.value == "unknown" and "network" not in why[0]
    nobody = HangReport((), {}, (), "none")
    assert hang_cause(nobody, [])[0].value == "unknown"  # gloo or NCCL: no library said timeout


def test_a_hang_is_an_nccl_watchdog_timeout_only_when_nccl_says_so():
    from trainguard.records import Category, Event, EventKind
    from trainguard.supervisor.assess import hang_cause
    from trainguard.supervisor.hang import HangReport

    line = Event(EventKind.TRAINING, "Watchdog caught collective operation timeout", time=5.0,
                 category=Category.NCCL_TIMEOUT_HANG)  # fmt: skip
    assert hang_cause(HangReport((), {}, (), "none"), [line])[0].value == "nccl_watchdog_timeout"


WATCHDOG = [
    "[rank3]:[E1124 10:14:02.100 1 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600042 milliseconds before timing out.",
    "[rank3]:[E1124 10:14:02.200 1 ProcessGroupNCCL.cpp:630] [Rank 3] Some NCCL operations have failed or "
    "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
    "corrupted/incomplete data.",
    "[rank3]:[E1124 10:14:02.300 1 ProcessGroupNCCL.cpp:636] [Rank 3] To avoid data inconsistency, we are "
    "taking the entire process down.",
    "[rank3]:[E1124 10:14:02.400 1 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 3] Process group watchdog thread "
    "terminated with exception: [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600042 milliseconds before timing out.",
]


def test_one_nccl_watchdog_timeout_in_a_ranks_output_is_one_event_per_rank(tmp_path):
    from trainguard.supervisor.logs import LogTail

    files = {}
    for rank in (2, 3):
        path = tmp_path / f"rank{rank}.stderr"
        path.write_text("step 10\n" + "\n".join(w.replace("rank3", f"rank{rank}") for w in WATCHDOG) + "\n")
        files[(rank, "stderr")] = path
    tail = LogTail(tee=False)
    tail.follow(files)
    lines = tail.poll()
    assert len(lines) == 2 * (1 + len(WATCHDOG))  # every line is still read (and teed) ...
    events = [ln for ln in lines if ln.event is not None]
    assert sorted(ln.rank for ln in events) == [2, 3]  # ... but each rank's timeout is one event
    assert all("Watchdog caught collective" in ln.text for ln in events)


def test_the_same_failure_again_later_is_a_new_event(tmp_path):
    from trainguard.supervisor.logs import LogTail

    path = tmp_path / "rank3.stderr"
    later = WATCHDOG[0].replace("10:14:02.100", "10:24:02.100")
    path.write_text(WATCHDOG[0] + "\n" + "ok\n" * 60 + later + "\n")
    tail = LogTail(tee=False)
    tail.follow({(3, "stderr"): path})
    assert len([ln for ln in tail.poll() if ln.event is not None]) == 2


def test_the_flight_recorders_old_variable_name_goes_only_to_a_torch_that_reads_it(tmp_path):
    # torch >= 2.8 warns in every rank where TORCH_NCCL_TRACE_BUFFER_SIZE is set; older torch reads only it
    from trainguard.supervisor import hang

    new = hang.flight_recorder_env(tmp_path, "2.13.0")
    assert new["TORCH_FR_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in new
    for old in ("2.4.1+cu121", "2.7.1", ""):  # "": unknown, both names
        assert hang.flight_recorder_env(tmp_path, old)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in hang.flight_recorder_env(tmp_path)  # the installed 2.13
    result = doctest.testmod(hang)
    assert result.attempted > 0 and result.failed == 0
