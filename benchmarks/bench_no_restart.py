"""Recovery without stopping the job: ``torchrun --max-restarts`` (torchrun) and ``trainguard
run`` (restart), each restarting every rank, against ``trainguard run --replica-groups 2``
(groups2, and --groups3), one fault schedule, same model, same steps.

    python benchmarks/bench_no_restart.py                 # a table
    python benchmarks/bench_no_restart.py --json          # the figures as JSON
    python benchmarks/bench_no_restart.py --repeats 3 --groups3
    python benchmarks/bench_no_restart.py --cost-only --repeats 6 --json   # step_cost_vs_ddp alone

Every run trains examples/train_ft.py (torchft's Manager and DDP, the Guard) for ``--steps``
steps on CPU/gloo, 2 ranks in all: one group of 2 ranks (torchrun, restart) or 2 groups of 1 rank
(groups2). The fault schedule, in the failing group: SIGKILL a rank at steps 60 and 140, SIGSTOP
it at 220 (hang; trainguard's hang timeout is 4 s, torchft's collective timeout 10 s). torchrun
has no hang watch: it gets what a careful user sets, the script's process-group timeout
(``--pg-timeout-s 60``, as bench_recovery.py gives it; gloo's default is 30 minutes), which ends
the surviving rank's collective, and torchrun then restarts both (its SIGTERM to the stopped rank
waits its 30 s grace); the bench injects torchrun's faults itself (the same signals, at the same
steps, from rank 0's metrics), and a torchrun run still going after ``--torchrun-cap-s`` is killed
there and what it had not trained is lost (``torchrun_capped_runs`` counts them). Each mode also
runs without faults; the modes are interleaved, the order reversed every other repeat.

ETTR here = (useful work per second of training, faulty) / (the same, fault-free), where useful
work counts each committed step once per group that committed it (a step committed by 1 of 2
groups is half a step) and the seconds run from the first committed step to the last, so start-up,
the same in both, is left out. Keys: ettr_torchrun, ettr_restart, ettr_groups2 (ettr_groups3),
ratio_vs_restart = ettr_groups2 / ettr_restart and ratio_vs_torchrun, per repeat;
healthy_group_pause_s (the longest gap between the healthy group's commits in a faulty run, and
the same in a fault-free one as its baseline); steps_lost_per_failure (steps the healthy group
discarded per fault; torchrun and restart: steps redone per fault); heal_s (fault to the failed
group's first commit beside its peer; torchrun and restart: fault to the job's first commit after
it); kill_heal_s (the first SIGKILL's alone) and its split from the restarted script's start line
(fault -> main(): detection, process start, imports; -> the Manager: process group, Manager,
checkpoint; -> the first commit: quorum, heal, a step), also with ``--no-warm-standby``
(groups2cold: the first kill only, the healthy group training on until the healed one commits
beside it) for what warm standbys save; python_import_s (a fresh interpreter's imports, split
into what a standby imports ahead and the rest). step_cost_vs_ddp: the mean step of
``--replica-groups 2`` over that of a plain DDP job of 2 ranks (benchmarks/train_ddp_baseline.py:
the same model, batches and Guard, torch's DDP), fault-free, no step delay, per repeat; and the
difference in ms (step_overhead_ms). Mean and 95% CI (Student's t) over the repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from paired import mean_ci
from targets import Target, finish

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ft.py"
DDP_BASELINE = ROOT / "benchmarks" / "train_ddp_baseline.py"
FAULT_STEPS = (("kill", 60), ("kill", 140), ("stop", 220))
GROUPS = {"torchrun": 1, "restart": 1, "groups2": 2, "groups3": 3, "groups2cold": 2, "ddp": 1}
PG_TIMEOUT_S = 60.0  # the collective timeout a careful torchrun user sets (as bench_recovery.py)
COST_STEPS = 400  # fault-free, no step delay: the per-step cost of --replica-groups against DDP
COST_WARMUP = 20  # steps left out of a step-cost run's mean (the first quorums, DDP's first buckets)


def plan(groups: int, faults: tuple[tuple[str, int], ...] = FAULT_STEPS) -> str:
    where = "group = 1\nrank = 0\n" if groups > 1 else "rank = 1\n"
    return "".join(f'[[fault]]\nkind = "{k}"\n{where}step = {s}\n\n' for k, s in faults)


def run(
    mode: str, faulty: bool, steps: int, work: Path, *, delay: float = 0.05, cap_s: float = 900.0
) -> dict[str, Any]:
    """One job of ``mode`` (torchrun, restart, groups2, groups3, groups2cold, ddp); faulty: the
    schedule above. torchrun is capped at ``cap_s`` of wall time: what it has not trained by then
    is lost (it is killed there)."""
    groups = GROUPS[mode]
    work.mkdir(parents=True)
    script = DDP_BASELINE if mode == "ddp" else EXAMPLE
    args = [
        str(script),
        "--steps",
        str(steps),
        "--step-delay",
        str(delay),
        "--metrics",
        str(work / "m{group}.jsonl"),
    ]
    if mode != "ddp":
        args += ["--checkpoint-dir", str(work / "ckpt"), "--pg-timeout-s", f"{PG_TIMEOUT_S:g}"]
    env = dict(os.environ)
    lighthouse = None
    if groups == 1 and mode != "ddp":  # one group of 2 ranks: the bench hosts its Lighthouse
        from trainguard.supervisor.replicas.lighthouse import Lighthouse, LighthouseConfig

        lighthouse = Lighthouse(LighthouseConfig(), work / "lighthouse.log")
        lighthouse.start()
        env.update(TORCHFT_LIGHTHOUSE=lighthouse.address, TORCHFT_TIMEOUT_SEC="10")
    if mode == "torchrun":
        # torchrun as a user runs it: no hang watch of its own (the script's --pg-timeout-s ends a
        # collective that waits on a hung rank), and, as in bench_recovery.py, no shared rendezvous
        # store (with it, a restart once failed to reconnect gloo).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        argv += ["--max-restarts", "10", *args]  # torchrun runs the script with this python
    else:
        argv = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--no-tee", "--no-preflight"]
        argv += [
            "--db",
            str(work / "tg.db"),
            "--runs-dir",
            str(work / "runs"),
            "--json",
            str(work / "r.json"),
        ]
        argv += ["--hang-timeout-floor", "4", "--backoff-base", "0.1", "--max-restarts", "10"]
        if groups > 1:
            argv += ["--replica-groups", str(groups), "--nproc-per-node", "1"]
        else:
            argv += ["--nproc-per-node", "2"]
        faults = FAULT_STEPS
        if mode == "groups2cold":  # the first kill only, and the healthy group waits for the heal
            argv += ["--no-warm-standby"]
            faults, args = FAULT_STEPS[:1], [*args, "--all-groups-at-end"]
        if faulty:
            (work / "plan.toml").write_text(plan(groups, faults))
            argv += ["--chaos", str(work / "plan.toml")]
        argv += ["--", sys.executable, *args]
    started = time.time()
    out = open(work / "out.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True
    )
    injected: list[float] = []
    stop = threading.Event()
    injector = None
    if mode == "torchrun" and faulty:
        injector = threading.Thread(
            target=_inject, args=(proc, work / "m0.jsonl", injected, stop), daemon=True
        )
        injector.start()
    capped_at = None
    try:
        proc.wait(timeout=cap_s)
    except subprocess.TimeoutExpired:
        if mode != "torchrun":
            raise RuntimeError(f"{mode} run did not finish in {cap_s:g} s (see {work / 'out.log'})") from None
        capped_at = time.time()
    finally:
        stop.set()
        if injector is not None:
            injector.join()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the job outlives it (a stopped rank)
        proc.wait()
        out.close()
        if lighthouse is not None:
            lighthouse.stop()
    if proc.returncode != 0 and capped_at is None:
        tail = (work / "out.log").read_text()[-2000:]
        raise RuntimeError(f"{mode} run failed ({proc.returncode}): {tail}")
    result = json.loads((work / "r.json").read_text()) if (work / "r.json").exists() else {}
    lines = [
        json.loads(x) for g in range(groups) for x in (work / f"m{g}.jsonl").read_text().splitlines() if x
    ]
    if mode != "torchrun":
        injected = _injected(result, groups)
    return {
        "mode": mode,
        "faulty": faulty,
        "groups": groups,
        "started": started,
        "result": result,
        "lines": lines,
        "injected": injected,
        "capped_at": capped_at,
    }


def _inject(
    proc: subprocess.Popen[bytes], metrics: Path, injected: list[float], stop: threading.Event
) -> None:
    """torchrun's arm: the schedule's faults into local rank 1 (torchrun's child with
    LOCAL_RANK=1), each once, when rank 0's metrics reach its step (what trainguard's chaos
    executor does from the heartbeats)."""
    todo = list(FAULT_STEPS)
    while todo and not stop.wait(0.05):
        try:
            last = [json.loads(x) for x in metrics.read_text().splitlines()[-3:] if x]
        except (OSError, ValueError):
            continue
        steps = [x["step"] for x in last if "step" in x]
        if not steps or steps[-1] < todo[0][1]:
            continue
        pid = _worker(proc.pid, local_rank=1)
        if pid is None:
            continue
        kind, _ = todo.pop(0)
        os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        injected.append(time.time())


def _worker(parent: int, local_rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(entry.name)
    return None


def figures(run: dict[str, Any]) -> dict[str, Any]:
    lines, groups = run["lines"], run["groups"]
    commits = [x for x in lines if x.get("ok")]
    done = {(x["group"], x["step"]) for x in commits}
    times = [x["t"] for x in commits]
    end = run["capped_at"] if run["capped_at"] is not None else max(times)
    span = end - min(times)
    out: dict[str, Any] = {
        "rate": len(done) / groups / span,
        "span_s": span,
        "capped": run["capped_at"] is not None,
    }
    healthy = sorted(x["t"] for x in commits if x["group"] == 0)
    out["pause_s"] = max(b - a for a, b in itertools.pairwise(healthy))
    out["discarded"] = sum(1 for x in lines if x.get("group") == 0 and x.get("ok") is False)
    steady = healthy[COST_WARMUP:]
    out["step_s"] = (steady[-1] - steady[0]) / (len(steady) - 1) if len(steady) > 1 else math.nan
    if not run["faulty"]:
        return out
    injected = run["injected"]
    heals, redone = [], []
    out["kill_heal_s"] = out["heal_split_s"] = None
    for i, t in enumerate(injected):
        if groups > 1:  # the failed group's first commit beside a peer after the fault
            after = [x for x in commits if x["group"] == 1 and x["t"] > t and x["groups"] > 1]
        else:
            after = [x for x in commits if x["t"] > t + 0.5]
        if not after:
            continue
        heals.append(after[0]["t"] - t)
        if groups == 1:  # steps done again: from the step the restart resumed at to the fault's
            before = [x["step"] for x in commits if x["t"] < t]
            redone.append(max(0, (max(before) + 1 if before else 0) - after[0]["step"]))
        if i > 0:
            continue
        # The first SIGKILL's heal (nothing else pending then: a later fault can fire the moment a
        # group heals past its step; no hang detection in it), and its parts from the restarted
        # script's own start line: fault -> its main() (detection, process start, the imports),
        # -> its Manager (process group, Manager, checkpoint), -> its first commit beside a peer
        # (quorum, the heal from a peer, one step).
        out["kill_heal_s"] = heals[-1]
        g = 1 if groups > 1 else 0
        starts = [
            x for x in lines if x.get("event") == "start" and x["group"] == g and t < x["t"] < after[0]["t"]
        ]
        if starts:
            s = starts[-1]
            out["heal_split_s"] = [s["main"] - t, s["t"] - s["main"], after[0]["t"] - s["t"]]
    out["heal_s"] = statistics.mean(heals) if heals else None
    if groups == 1:
        out["lost_per_failure"] = sum(redone) / max(1, len(injected))
    else:
        out["lost_per_failure"] = out["discarded"] / max(1, len(injected))
    return out


def _injected(result: dict[str, Any], groups: int) -> list[float]:
    if groups == 1:
        return [i["time"] for i in result.get("injected", [])]
    return sorted(i["time"] for g in result["groups"] for r in g["runs"] for i in r.get("injected", []))


def import_time(repeats: int = 3) -> dict[str, float]:
    """A fresh interpreter's ``import`` of what train_ft.py needs, split into what a warm standby
    has imported ahead (`StandbyConfig.preload`) and the rest (torchft, trainguard.torch.ft),
    and the interpreter's own start; medians of ``repeats``."""
    from trainguard.supervisor.config import StandbyConfig

    preload = ", ".join(StandbyConfig().preload)
    code = (
        f"import time; t = time.perf_counter(); import {preload}; a = time.perf_counter(); "
        "import torchft, trainguard.torch.ft; print(a - t, time.perf_counter() - a)"
    )
    rows = []
    for _ in range(repeats):
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
        total = time.perf_counter() - t
        pre, rest = (float(v) for v in proc.stdout.split())
        rows.append((total, pre, rest, total - pre - rest))
    keys = ("total", "preloaded_by_standby", "not_preloaded", "interpreter")
    return {k: round(statistics.median(r[i] for r in rows), 3) for i, k in enumerate(keys)}


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


