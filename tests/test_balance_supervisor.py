"""The supervisor's side of balancing: each move the ranks agreed on is an incident with its
evidence; an exclusion restarts without the GPU; a GPU that is only slow is left to balancing
first; the timeline plot draws the shares."""

from __future__ import annotations

import json

from trainguard.actions import Advice, JobAction
from trainguard.records import Category, Finding, Gpu, GpuVerdict, Health, NodeVerdict
from trainguard.supervisor.assess import assess
from trainguard.supervisor.attempt import Attempt, History
from trainguard.supervisor.health import GpuMap
from trainguard.supervisor.observe import Observation
from trainguard.supervisor.policy import PolicyState, TroubleKind, decide
from trainguard.supervisor.watch import ProgressView


def attempt() -> Attempt:
    return Attempt(
        number=0,
        started=0.0,
        rank_of={0: 0, 1: 1, 2: 2, 3: 3},
        gpu_map=GpuMap((4, 5, 6, 7)),
        resume_step=0,
        world_size=4,
    )


def look(**fields) -> Observation:
    prog = ProgressView(20, 20, 1.0, 1.0, 30.0, False, (), 0.1, 1.0)
    return Observation(time=10.0, codes={0: None, 1: None, 2: None, 3: None}, progress=prog, **fields)


ON = Finding("balance.on", Health.OK, Advice.NONE, "balancing 4 ranks", time=1.0)


def move(verb: str, rank: int = 1, t: float = 5.0, **extra) -> tuple:
    record = {
        "verb": verb,
        "step": 29,
        "rank": rank,
        "shares": [37, 18, 36, 37] if verb == "rebalance" else [32] * 4,
        "old_shares": [32] * 4 if verb == "rebalance" else [37, 18, 36, 37],
        "speeds": [800.0, 400.0, 790.0, 805.0],
        "first_batch": 30,
        "gpus": [4, 5, 6, 7],
        "gpu": 5,
        **extra,
    }
    f = Finding(
        f"balance.{verb}",
        Health.DEGRADED,
        Advice.NONE,
        f"{verb}: rank {rank} (GPU 5)",
        gpu=5,
        time=t,
        evidence=(json.dumps(record),),
    )
    return ((0, 29, f.rule, t), 0, 29, f)


def rows(*moves) -> tuple:
    return (((0, None, ON.rule, ON.time), 0, None, ON), *moves)


def test_a_rebalance_is_recorded_with_its_evidence_and_the_workers_keep_running():
    t = assess(look(findings=rows(move("rebalance"))), attempt(), History())
    assert t is not None and t.kind is TroubleKind.STRAGGLER and not t.fatal
    assert (t.rank, t.gpu, t.detected_by) == (1, 5, "balance")
    assert any("[800.0, 400.0, 790.0, 805.0]" in e for e in t.evidence)
    assert any("[32, 32, 32, 32] -> [37, 18, 36, 37]" in e for e in t.evidence)
    assert t.extra["report"]["balance"]["shares"] == [37, 18, 36, 37]  # stored whole for the plot
    assert t.root_cause.value == "unknown" and any("suspects: faulty_gpu" in e for e in t.evidence)
    d = decide(t, PolicyState(gpus_in_use=4))
    assert d.verb is JobAction.REBALANCE and d.verb.keeps_running


def test_each_move_is_recorded_once():
    history = History()
    t = assess(look(findings=rows(move("rebalance"))), attempt(), history)
    history.reported.add(t.extra["key"])
    assert assess(look(findings=rows(move("rebalance"))), attempt(), history) is None
    later = assess(
        look(findings=rows(move("rebalance"), move("restore", rank=None, t=8.0))), attempt(), history
    )
    assert later is not None and decide(later, PolicyState()).verb is JobAction.RESTORE_SHARES


def test_an_exclusion_restarts_without_the_gpu_unless_none_would_be_left():
    t = assess(look(findings=rows(move("exclude", x_keep=10.0, x_drop=12.0))), attempt(), History())
    assert t is not None and t.gpu == 5
    d = decide(t, PolicyState(gpus_in_use=4, min_gpus=1))
    assert (d.verb, d.gpu, d.counts_as_retry) == (JobAction.EXCLUDE_GPU, 5, False)
    assert decide(t, PolicyState(gpus_in_use=1, min_gpus=1)).verb is JobAction.CONTINUE


