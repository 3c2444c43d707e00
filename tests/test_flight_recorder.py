"""Culprit ranks from torch flight-recorder dumps (`incidents.flight`, `logs explain`).

The dumps under tests/data/flight/ were recorded with torch's own recorder on gloo jobs
(`tests/record_flight.py`, torch 2.13): every rank answered a dump request through torch's
debug-info pipe, as the supervisor asks on a hang; a rank holding the GIL or killed left none.
``runhang2`` holds the two dumps of `trainguard run`'s chaos hang (tests/test_supervisor.py: rank 1
blocks before its next collective) as the Guard wrote them, with gloo's own nameless pg_config.
``expected.json`` holds the ranks the faults were put on (``late``: those only made late); the
analysis never reads it.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.incidents.flight import FlightDump, dump_files, entry, judge

pytest.importorskip("torch")
from trainguard.torch.flight_recorder import load_dumps, torch_matcher

DATA = Path(__file__).parent / "data" / "flight"
SCENARIOS = sorted(p.name for p in DATA.iterdir() if p.is_dir())
SETS = {
    name: json.loads((DATA / name / "expected.json").read_text()).get("set", "design") for name in SCENARIOS
}
DESIGN = [name for name in SCENARIOS if SETS[name] == "design"]
SCORE = [name for name in SCENARIOS if SETS[name] == "score"]


def _expected(name: str, key: str = "culprits") -> set[int]:
    return set(json.loads((DATA / name / "expected.json").read_text())[key])


@pytest.mark.parametrize("name", DESIGN)
def test_recorded_dumps_name_every_culprit_and_no_healthy_rank(name: str) -> None:
    """The design set (the jobs the analysis was written against): exact, both directions."""
    verdict = judge(load_dumps(DATA / name), torch_matcher())
    world = json.loads((DATA / name / "expected.json").read_text())["world"]
    for rank in range(world):  # both directions: each faulted rank named, every other one not
        assert (rank in verdict.ranks) == (rank in _expected(name)), (rank, verdict.as_json())
    assert set(verdict.late) == _expected(name, "late"), verdict.as_json()
    assert not verdict.suspects, verdict.as_json()  # every timing here is bounded
    assert set(verdict.evidence) == set(verdict.ranks)
    assert not set(verdict.victims) & set(verdict.ranks)


def test_sixteen_rank_job_with_two_faults_names_both_through_logs_explain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["logs", "explain", str(DATA / "multi16"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    root = out["root_cause"]
    assert sorted(root["ranks"]) == [5, 10, 14]
    # what the stall waits on decides the category; rank 14 came 4 s late and joined in the end
    assert root["source"] == "flight_recorder" and root["category"] == "rank_unresponsive"
    assert set(root["evidence"]) == {"5", "10", "14"}
    [late] = out["flight_recorder"]["evidence"]["14"]
    assert late["kind"] == "late" and late["op"] == "all_reduce #3" and "dp" in late["group"]
    assert "4.0 s after its peers" in late["text"]
    assert out["flight_recorder"]["late"] == [14] and 14 not in out["flight_recorder"]["victims"]


def test_explain_prints_the_culprits_group_and_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "explain", str(DATA / "size4")]) == 0
    out = capsys.readouterr().out
    assert "culprit rank(s) 3" in out and "default_pg" in out and "SIZE_OR_SYNTAX_MISMATCH" in out


def test_json_dumps_read_like_pickled_ones() -> None:
    dumps = load_dumps(DATA / "stall4")
    assert (DATA / "stall4" / "nccl_trace_rank_0").read_bytes()[:1] == b"{"
    assert len(dumps) == 4 and all(d.groups for d in dumps)


def test_a_dump_from_every_rank_of_a_healthy_job_names_no_one(tmp_path: Path) -> None:
    """The self-check the other way: drop the culprit's pending state and nothing must stand out."""
    dumps = []
    for path in sorted((DATA / "size4").glob("nccl_trace_rank_*")):
        data = pickle.loads(path.read_bytes())
        data["entries"] = [e for e in data["entries"] if e["collective_seq_id"] < 3]
        dumps.append(FlightDump.from_torch(int(path.name.rsplit("_", 1)[1]), str(path), data))
    assert judge(dumps, torch_matcher()).ranks == ()


