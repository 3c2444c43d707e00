"""The recovery policy: pure decisions over a trouble and the run's history."""

from __future__ import annotations

from trainguard.actions import JobAction
from trainguard.records import Health
from trainguard.supervisor.policy import (
    PolicyState,
    Trouble,
    TroubleKind,
    backoff_s,
    decide,
    error_signature,
    with_diagnosis,
)

BUG = "ValueError: bad batch at step <n> @ train.py:run"


def test_a_crash_restarts_in_place_and_counts_as_a_retry():
    d = decide(Trouble(kind=TroubleKind.PROCESS_EXIT, signature=BUG), PolicyState(max_restarts=3))
    assert d.verb is JobAction.RESTART
    assert d.counts_as_retry


def test_the_same_error_three_times_in_a_row_is_a_crash_loop():
    state = PolicyState(recent_signatures=(BUG, BUG), crash_loop_after=3)
    d = decide(Trouble(kind=TroubleKind.PROCESS_EXIT, signature=BUG), state)
    assert d.verb is JobAction.STOP_CRASH_LOOP
    assert d.verb.stops


def test_a_different_error_in_between_breaks_the_crash_loop():
    state = PolicyState(recent_signatures=(BUG, "OSError: disk", BUG), crash_loop_after=3)
    assert decide(Trouble(kind=TroubleKind.PROCESS_EXIT, signature=BUG), state).verb is JobAction.RESTART


def test_crash_loop_wins_even_with_restart_budget_left():
    state = PolicyState(max_restarts=100, recent_signatures=(BUG, BUG))
    assert (
        decide(Trouble(kind=TroubleKind.PROCESS_EXIT, signature=BUG), state).verb is JobAction.STOP_CRASH_LOOP
    )


def test_used_up_budget_stops():
    state = PolicyState(max_restarts=2, restarts_used=2)
    assert decide(Trouble(kind=TroubleKind.HANG), state).verb is JobAction.STOP_BUDGET


def test_a_failed_gpu_is_excluded_without_spending_a_retry():
    state = PolicyState(max_restarts=0, gpus_in_use=4)
    d = decide(Trouble(kind=TroubleKind.GPU_FAILED, gpu=2, gpu_health=Health.FAILED), state)
    assert d.verb is JobAction.EXCLUDE_GPU and d.gpu == 2
    assert not d.counts_as_retry


def test_excluding_the_last_gpu_stops_for_lack_of_capacity():
    state = PolicyState(gpus_in_use=1, min_gpus=1)
    d = decide(Trouble(kind=TroubleKind.GPU_FAILED, gpu=0, gpu_health=Health.FAILED), state)
    assert d.verb is JobAction.STOP_NO_CAPACITY


def test_a_cuda_ecc_crash_without_a_failed_verdict_runs_diagnostics_first():
    f = Trouble(kind=TroubleKind.PROCESS_EXIT, category="gpu_memory_ecc", gpu=1, gpu_health=Health.OK)
    assert decide(f, PolicyState()).verb is JobAction.DIAGNOSE


def test_diagnostics_that_fail_the_gpu_lead_to_exclusion():
    f = Trouble(kind=TroubleKind.PROCESS_EXIT, category="gpu_memory_ecc", gpu=1, gpu_health=Health.OK)
    d = decide(with_diagnosis(f, Health.FAILED), PolicyState(gpus_in_use=4))
    assert d.verb is JobAction.EXCLUDE_GPU and d.gpu == 1


def test_diagnostics_that_pass_lead_to_a_plain_restart():
    f = Trouble(kind=TroubleKind.PROCESS_EXIT, category="gpu_hardware", gpu=1)
    d = decide(with_diagnosis(f, Health.OK), PolicyState())
    assert d.verb is JobAction.RESTART
    assert "passed diagnostics" in d.reason


def test_a_degraded_gpu_while_training_runs_is_diagnosed_then_left_running():
    f = Trouble(kind=TroubleKind.GPU_DEGRADED, gpu=3, gpu_health=Health.DEGRADED, fatal=False)
    assert decide(f, PolicyState()).verb is JobAction.DIAGNOSE
    assert decide(with_diagnosis(f, Health.OK), PolicyState()).verb is JobAction.CONTINUE