def _slow_gpu_verdict(rule: str = "straggler", health: Health = Health.DEGRADED) -> NodeVerdict:
    action = Advice.RUN_DIAGNOSTICS if health is Health.DEGRADED else Advice.RESET_GPU
    f = Finding(rule, health, action, f"GPU 5: {rule}", gpu=5, time=9.0, category=Category.GPU_HARDWARE)
    gpu = GpuVerdict(Gpu(5), health, action, (f,))
    return NodeVerdict(health, action, (gpu,))


def test_a_gpu_only_slow_is_left_to_balancing_first():
    balancing = look(findings=rows(), verdict=_slow_gpu_verdict(), gpu_health={5: Health.DEGRADED})
    t = assess(balancing, attempt(), History())
    assert t is not None and t.kind is TroubleKind.GPU_DEGRADED and t.gpu == 5
    d = decide(t, PolicyState(gpus_in_use=4))
    assert d.verb is JobAction.CONTINUE and "balances" in d.reason
    # the same GPU in a job that does not balance: diagnosed (and excluded if it fails), as before
    plain = look(verdict=_slow_gpu_verdict(), gpu_health={5: Health.DEGRADED})
    assert decide(assess(plain, attempt(), History()), PolicyState(gpus_in_use=4)).verb is JobAction.DIAGNOSE


def test_a_failing_gpu_is_excluded_even_in_a_job_that_balances():
    remap = look(findings=rows(), verdict=_slow_gpu_verdict("remap_pending"), gpu_health={5: Health.DEGRADED})
    assert decide(assess(remap, attempt(), History()), PolicyState(gpus_in_use=4)).verb is JobAction.DIAGNOSE
    failed = look(
        findings=rows(), verdict=_slow_gpu_verdict("ecc_dbe", Health.FAILED), gpu_health={5: Health.FAILED}
    )
    assert (
        decide(assess(failed, attempt(), History()), PolicyState(gpus_in_use=4)).verb is JobAction.EXCLUDE_GPU
    )


def test_the_timeline_draws_each_ranks_share_and_moves_are_not_failures():
    from trainguard.incidents.plot import timeline

    def incident(i: int, t: float, action: str, old: list[int], new: list[int]) -> dict:
        evidence = [
            "...",
            {"balance": {"verb": action, "shares": new, "old_shares": old, "gpus": [4, 5, 6, 7]}},
        ]
        return {
            "id": i,
            "time": t,
            "started": t,
            "root_cause": "unknown",
            "action": action,
            "evidence": evidence,
        }

    report = {
        "job": "j",
        "started": 100.0,
        "goodput": {"wall_s": 60.0, "interruptions": 1, "ettr": 0.9},
        "progress": [{"time": 101.0, "step": 0, "attempt": 0}, {"time": 150.0, "step": 90, "attempt": 0}],
        "intervals": [],
        "incidents": [
            incident(1, 120.0, "rebalance", [32] * 4, [37, 18, 36, 37]),
            {
                "id": 2,
                "time": 130.0,
                "started": 129.0,
                "root_cause": "faulty_gpu",
                "action": "restart",
                "evidence": [],
            },
            incident(3, 140.0, "restore_shares", [37, 18, 36, 37], [32] * 4),
        ],
    }
    data = timeline(report)
    assert data.shares == ((0.0, (32, 32, 32, 32)), (20.0, (37, 18, 36, 37)), (40.0, (32, 32, 32, 32)))
    assert [m.incident_id for m in data.failures] == [2]
    assert [(m.incident_id, m.label) for m in data.moves] == [(1, "rebalance"), (3, "restore_shares")]
    assert data.gpus == (4, 5, 6, 7)


def test_the_plot_of_a_balancing_job_draws(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    from trainguard.incidents.plot import plot_timeline

    report = {
        "job": "j",
        "started": 0.0,
        "goodput": {"wall_s": 10.0, "interruptions": 0, "ettr": 1.0},
        "progress": [{"time": 0.0, "step": 0, "attempt": 0}, {"time": 10.0, "step": 50, "attempt": 0}],
        "intervals": [],
        "incidents": [
            {
                "id": 1,
                "time": 5.0,
                "started": 5.0,
                "root_cause": "unknown",
                "action": "rebalance",
                "evidence": [{"balance": {"shares": [6, 2], "old_shares": [4, 4]}}],
            },
        ],
    }
    data = plot_timeline(report, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0 and len(data.shares) == 2