def summarize(
    per: dict[str, dict[str, list[Any]]], modes: list[str], steps: int, repeats: int
) -> dict[str, Any]:
    """The keys from the per-mode lists ``main`` collects (also printed after every repeat, so an
    interrupted run can be summarized: ``summarize(json.loads(line), ...)``)."""
    out: dict[str, Any] = {
        "machine": "CPU, gloo; shared and loaded",
        "steps": steps,
        "repeats": repeats,
    }
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    for mode in modes:
        out[f"ettr_{mode}"] = ci(per[mode]["ettr"])
    ratios = [g / r for g, r in zip(per["groups2"]["ettr"], per["restart"]["ettr"], strict=True)]
    out["ratio_vs_restart"] = ci(ratios)
    if "torchrun" in modes:
        out["ratio_vs_torchrun"] = ci(
            [g / t for g, t in zip(per["groups2"]["ettr"], per["torchrun"]["ettr"], strict=True)]
        )
        out["torchrun_capped_runs"] = sum(per["torchrun"]["capped"])
        out["steps_redone_per_failure_torchrun"] = ci(per["torchrun"]["lost_per_failure"])
        out["torchrun_recovery_s"] = ci(per["torchrun"].get("heal_s", [math.nan]))
        out["torchrun_kill_recovery_s"] = ci(per["torchrun"].get("kill_heal_s", [math.nan]))
    out["healthy_group_pause_s"] = ci(per["groups2"]["pause_s"])
    out["healthy_group_pause_clean_s"] = ci(per["groups2"]["pause_clean_s"])
    out["steps_lost_per_failure"] = ci(per["groups2"]["lost_per_failure"])
    out["steps_redone_per_failure_restart"] = ci(per["restart"]["lost_per_failure"])
    out["heal_s"] = ci(per["groups2"].get("heal_s", [math.nan]))
    out["kill_heal_s"] = ci(per["groups2"].get("kill_heal_s", [math.nan]))
    out["kill_heal_s_cold"] = ci(per["groups2cold"].get("kill_heal_s", [math.nan]))
    for mode in ("groups2", "groups2cold", "restart"):
        parts = per[mode].get("heal_split_s", [])
        if parts:
            out[f"kill_heal_split_{mode}"] = {
                k: ci([p[i] for p in parts])
                for i, k in enumerate(("fault_to_main_s", "main_to_manager_s", "manager_to_commit_s"))
            }
    out["restart_recovery_s"] = ci(per["restart"].get("heal_s", [math.nan]))
    return {**out, **step_cost(per["cost"])}


