"""benchmarks/nr_figures.py and the pure parts of bench_no_restart.py: the clock runs from launch
to exit, every fault is paid for, one reference rate for every arm; and the plain DDP baseline
trains train_ft.py's batches without importing trainguard."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from bench_no_restart import ARMS, command, schedule, summarize
from nr_figures import Run, figures, heal, pause, rate, redone, useful

BENCH = Path(__file__).parents[1] / "benchmarks"


def groups_run(faults: list[tuple[str, float]], exited: float = 100.0) -> Run:
    """2 groups from t=0: group 0 commits a step each second from t=1 to 99 (a 3 s hole after
    t=50); group 1 beside it until t=20, back at t=24 (a kill) and never again after t=80."""
    lines = []
    for s in range(1, 100):
        if 50 < s < 54:
            lines.append({"t": float(s), "group": 0, "step": s, "ok": False, "groups": 1})
            continue
        lines.append({"t": float(s), "group": 0, "step": s, "ok": True, "groups": 2 if s <= 80 else 1})
        if s <= 20 or 24 <= s <= 80:
            lines.append({"t": float(s), "group": 1, "step": s, "ok": True, "groups": 2})
    return Run("groups2", 2, 0.0, exited, lines, tuple(faults))


def test_a_fault_that_never_healed_is_paid_to_the_exit():
    run = groups_run([("kill", 20.5), ("stop_allreduce", 80.5)])
    assert heal(run, 20.5) == (3.5, True)
    assert heal(run, 80.5) == (19.5, False)  # the exit at 100, not dropped
    f = figures(run, ref_rate=1.0)
    assert f["heal_s"] == [3.5, 19.5]
    assert f["unhealed"] == 1
    assert f["wall_s"] == 100.0


def test_the_clock_runs_from_launch_to_exit():
    # Group 1 missed steps 21-23 and 81-99 and group 0 discarded 51-53: (96 + 96 - 19 - 3) / 2
    run = groups_run([])
    assert useful(run) == (96 + 96 - 19 - 3) / 2
    late_exit = Run("groups2", 2, 0.0, 200.0, run.lines)
    assert rate(late_exit) == pytest.approx(rate(run) / 2)  # a slow exit is inside the clock


def test_every_arm_is_divided_by_the_same_reference():
    ref = Run("ddp", 1, 0.0, 50.0, [{"t": float(s), "step": s, "pid": 7} for s in range(100)])
    slower = Run("groups2_clean", 2, 0.0, 100.0, [
        {"t": float(s), "group": g, "step": s, "ok": True, "groups": 2} for s in range(100) for g in (0, 1)
    ])  # fmt: skip
    assert figures(slower, rate(ref))["ettr"] == pytest.approx(0.5)  # per-step cost shows


def test_pauses_are_per_fault_kind():
    run = groups_run([("kill", 20.5), ("stop_between", 30.5), ("stop_allreduce", 51.5)])
    f = figures(run, ref_rate=1.0)
    assert f["pause_kill_s"] == [1.0]
    assert f["pause_stop_between_s"] == [1.0]
    assert f["pause_stop_allreduce_s"] == [4.0]  # 50 -> 54: the three discarded steps
    assert pause(Run("g", 2, 0.0, 9.0, []), 1.0) == 9.0  # never committed: the whole run
    assert f["lost_per_failure"] == 1.0  # 3 discarded over 3 faults


def test_a_restart_redoes_the_steps_since_its_snapshot_and_heals_at_its_first_step():
    old = [{"t": float(s), "step": s, "pid": 1} for s in range(60)]
    new = [{"t": 20.0 + s, "step": s, "pid": 2} for s in range(50, 100)]  # from t=70
    run = Run("restart", 1, 0.0, 200.0, old + new, (("kill", 59.5),))
    assert redone(run, 59.5) == 10
    assert heal(run, 59.5) == (10.5, True)
    assert useful(run) == 100.0  # a redone step counts once
    f = figures(run, ref_rate=1.0)
    assert f["lost_per_failure"] == 10.0
    assert f["kill_heal_s"] == [10.5]


def test_the_schedule_ends_with_a_stop_inside_the_all_reduce_late_in_the_run():
    assert schedule(300) == [("kill", 60), ("kill", 141), ("stop_between", 180), ("stop_allreduce", 225)]
    argv = command("groups2", 300, 0.05, Path("/w"))
    assert argv[argv.index("--stop-in-allreduce") + 1] == "225"
    assert argv[argv.index("--stop-between") + 1] == "180"


def test_the_baselines_run_a_plain_ddp_script_without_trainguard():
    for arm in ("torchrun", "restart"):
        argv = command(arm, 300, 0.05, Path("/w"))
        assert str(BENCH / "nr_ddp.py") in argv
    assert "trainguard" not in " ".join(command("torchrun", 300, 0.05, Path("/w")))
    tree = ast.parse((BENCH / "nr_ddp.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported and not [m for m in imported if m.startswith("trainguard")]


def test_the_plain_job_trains_the_replica_groups_batches():
    torch = pytest.importorskip("torch")

    def load(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    plain = load("nr_ddp", BENCH / "nr_ddp.py")
    example = load("train_ft", BENCH.parent / "examples" / "train_ft.py")
    for step, group in ((0, 0), (7, 1), (299, 1)):
        for a, b in zip(plain.batch(step, group, 0), example.batch(step, group, 0), strict=True):
            assert torch.equal(a, b)


def test_the_summary_feeds_simulate_from_no_restart(tmp_path):
    from trainguard.cli.simulate_groups import no_restart_costs

    plain = [{"t": float(s), "step": s, "pid": 1} for s in range(100)]
    restarted = Run("restart", 1, 0.0, 130.0, [*plain[:60], *(
        {"t": 20.0 + s, "step": s, "pid": 2} for s in range(50, 100)
    )], (("kill", 59.5),))  # fmt: skip
    kinds = [("kill", 20.5), ("kill", 30.5), ("stop_between", 40.5), ("stop_allreduce", 80.5)]
    one = {
        "ddp": Run("ddp", 1, 0.0, 100.0, plain),
        "groups2_clean": groups_run([]),
        "torchrun": restarted,
        "restart": restarted,
        "groups2": groups_run(kinds),
    }
    out = summarize({a: [one[a], one[a]] for a in ARMS}, {})
    assert out["unhealed_groups2"] == 2  # the stop at 80.5, in both rounds
    assert out["ratio_vs_restart"]["mean"] == pytest.approx((170 / 2 / 100) / (100 / 130))
    assert out["ettr_groups2"]["mean"] == pytest.approx(170 / 2 / 100)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(out))
    costs = no_restart_costs(str(path), restart_s=60.0, step_s=1.0)
    assert costs["restart_s"] == pytest.approx(60 + 10.5)
