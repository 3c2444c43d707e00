"""Recovery without stopping the job: ``trainguard run`` restarting every rank (restart) against
``trainguard run --replica-groups 2`` (groups2, and --groups3), one fault schedule, same model.

    python benchmarks/bench_no_restart.py                 # a table
    python benchmarks/bench_no_restart.py --json          # the figures as JSON
    python benchmarks/bench_no_restart.py --repeats 3 --groups3

Every run trains examples/train_ft.py (torchft's Manager and DDP, the Guard) for ``--steps``
steps on CPU/gloo, 2 ranks in all: one group of 2 ranks (restart) or 2 groups of 1 rank (groups2).
The fault schedule, in the failing group: SIGKILL a rank at steps 60 and 140, SIGSTOP it at 220
(hang; the group's hang timeout is 4 s, torchft's collective timeout 10 s). Each mode also runs
without faults, interleaved (restart clean, groups2 clean, restart faulty, groups2 faulty, ...).

ETTR here = (useful work per second of training, faulty) / (the same, fault-free), where useful
work counts each committed step once per group that committed it (a step committed by 1 of 2
groups is half a step) and the seconds run from the first committed step to the last, so start-up,
the same in both, is left out. Keys: ettr_restart, ettr_groups2 (ettr_groups3), ratio_vs_restart
= ettr_groups2 / ettr_restart, healthy_group_pause_s (the longest gap between the healthy group's
commits in a faulty run, and the same in a fault-free one as its baseline), steps_lost_per_failure
(steps the healthy group discarded per fault; restart: steps redone per fault), heal_s (fault to the
failed group's first commit beside its peer; restart: fault to the job's first commit after it),
python_import_s (``import torch, torchft, trainguard.torch.ft`` in a fresh interpreter: the part of
a heal that warm standbys save). Mean and 95% CI over the repeats. torchrun --max-restarts is not
run: without a hang timeout it never recovers from the SIGSTOP in the schedule.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from paired import mean_ci
from targets import Target, finish

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ft.py"
FAULT_STEPS = (("kill", 60), ("kill", 140), ("stop", 220))


def plan(groups: int) -> str:
    where = "group = 1\nrank = 0\n" if groups > 1 else "rank = 1\n"
    return "".join(f'[[fault]]\nkind = "{k}"\n{where}step = {s}\n\n' for k, s in FAULT_STEPS)


def run(mode: str, faulty: bool, steps: int, work: Path) -> dict[str, Any]:
    groups = {"restart": 1, "groups2": 2, "groups3": 3}[mode]
    work.mkdir(parents=True)
    argv = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--no-tee", "--no-preflight"]
    argv += ["--db", str(work / "tg.db"), "--runs-dir", str(work / "runs"), "--json", str(work / "r.json")]
    argv += ["--hang-timeout-floor", "4", "--backoff-base", "0.1", "--max-restarts", "10"]
    env = None
    lighthouse = None
    if groups > 1:
        argv += ["--replica-groups", str(groups), "--nproc-per-node", "1"]
    else:  # one group of 2 ranks: the bench hosts its Lighthouse
        import os

        from trainguard.supervisor.lighthouse import Lighthouse, LighthouseConfig

        lighthouse = Lighthouse(LighthouseConfig(), work / "lighthouse.log")
        lighthouse.start()
        env = {**os.environ, "TORCHFT_LIGHTHOUSE": lighthouse.address, "TORCHFT_TIMEOUT_SEC": "10"}
        argv += ["--nproc-per-node", "2"]
    if faulty:
        (work / "plan.toml").write_text(plan(groups))
        argv += ["--chaos", str(work / "plan.toml")]
    argv += ["--", sys.executable, str(EXAMPLE), "--steps", str(steps), "--step-delay", "0.05"]
    argv += ["--checkpoint-dir", str(work / "ckpt"), "--metrics", str(work / "m{group}.jsonl")]
    started = time.time()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, cwd=work)
    finally:
        if lighthouse is not None:
            lighthouse.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads((work / "r.json").read_text())
    lines = [
        json.loads(x) for g in range(groups) for x in (work / f"m{g}.jsonl").read_text().splitlines() if x
    ]
    return {
        "mode": mode,
        "faulty": faulty,
        "groups": groups,
        "started": started,
        "result": result,
        "lines": lines,
    }


def figures(run: dict[str, Any]) -> dict[str, Any]:
    lines, groups = run["lines"], run["groups"]
    commits = [x for x in lines if x.get("ok")]
    done = {(x["group"], x["step"]) for x in commits}
    times = [x["t"] for x in commits]
    span = max(times) - min(times)
    out: dict[str, Any] = {"rate": len(done) / groups / span, "span_s": span}
    healthy = sorted(x["t"] for x in commits if x["group"] == 0)
    out["pause_s"] = max(b - a for a, b in itertools.pairwise(healthy))
    out["discarded"] = sum(1 for x in lines if x.get("group") == 0 and x.get("ok") is False)
    if not run["faulty"]:
        return out
    injected = _injected(run)
    heals = []
    for t in injected:
        if groups > 1:  # the failed group's first commit beside a peer after the fault
            after = [x["t"] for x in commits if x["group"] == 1 and x["t"] > t and x["groups"] > 1]
        else:
            after = [x["t"] for x in commits if x["t"] > t + 0.5]
        if after:
            heals.append(after[0] - t)
    out["heal_s"] = statistics.mean(heals) if heals else None
    if groups == 1:
        redone = [r.get("steps_redone") or 0 for r in run["result"].get("recoveries", [])]
        out["lost_per_failure"] = sum(redone) / max(1, len(injected))
    else:
        out["lost_per_failure"] = out["discarded"] / max(1, len(injected))
    return out


def _injected(run: dict[str, Any]) -> list[float]:
    result = run["result"]
    if run["groups"] == 1:
        return [i["time"] for i in result.get("injected", [])]
    return [i["time"] for g in result["groups"] for r in g["runs"] for i in r.get("injected", [])]


def import_time(repeats: int = 3) -> float:
    code = "import torch, torchft, trainguard.torch.ft"
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def ci(values: list[float]) -> dict[str, float]:
    """The mean and the half-width of paired.mean_ci's t-interval (Student's t: with 2 repeats
    the interval is 6.5 times a normal one); NaN half-width with one repeat."""
    est = mean_ci(values)
    half = (est.ci95[1] - est.ci95[0]) / 2 if est.ci95 is not None else float("nan")
    return {"mean": round(est.value, 3), "ci95": round(half, 3), "n": est.repeats}


# On the means (the CIs are in the output beside them): the targets for this MTBF.
TARGETS = (
    Target("ratio_vs_restart_mean", ">=", 1.1),
    Target("healthy_group_pause_s_mean", "<=", 2.0),
    Target("steps_lost_per_failure_mean", "<=", 1.0),
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--groups3", action="store_true", help="also --replica-groups 3")
    p.add_argument("--plot", metavar="PATH.png", help="draw the last faulty groups2 run, one line per group")
    args = p.parse_args()
    modes = ["restart", "groups2"] + (["groups3"] if args.groups3 else [])
    per: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for _ in range(args.repeats):
            clean: dict[str, dict[str, Any]] = {}
            for faulty in (False, True):
                for mode in modes:  # interleaved: A B A B
                    n += 1
                    r = run(mode, faulty, args.steps, Path(tmp) / f"run{n}")
                    f = figures(r)
                    if args.plot and faulty and mode == "groups2":
                        from trainguard.incidents.groups_plot import plot_groups

                        plot_groups(r["result"], args.plot)
                    if not faulty:
                        clean[mode] = f
                        per[mode].setdefault("pause_clean_s", []).append(f["pause_s"])
                        continue
                    per[mode].setdefault("ettr", []).append(f["rate"] / clean[mode]["rate"])
                    per[mode].setdefault("pause_s", []).append(f["pause_s"])
                    per[mode].setdefault("lost_per_failure", []).append(f["lost_per_failure"])
                    if f["heal_s"] is not None:
                        per[mode].setdefault("heal_s", []).append(f["heal_s"])
    out: dict[str, Any] = {"machine": "CPU, gloo; shared and loaded", "steps": args.steps}
    for mode in modes:
        out[f"ettr_{mode}"] = ci(per[mode]["ettr"])
    ratios = [g / r for g, r in zip(per["groups2"]["ettr"], per["restart"]["ettr"], strict=True)]
    out["ratio_vs_restart"] = ci(ratios)
    out["healthy_group_pause_s"] = ci(per["groups2"]["pause_s"])
    out["healthy_group_pause_clean_s"] = ci(per["groups2"]["pause_clean_s"])
    out["steps_lost_per_failure"] = ci(per["groups2"]["lost_per_failure"])
    out["steps_redone_per_failure_restart"] = ci(per["restart"]["lost_per_failure"])
    out["heal_s"] = ci(per["groups2"].get("heal_s", [math.nan]))
    out["restart_recovery_s"] = ci(per["restart"].get("heal_s", [math.nan]))
    out["python_import_s"] = round(import_time(), 3)
    for key in ("ratio_vs_restart", "healthy_group_pause_s", "steps_lost_per_failure"):
        out[f"{key}_mean"] = out[key]["mean"]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            print(f"{key:36} {value}")
    return finish("bench_no_restart", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