def test_removing_a_victims_dump_does_not_make_it_a_culprit_when_it_is_not_waited_on(tmp_path: Path) -> None:
    shutil.copytree(DATA / "stall4", tmp_path / "d")
    verdict = judge(load_dumps(tmp_path / "d"), torch_matcher())
    assert verdict.ranks == (2,)
    (
        tmp_path / "d" / "nccl_trace_rank_2"
    ).unlink()  # the culprit's own dump lost: it still is the one waited on
    assert judge(load_dumps(tmp_path / "d"), torch_matcher()).ranks == (2,)


def test_dump_files_find_the_common_prefix_and_skip_logs(tmp_path: Path) -> None:
    for f in (DATA / "gil8").glob("nccl_trace_rank_*"):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "train_rank3.log").write_text("step 1\n")
    (tmp_path / "notes2").write_text("hello\n")
    found = dump_files(tmp_path)
    assert sorted(found) == [0, 1, 2, 3, 4, 6, 7]  # rank 5 held the GIL: no dump


G = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("pp", (0, 1))}


def test_p2p_recv_waiting_on_a_peer_that_never_sent_names_the_peer() -> None:
    d0 = FlightDump(
        0,
        "r0",
        G,
        [entry("0", 1, "all_reduce"), entry("1", 0, "recv 0<-1", done=False, p2p_seq_id=1, record_id=5)],
    )
    d1 = FlightDump(1, "r1", G, [entry("0", 1, "all_reduce")])
    d2 = FlightDump(2, "r2", G, [entry("0", 1, "all_reduce")])
    d3 = FlightDump(3, "r3", G, [entry("0", 1, "all_reduce")])
    verdict = judge([d0, d1, d2, d3])
    assert verdict.ranks == (1,) and verdict.evidence[1][0].kind == "not_issued"


def test_p2p_peer_posting_its_send_is_no_culprit() -> None:
    pp = {"1": ("pp", (0, 1))}
    d0 = FlightDump(0, "r0", pp, [entry("1", 0, "recv 0<-1", done=False, p2p_seq_id=1)])
    d1 = FlightDump(1, "r1", pp, [entry("1", 0, "send 1->0", done=False, p2p_seq_id=1)])
    assert judge([d0, d1]).ranks == ()


def test_cross_group_dependency_is_followed_to_the_rank_outside_communication() -> None:
    """dp waits on rank 1, rank 1 waits in tp on rank 3, rank 3 is busy elsewhere: only 3."""
    groups = {"0": ("dp", (0, 1)), "1": ("tp", (1, 3))}
    d0 = FlightDump(0, "r0", groups, [entry("0", 1, "all_reduce"), entry("0", 2, "all_reduce", done=False)])
    d1 = FlightDump(
        1, "r1", groups, [entry("0", 1, "all_reduce"), entry("1", 1, "all_reduce", done=False, record_id=9)]
    )
    d3 = FlightDump(3, "r3", groups, [])
    verdict = judge([d0, d1, d3])
    assert verdict.ranks == (3,) and 1 in verdict.victims and 0 in verdict.victims


def test_two_ranks_waiting_on_each_other_name_no_one_and_both_are_suspects() -> None:
    """Rank 0 entered group a first, rank 1 group b: either may have the order wrong. Naming both
    would exclude a healthy GPU; the answer is unknown, with both as suspects."""
    groups = {"0": ("a", (0, 1)), "1": ("b", (0, 1))}
    d0 = FlightDump(0, "r0", groups, [entry("0", 1, "all_reduce", done=False)])
    d1 = FlightDump(1, "r1", groups, [entry("1", 1, "all_reduce", done=False)])
    verdict = judge([d0, d1])
    assert verdict.ranks == () and verdict.category == "unknown"
    assert sorted(verdict.suspects) == [0, 1] and verdict.suspects[0][0].kind == "collective_order_deadlock"