def step_cost(cost: dict[str, list[float]]) -> dict[str, Any]:
    """--replica-groups 2's mean step against plain DDP's, per repeat: their ratio and difference."""
    ddp, grp = cost["ddp_step_s"], cost["groups2_step_s"]
    return {
        "step_cost_vs_ddp": ci([g / d for g, d in zip(grp, ddp, strict=True)]),
        "step_overhead_ms": ci([(g - d) * 1000 for g, d in zip(grp, ddp, strict=True)]),
        "ddp_step_ms": ci([d * 1000 for d in ddp]),
        "groups2_step_ms": ci([g * 1000 for g in grp]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--groups3", action="store_true", help="also --replica-groups 3")
    p.add_argument("--no-torchrun", action="store_true", help="leave out torchrun --max-restarts")
    p.add_argument("--torchrun-cap-s", type=float, default=600.0, help="torchrun's wall-clock cap per run")
    p.add_argument(
        "--cost-only",
        action="store_true",
        help="only step_cost_vs_ddp (and python_import_s): --repeats interleaved pairs of fault-free runs",
    )
    p.add_argument("--plot", metavar="PATH.png", help="draw the last faulty groups2 run, one line per group")
    args = p.parse_args()
    modes = (["torchrun"] if not args.no_torchrun else []) + ["restart", "groups2"]
    modes += ["groups3"] if args.groups3 else []
    per: dict[str, dict[str, list[Any]]] = {m: {} for m in [*modes, "groups2cold", "cost"]}
    with tempfile.TemporaryDirectory() as tmp:
        n = 0

        def one(mode: str, faulty: bool, **kw: Any) -> dict[str, Any]:
            nonlocal n
            n += 1
            cap = args.torchrun_cap_s if mode == "torchrun" else 900.0
            r = run(mode, faulty, kw.pop("steps", args.steps), Path(tmp) / f"run{n}", cap_s=cap, **kw)
            return {**figures(r), "_run": r}

        for rep in range(args.repeats):
            order = modes if rep % 2 == 0 else modes[::-1]  # A B, B A: drifts of the load hit both
            clean: dict[str, dict[str, Any]] = {}
            for mode in [] if args.cost_only else order:
                clean[mode] = one(mode, False)
                per[mode].setdefault("pause_clean_s", []).append(clean[mode]["pause_s"])
            # The per-step cost: plain DDP against --replica-groups 2, fault-free, no step delay.
            cost = {
                m: one(m, False, steps=COST_STEPS, delay=0.0)
                for m in (["ddp", "groups2"][:: 1 - 2 * (rep % 2)])
            }
            per["cost"].setdefault("ddp_step_s", []).append(cost["ddp"]["step_s"])
            per["cost"].setdefault("groups2_step_s", []).append(cost["groups2"]["step_s"])
            for mode in [] if args.cost_only else [*order, "groups2cold"]:
                f = one(mode, True)
                if args.plot and mode == "groups2":
                    from trainguard.incidents.groups_plot import plot_groups

                    plot_groups(f["_run"]["result"], args.plot)
                if mode != "groups2cold":
                    per[mode].setdefault("ettr", []).append(f["rate"] / clean[mode]["rate"])
                    per[mode].setdefault("pause_s", []).append(f["pause_s"])
                    per[mode].setdefault("lost_per_failure", []).append(f["lost_per_failure"])
                    per[mode].setdefault("capped", []).append(f["capped"])
                for key in ("heal_s", "kill_heal_s", "heal_split_s"):
                    if f.get(key) is not None:
                        per[mode].setdefault(key, []).append(f[key])
            print(f"bench_no_restart: repeat {rep + 1}: {json.dumps(per)}", file=sys.stderr, flush=True)
    if args.cost_only:
        out = {"machine": "CPU, gloo; shared and loaded", "repeats": args.repeats, "steps": COST_STEPS}
        out.update(load_average=[round(x, 2) for x in os.getloadavg()], **step_cost(per["cost"]))
    else:
        out = summarize(per, modes, args.steps, args.repeats)
        for key in ("ratio_vs_restart", "healthy_group_pause_s", "steps_lost_per_failure"):
            out[f"{key}_mean"] = out[key]["mean"]
    out["python_import_s"] = import_time()
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            print(f"{key:36} {value}")
    return finish("bench_no_restart", () if args.cost_only else TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
