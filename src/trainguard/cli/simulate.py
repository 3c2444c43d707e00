"""`trainguard simulate`: Monte Carlo of a synchronous job on a failing cluster.

    trainguard simulate --gpus N --days D [--checkpoint-minutes M] [--checkpoint-write-seconds W]
                        [--restart-minutes U] [--trials T] [--seed S] [--from-bench FILE]
                        [--replica-groups G [--heal-minutes H | --from-no-restart FILE]
                         [--stall-seconds EST] [--step-overhead-ms EST] [--step-seconds S]
                         [--job-wide KINDS]] [--json] [--plot PATH.png]

Default failure rates: Llama 3 405B's 54-day record (Table 5), per GPU. --from-bench FILE takes
the recovery costs `benchmarks/bench_recovery.py --json` measured for trainguard and for plain
torchrun (the same figures for both: restart after a kill, recovery from a hang) and simulates
the job under each. --replica-groups G adds the third recovery mode (a failed group heals while
the others stall, then train on; job-wide failure kinds restart the job), with the uncertainty of
its inputs in the interval it prints and a table over the healthy groups' stall
(cli/simulate_groups.py); --from-no-restart FILE takes its costs, and the restart mode's, from
`benchmarks/bench_no_restart.py --json`. Exit codes: 0 shown, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="Monte Carlo of a training job's interruptions and ETTR on a cluster of N GPUs",
        description="Failures per root-cause category (default: Llama 3 405B's published record) "
        "interrupt a synchronous job; each loses the work since the last checkpoint and costs a "
        "restart. Reports interruptions by category, MTTF and ETTR over many trials.",
    )
    p.add_argument("--gpus", type=int, required=True, metavar="N")
    p.add_argument("--days", type=float, required=True, metavar="D", help="wall-clock days")
    p.add_argument("--checkpoint-minutes", type=float, default=30.0, metavar="M", help="default 30")
    p.add_argument(
        "--checkpoint-write-seconds", type=float, default=0.0, metavar="W", help="blocking save (default 0)"
    )
    p.add_argument("--restart-minutes", type=float, default=10.0, metavar="U", help="default 10")
    p.add_argument("--trials", type=int, default=1000, metavar="T", help="default 1000")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument(
        "--from-bench",
        metavar="FILE",
        help="JSON of benchmarks/bench_recovery.py --json: simulate trainguard's and torchrun's recovery",
    )
    p.add_argument(
        "--spare-nodes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --from-bench: a spare node replaces an excluded one at once (default); "
        "--no-spare-nodes waits --repair-minutes for it (the same for both launchers)",
    )
    p.add_argument("--repair-minutes", type=float, default=120.0, metavar="R", help="default 120")
    from trainguard.cli.simulate_groups import add_arguments

    add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="PATH.png", help="draw the distributions to this PNG file")
    p.set_defaults(func=run)


# What bench_recovery.py --json must carry for each launcher (the same figures, measured the
# same way): the restart after a dead worker, and the recovery from a hung one, both from the fault
# to the first step of the new workers.
BENCH_KEYS = {
    "trainguard": ("mttr_s", "hang_recover_s"),
    "torchrun": ("torchrun_mttr_s", "torchrun_hang_recover_s"),
}


def read_text(path: str, flag: str) -> str:
    from trainguard.errors import InputError

    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot read it ({exc.strerror})") from None


def bench_costs(path: str, restart_s: float, wait_s: float = 0.0) -> dict[str, dict[str, float]]:
    """Recovery costs per launcher from a bench_recovery JSON, each from its own measured figures
    and by the same formula: every failure costs the job's own restart (reload, warm-up) plus the
    launcher's measured time from the kill to the first step; a hang costs, on top, what its
    measured recovery took beyond that restart (detection). A fault that stays with its node costs
    both the same ``wait_s`` for a replacement node (0 with a spare): the benchmark does not
    measure node faults, so neither launcher gets a figure it did not earn."""
    from trainguard.errors import InputError

    text = read_text(path, "--from-bench")
    try:
        data = json.loads(text)
        costs = {}
        for name, (mttr_key, hang_key) in BENCH_KEYS.items():
            mttr, hang = float(data[mttr_key]), float(data[hang_key])
            if not (mttr >= 0 and hang >= 0):
                raise ValueError(f"{mttr_key} and {hang_key} must be seconds >= 0")
            costs[name] = {
                "restart_s": restart_s + mttr,
                "detect_hang_s": max(0.0, hang - mttr),
                "node_fault_extra_s": wait_s,
            }
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"--from-bench {path}: not the JSON of `benchmarks/bench_recovery.py --json` with the hang "
            f"case and the MTTR rounds ({exc!r}); run it without --no-hang or --hang-only"
        ) from None
    return costs


def run(args: argparse.Namespace) -> int:
    from trainguard.reliability.simulate import SimConfig, simulate, with_costs

    cfg = SimConfig(
        gpus=args.gpus,
        days=args.days,
        interval_s=args.checkpoint_minutes * 60.0,
        write_s=args.checkpoint_write_seconds,
        restart_s=args.restart_minutes * 60.0,
        trials=args.trials,
        seed=args.seed,
    )
    results = {"simulated": simulate(cfg)}
    out: dict[str, Any] = results["simulated"].summary()
    if args.from_bench:
        wait = 0.0 if args.spare_nodes else args.repair_minutes * 60.0
        costs = bench_costs(args.from_bench, cfg.restart_s, wait)
        scenarios = {}
        for name, c in costs.items():
            results[name] = simulate(with_costs(cfg, **c))
            scenarios[name] = {**c, **results[name].summary()}
        out["from_bench"] = scenarios
        out["from_bench_ettr_gain"] = paired_gain(results["trainguard"].ettr, results["torchrun"].ettr)
    if args.from_no_restart and not args.replica_groups:
        from trainguard.errors import InputError

        raise InputError("--from-no-restart feeds the third mode: give --replica-groups G as well")
    if args.replica_groups:
        from trainguard.cli.simulate_groups import run_groups

        out["replica_groups"] = run_groups(args, cfg, results["simulated"].ettr)
    if args.plot:
        from trainguard.reliability.plot import plot_simulation

        shown = {k: v for k, v in results.items() if k != "simulated"} if args.from_bench else results
        plot_simulation(shown, args.plot)
    if args.json:
        print(json.dumps(out, indent=1, allow_nan=False))
    else:
        print(render(out, results["simulated"]))
        if args.plot:
            print(f"\nplot: {args.plot}")
    return 0


def paired_gain(ours: Any, theirs: Any) -> dict[str, Any]:
    """Per trial, trainguard's ETTR minus torchrun's (one seed: the same failures at the same
    times), its mean and a normal 95% interval of the mean."""
    d = ours - theirs
    n = len(d)
    se = float(d.std(ddof=1)) / n**0.5 if n > 1 else 0.0
    m = float(d.mean())
    return {"mean": round(m, 6), "ci95": [round(m - 1.96 * se, 6), round(m + 1.96 * se, 6)], "trials": n}


def render(s: dict[str, Any], result: Any) -> str:
    from trainguard.incidents.report import format_table
    from trainguard.reliability.simulate import category_table

    lines = [
        f"{s['gpus']:,} GPUs, {s['days']:g} days, {s['trials']} trials: checkpoint every "
        f"{s['checkpoint_interval_minutes']:g} min (blocking {s['checkpoint_write_seconds']:g} s), "
        f"restart {s['restart_minutes']:g} min",
        f"interruptions  {s['interruptions_mean']:.1f} +/- {s['interruptions_sd']:.1f}   "
        f"(expected {s['interruptions_expected']:.1f}; job MTTF {s['mttf_hours']} h)",
        f"ETTR           {s['ettr_mean']:.4f} +/- {s['ettr_sd']:.4f}   (5th percentile {s['ettr_p05']:.4f}; "
        f"model {s['ettr_model']:.4f}, first order {s['ettr_model_first_order']:.4f})",
        "",
    ]
    rows = [["root cause", "simulated", "Llama 3 Table 5 (scaled)", "z"]]
    for r in category_table(result):
        rows.append([r["category"], f"{r['simulated']:.2f}", _f(r["published"]), _f(r["z"])])
    lines += format_table(rows)
    for name, sc in s.get("from_bench", {}).items():
        lines.append(
            f"\n{name:10s}: restart {sc['restart_s']:.1f} s, a hang {sc['detect_hang_s']:.1f} s more, "
            f"a node fault {sc['node_fault_extra_s']:.0f} s more -> ETTR {sc['ettr_mean']:.4f} "
            f"+/- {sc['ettr_sd']:.4f}"
        )
    if "from_bench_ettr_gain" in s:
        g = s["from_bench_ettr_gain"]
        lines.append(
            f"trainguard - torchrun, same failures: {g['mean']:+.5f} (95% CI {g['ci95'][0]:+.5f} to "
            f"{g['ci95'][1]:+.5f}, {g['trials']} trials)"
        )
    if (g := s.get("replica_groups")) is not None:
        from trainguard.cli.simulate_groups import render_groups

        lines += render_groups(g)
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