def test_in_a_cycle_the_rank_that_left_the_others_order_is_named() -> None:
    """Four ranks; rank 3 skips its tp all-reduce #2 and goes on to the default group's #2: its tp
    peer waits in tp, the others wait in the default group for that peer. Every rank waits on
    another; rank 3 alone issued default #2 right after default #1, where three issued tp #2."""
    g = {"0": ("default_pg", (0, 1, 2, 3)), "1": ("tp", (0, 1)), "2": ("tp", (2, 3))}

    def steps(tp: str, n: int, rank: int) -> list[dict]:
        out = []
        for k in range(1, n + 1):
            out += [
                entry(tp, k, "all_reduce", desc="tp", record_id=10 * k),
                entry("0", k, "all_reduce", record_id=10 * k + 1),
            ]
        return out

    healthy = {r: steps("1" if r < 2 else "2", 1, r) for r in range(4)}
    dumps = [
        FlightDump(0, "r0", g, [*healthy[0], entry("1", 2, "all_reduce", desc="tp", done=False, record_id=20)]),
        FlightDump(1, "r1", g, [*healthy[1], entry("1", 2, "all_reduce", desc="tp", record_id=20),
                                entry("0", 2, "all_reduce", done=False, record_id=21)]),
        FlightDump(2, "r2", g, [*healthy[2], entry("2", 2, "all_reduce", desc="tp", done=False, record_id=20)]),
        FlightDump(3, "r3", g, [*healthy[3], entry("0", 2, "all_reduce", done=False, record_id=21)]),
    ]  # fmt: skip
    verdict = judge(dumps)
    assert verdict.ranks == (3,) and verdict.category == "collective_desync", verdict.as_json()
    assert (
        "issued default_pg #2 after default_pg #1, where 3 of 4 ranks issued tp #2 next"
        in verdict.evidence[3][0].text
    )
    assert not verdict.suspects


def test_every_rank_inside_the_collective_names_no_one() -> None:
    d = [FlightDump(r, f"r{r}", G, [entry("0", 1, "all_reduce", done=False)]) for r in range(4)]
    verdict = judge(d)
    assert verdict.ranks == () and verdict.category == "none" and verdict.notes


def test_nccl_rank_that_never_started_the_kernel_is_named() -> None:
    d = [
        FlightDump(r, f"r{r}", G, [entry("0", 1, "all_reduce", done=False, state="started")])
        for r in range(3)
    ]
    d.append(FlightDump(3, "r3", G, [entry("0", 1, "all_reduce", done=False)]))
    for x in d[:3]:
        x.entries[0]["state"] = "started"
    verdict = judge(d)
    assert verdict.ranks == (3,) and verdict.category == "gpu_not_progressing"


def test_a_size_tie_names_no_one_and_both_sides_are_suspects() -> None:
    groups = {"0": ("default_pg", (0, 1))}
    d0 = FlightDump(0, "r0", groups, [entry("0", 1, "all_reduce", sizes=((4,),))])
    d1 = FlightDump(1, "r1", groups, [entry("0", 1, "all_reduce", sizes=((8,),))])
    verdict = judge([d0, d1], torch_matcher())
    assert verdict.ranks == () and verdict.category == "unknown"
    assert sorted(verdict.suspects) == [0, 1] and verdict.suspects[1][0].kind == "collective_mismatch"