def test_a_straggler_is_recorded_and_training_continues():
    assert decide(Trouble(kind=TroubleKind.STRAGGLER, fatal=False), PolicyState()).verb is JobAction.CONTINUE


def test_membership_changes_restart_for_free_even_without_budget():
    d = decide(Trouble(kind=TroubleKind.MEMBERSHIP), PolicyState(max_restarts=0))
    assert d.verb is JobAction.RESTART and not d.counts_as_retry


def test_backoff_is_zero_first_then_doubles_up_to_the_cap():
    waits = [
        backoff_s(PolicyState(failures_in_a_row=n, backoff_base_s=1, backoff_max_s=5)) for n in range(1, 7)
    ]
    assert waits == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_error_signature_ignores_numbers_paths_and_line_numbers():
    tb1 = 'File "/a/train.py", line 10, in run\n'
    tb2 = 'File "/b/train.py", line 99, in run\n'
    a = error_signature("ValueError", "bad batch 17 at /data/x.bin", tb1)
    b = error_signature("ValueError", "bad batch 42 at /data/y.bin", tb2)
    assert a == b == "ValueError: bad batch <n> at <path> @ train.py:run"
    assert error_signature("KeyError", "bad batch 17 at /data/x.bin", tb1) != a


def test_a_nan_one_gpu_produced_is_diagnosed_before_training_goes_on():
    nan = Trouble(kind=TroubleKind.NUMERICS, gpu=0, fatal=False, category="numerics")
    assert decide(nan, PolicyState()).verb is JobAction.DIAGNOSE
    assert decide(with_diagnosis(nan, Health.OK), PolicyState()).verb is JobAction.CONTINUE
    assert (
        decide(with_diagnosis(nan, Health.FAILED), PolicyState(gpus_in_use=4)).verb is JobAction.EXCLUDE_GPU
    )
    # every rank saw it, no rank's own loss: no GPU to test
    assert decide(Trouble(kind=TroubleKind.NUMERICS, fatal=False), PolicyState()).verb is JobAction.CONTINUE


def test_a_degraded_gpu_still_in_service_asks_for_a_checkpoint_now():
    degraded = Trouble(kind=TroubleKind.GPU_DEGRADED, gpu=2, gpu_health=Health.DEGRADED, fatal=False)
    d = decide(with_diagnosis(degraded, Health.DEGRADED), PolicyState())
    assert (d.verb, d.checkpoint) == (JobAction.CONTINUE, True) and "checkpoint now" in d.reason
    slow = decide(Trouble(kind=TroubleKind.STRAGGLER, rank=1, fatal=False), PolicyState())
    assert (slow.verb, slow.checkpoint) == (JobAction.CONTINUE, False)  # slow, not at risk of failing
    failed = decide(with_diagnosis(degraded, Health.FAILED), PolicyState(gpus_in_use=2))
    assert (failed.verb, failed.checkpoint) == (JobAction.EXCLUDE_GPU, False)


START = "ModuleNotFoundError: No module named 'webdataset' @ train.py:12"


def test_the_same_failure_before_any_step_twice_is_a_crash_loop():
    state = PolicyState(recent_fingerprints=(START,), crash_loop_after=3)
    d = decide(Trouble(kind=TroubleKind.PROCESS_EXIT, fingerprint=START), state)
    assert d.verb is JobAction.STOP_CRASH_LOOP and START in d.reason


def test_a_different_failure_before_any_step_is_retried():
    state = PolicyState(recent_fingerprints=("OSError: shard 3 is not readable yet @ train.py:17",))
    trouble = Trouble(
        kind=TroubleKind.PROCESS_EXIT, fingerprint="OSError: shard 7 is not readable yet @ train.py:17"
    )
    assert decide(trouble, state).verb is JobAction.RESTART


def test_a_first_failure_before_any_step_is_retried_once():
    assert (
        decide(Trouble(kind=TroubleKind.PROCESS_EXIT, fingerprint=START), PolicyState()).verb
        is JobAction.RESTART
    )