def test_raw_gloo_dump_without_pg_config_is_still_judged() -> None:
    dumps = []
    for path in sorted((DATA / "stall4").glob("nccl_trace_rank_*")):
        data = json.loads(path.read_text())
        data["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}  # what gloo itself records
        dumps.append(FlightDump.from_torch(int(path.name.rsplit("_", 1)[1]), str(path), data))
    verdict = judge(dumps, torch_matcher())
    assert 2 in verdict.ranks and verdict.notes


def test_supervisor_judges_the_runs_dumps_and_keeps_the_judgement(tmp_path: Path) -> None:
    from trainguard.supervisor.hang import FR_PREFIX, analyze, flight_dumps

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for f in (DATA / "gil8").glob("nccl_trace_rank_*"):
        shutil.copy(f, dumps / (FR_PREFIX + f.name.rsplit("_", 1)[1]))
    verdict, kept = flight_dumps(tmp_path, [], list(range(8)), wait_s=0.1)
    assert verdict is not None and verdict.ranks == (5,)
    assert kept is not None and json.loads(kept.read_text())["ranks"] == [5]
    report = analyze(list(range(8)), {}, {-1: [kept]}, {}, verdict)
    assert report.method == "flight_recorder" and report.laggards == (5,) and str(kept) in report.dumps


def test_dump_request_goes_through_the_ranks_pipe(tmp_path: Path) -> None:
    import os
    import threading

    from trainguard.supervisor.hang import request_flight_dumps

    prefix = str(tmp_path / "fr_rank_")
    os.mkfifo(prefix + "0.pipe")

    def rank0() -> None:  # what torch's monitor thread (or our gloo writer) does
        with open(prefix + "0.pipe", "rb") as fh:
            fh.read(1)
        Path(prefix + "0").write_bytes(b"\x80dump")

    t = threading.Thread(target=rank0)
    t.start()
    got = request_flight_dumps(prefix, [0, 1], wait_s=30)  # rank 1 has no pipe: not asked
    t.join(30)
    assert got == {0: Path(prefix + "0")}


@pytest.mark.slow
def test_a_freshly_recorded_gloo_job_names_the_killed_rank_and_the_late_one(tmp_path: Path) -> None:
    from record_flight import record  # type: ignore[import-not-found]

    out = record("kill4", tmp_path)
    verdict = judge(load_dumps(out), torch_matcher())
    assert verdict.causes == (1,) and verdict.late == (3,), verdict.as_json()  # rank 3 was 4 s late


def test_an_earlier_attempts_dumps_are_not_judged_again(tmp_path: Path) -> None:
    import os
    import time

    from trainguard.supervisor.hang import FR_PREFIX, flight_dumps

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    old = time.time() - 3600
    for f in (DATA / "gil8").glob("nccl_trace_rank_*"):
        target = dumps / (FR_PREFIX + f.name.rsplit("_", 1)[1])
        shutil.copy(f, target)
        os.utime(target, (old, old))
    assert flight_dumps(tmp_path, [], list(range(8)), wait_s=0.1) == (None, None)


def _late8(shift_s: float | None = None, drop: int | None = None) -> list[FlightDump]:
    """late8's dumps (rank 6 entered its dp all-reduce #3 4 s late, which held rank 2 as long), with
    rank 6 made ``shift_s`` late instead (every entry from its late one on moves earlier), or rank
    ``drop``'s dump left out."""

    def entries(rank: int) -> list[dict]:
        return pickle.loads((DATA / "late8" / f"nccl_trace_rank_{rank}").read_bytes())["entries"]

    assert entries(6)[7]["process_group"][1] == entries(2)[7]["process_group"][1] == "dp"
    was = entries(6)[7]["time_created_ns"]  # rank 6's dp #3
    delta = 0 if shift_s is None else was - entries(2)[7]["time_created_ns"] - int(shift_s * 1e9)
    dumps = []
    for path in sorted((DATA / "late8").glob("nccl_trace_rank_*")):
        rank = int(path.name.rsplit("_", 1)[1])
        data = pickle.loads(path.read_bytes())
        for e in data["entries"]:
            if e["time_created_ns"] >= was:
                e["time_created_ns"] -= delta
        if rank != drop:
            dumps.append(FlightDump.from_torch(rank, str(path), data))
    return dumps


def test_a_rank_late_alone_is_named_late_and_the_ranks_it_delayed_are_not() -> None:
    verdict = judge(_late8(), torch_matcher())
    assert verdict.ranks == (6,) and verdict.late == (6,) and verdict.causes == ()
    assert verdict.category == "rank_late" and verdict.evidence[6][0].kind == "late"
    # rank 2 waited 4 s in dp with rank 6, so it entered the default group's #3 4 s after the
    # others too: it is not late, its wait is explained by rank 6's entry


def test_a_rank_on_time_or_barely_late_is_not_named() -> None:
    """The self-check the other way: the same job with rank 6's entry moved back."""
    assert judge(_late8(shift_s=0.0), torch_matcher()).ranks == ()
    assert judge(_late8(shift_s=0.5), torch_matcher()).ranks == ()  # under late.LATE_S
    assert judge(_late8(shift_s=1.5), torch_matcher()).late == (6,)


def test_without_the_late_ranks_dump_the_rank_that_waited_on_it_is_a_suspect_not_a_culprit() -> None:
    """Rank 2 entered the default group's #3 4 s after the others; rank 6, with whom it shared the
    dp all-reduce before, left no dump: late on its own or held by rank 6 cannot be told."""
    verdict = judge(_late8(drop=6), torch_matcher(), world=range(8))
    assert verdict.ranks == (6,) and verdict.evidence[6][0].kind == "no_dump"
    assert list(verdict.suspects) == [2] and "rank(s) 6 left no entry" in verdict.suspects[2][0].text
    assert verdict.as_json()["suspects"]["2"][0]["kind"] == "late"


def test_a_hang_under_trainguard_run_names_the_rank_missing_from_the_next_collective() -> None:
    """Rank 0 waits in all-reduce #22; rank 1 completed #21 and issued nothing since. gloo's own
    pg_config lists the default group without its name, so its members come from the entries."""
    verdict = judge(load_dumps(DATA / "runhang2"), torch_matcher(), world=[0, 1])
    assert verdict.ranks == (1,) and verdict.victims == (0,)
    assert verdict.category == "rank_stalled_outside_collective"
    [ev] = verdict.evidence[1]
    assert ev.kind == "not_issued" and ev.op == "all_reduce #22" and "outside communication" in ev.text


def test_a_hang_report_does_not_blame_a_rank_that_only_came_late() -> None:
    from trainguard.supervisor.hang import analyze

    late = judge(_late8(), torch_matcher())
    assert analyze(list(range(8)), {}, {}, {}, late).laggards == ()
    hung = judge(load_dumps(DATA / "multi16"), torch_matcher())
    report = analyze(list(range(16)), {}, {}, {}, hung)
    assert report.method == "flight_recorder" and report.laggards == (5, 10)


def test_one_nodes_supervisor_names_its_own_culprits_and_not_the_other_nodes_ranks() -> None:
    """multi16 as two nodes of 8 ranks: each node's supervisor sees only its own ranks' dumps."""
    dumps = load_dumps(DATA / "multi16")
    for here, named in ((range(8), (5,)), (range(8, 16), (10, 14))):
        mine = [d for d in dumps if d.rank in here]
        verdict = judge(mine, torch_matcher(), world=here, here=here)
        assert verdict.ranks == named, verdict.as_json()
        assert len(judge(mine, torch_matcher(), world=here).ranks) > len(named)  # without `here`: all absent


@pytest.mark.parametrize("name", SCORE)
def test_the_score_set_names_every_culprit_and_no_healthy_rank(name: str) -> None:
    """The score set: recorded and set aside before the rules that judge it were changed, and
    only measured (docs/logs.md gives the figures before and after, and torch's analyser's)."""
    verdict = judge(load_dumps(DATA / name), torch_matcher())
    world = json.loads((DATA / name / "expected.json").read_text())["world"]
    assert [r for r in range(world) if (r in verdict.ranks) != (r in _expected(name))] == [], (
        verdict.as_json()
    )


def test_the_scorer_runs_torchs_analyser_on_the_same_dumps() -> None:
    """tools/flight_score.py's other column: torch's analyser names skip4's every waiting rank
    (a healthy rank among them), trainguard the one that skipped."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "flight_score", DATA.parents[2] / "tools" / "flight_score.py"
    )
    assert spec is not None and spec.loader is not None
    scorer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scorer)
    assert scorer.reference(DATA / "size4")["named"] == [3]
    assert scorer.reference(DATA / "skip4")["named"] == [0, 1, 2]
    assert scorer.ours(DATA / "skip4")["named"] == [1]
    [row] = [r for r in scorer.score(DATA, "design") if r["job"] == "skip4"]
    assert row["torch"]["false"] == [0, 2] and row["trainguard"]["false"] == []


def test_explain_says_unknown_with_the_suspects_when_the_dumps_cannot_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two ranks, each waiting in a group the other never entered: logs explain names no rank."""
    config = {
        "0": {"name": "0", "desc": "a", "ranks": "[0, 1]"},
        "1": {"name": "1", "desc": "b", "ranks": "[0, 1]"},
    }
    for rank, pg in ((0, "0"), (1, "1")):
        dump = {"version": "2.10", "pg_config": config, "entries": [entry(pg, 1, "all_reduce", done=False)]}
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    assert main(["logs", "explain", str(tmp_path), "--json"]) == 0
    root = json.loads(capsys.readouterr().out)["root_cause"]
    assert root["ranks"] == [] and root["category"] == "unknown" and root["suspects"] == [0, 1]
    assert root["source"] == "flight_recorder" and set(root["evidence"]) == {"0", "1"}
    assert main(["logs", "explain", str(tmp_path)]) == 0
    assert "unknown: the evidence cannot decide; suspects 0-1" in capsys.readouterr().out
