"""`trainguard simulate --replica-groups G`: the replica-group mode's projection, its inputs and
where each comes from, the interval their uncertainty gives, and the table over the stall.

    trainguard simulate --gpus 16384 --days 54 --replica-groups 128 \\
        [--from-no-restart docs/no-restart-bench.json] [--stall-seconds 1..600] \\
        [--step-overhead-ms 18.8+-48.3] [--step-seconds 5] [--job-wide software_bug,...]

Every input is printed with its source: measured here (bench_no_restart, two CPU ranks on one
host), published (Llama 3's failure mix), or assumed. The trials' 95% range holds the inputs'
uncertainty and one run's luck with its failures; the +/- on the mean is Monte Carlo error only.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

# The healthy groups' stall per failure in the sensitivity table: ~what one host's loopback
# measures, a fast re-init at scale, FT-HSDP's at ~100K GPUs, a synchronous restart's there.
SENSITIVITY_STALLS_S = (1.0, 30.0, 180.0, 600.0)
# What bench_no_restart.py --json must carry (each {"mean": ..., "ci95": ..., "n": ...}).
NO_RESTART_KEYS = (
    "heal_s",
    "restart_recovery_s",
    "healthy_group_pause_s",
    "healthy_group_pause_clean_s",
    "steps_lost_per_failure",
    "step_overhead_ms",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--replica-groups",
        type=int,
        default=0,
        metavar="G",
        help="also the third recovery mode: G replica groups (trainguard run --replica-groups); a "
        "replica-local failure takes one group out while the others stall, then train on (docs/no-restart.md)",
    )
    p.add_argument(
        "--heal-minutes",
        type=float,
        default=None,
        metavar="H",
        help="a group's restart and heal (default: --restart-minutes)",
    )
    p.add_argument(
        "--stall-seconds",
        metavar="EST",
        help="the healthy groups' stall per replica-local failure (quorum, communicator re-creation, "
        "discarded steps): a number, MEAN+-HALF95 or a range LO..HI drawn log-uniformly (default 1..600; "
        "with --from-no-restart, what it measured)",
    )
    p.add_argument(
        "--step-overhead-ms",
        metavar="EST",
        help="each step's cost over a plain DDP step, ms: a number or MEAN+-HALF95 (default 0; with "
        "--from-no-restart, what it measured)",
    )
    p.add_argument(
        "--job-wide",
        metavar="KINDS",
        help="root causes (incidents.taxonomy) that stop every group, comma-separated, or 'none' "
        "(default: the taxonomy's JOB_WIDE_CAUSES)",
    )
    p.add_argument(
        "--from-no-restart",
        metavar="FILE",
        help="with --replica-groups: JSON of benchmarks/bench_no_restart.py --json; the heal, the healthy "
        "groups' stall, the per-step overhead (with its CI) and the restart mode's recovery, as measured",
    )
    p.add_argument(
        "--step-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="one training step of the simulated job (default 5): scales the per-step overhead and the "
        "discarded steps",
    )


def no_restart_costs(path: str, restart_s: float, step_s: float) -> dict[str, Any]:
    """The replica-group mode's costs, and the restart mode's, from a bench_no_restart JSON:
    each failure costs the job's own restart (``restart_s``: reload, NCCL init, warm-up) plus what
    each mode measured from the fault to its first step (the failed group's first commit beside a
    peer; the restarted job's first step). The healthy groups stall, per failure, for their pause
    beyond a fault-free run's longest gap plus the steps they discarded (``step_s`` each); every
    step costs the measured overhead over a plain DDP step, with its 95% half-width."""
    from trainguard.cli.simulate import read_text
    from trainguard.errors import InputError
    from trainguard.reliability.groups import Estimate

    if not step_s > 0:
        raise InputError(f"--step-seconds {step_s:g}: give the simulated job's step time in seconds, above 0")
    text = read_text(path, "--from-no-restart")
    try:
        data = json.loads(text)
        m = {key: float(data[key]["mean"]) for key in NO_RESTART_KEYS}
        half = float(data["step_overhead_ms"]["ci95"])
        if any(not (v >= 0 or key == "step_overhead_ms") for key, v in m.items()) or not half >= 0:
            raise ValueError("times, counts and intervals must be >= 0")
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"--from-no-restart {path}: not the JSON of `benchmarks/bench_no_restart.py --json` ({exc!r}); "
            "run it again with this version"
        ) from None
    pause = max(0.0, m["healthy_group_pause_s"] - m["healthy_group_pause_clean_s"])
    return {
        "heal_s": restart_s + m["heal_s"],
        "restart_s": restart_s + m["restart_recovery_s"],
        "stall": Estimate(pause + m["steps_lost_per_failure"] * step_s),
        "overhead": Estimate(m["step_overhead_ms"], half),
    }


def _job_wide(text: str | None) -> frozenset[Any]:
    from trainguard.errors import InputError
    from trainguard.incidents.taxonomy import JOB_WIDE_CAUSES, RootCause

    if text is None:
        return JOB_WIDE_CAUSES
    if text.strip() == "none":
        return frozenset()
    try:
        return frozenset(RootCause(k.strip()) for k in text.split(",") if k.strip())
    except ValueError as exc:
        raise InputError(
            f"--job-wide {text}: {exc}; give root causes from {', '.join(c.value for c in RootCause)}, or 'none'"
        ) from None


def run_groups(args: argparse.Namespace, cfg: Any, restart_ettr: Any) -> dict[str, Any]:
    """The replica-group mode's summary: its inputs and their sources, ETTR with its intervals, the
    ratio to the restart mode (trial by trial, the same failures) and the table over the stall."""
    from trainguard.errors import InputError
    from trainguard.reliability.groups import Estimate, GroupModel, interval, job_wide_share, simulate_groups
    from trainguard.reliability.simulate import llama3_categories, simulate

    if args.from_no_restart and args.heal_minutes is not None:
        raise InputError(
            "--from-no-restart takes the heal from the benchmark: drop --heal-minutes (or drop "
            "--from-no-restart to give it by hand)"
        )
    kinds = _job_wide(args.job_wide)
    cfg = replace(cfg, categories=llama3_categories(kinds))
    source = {
        "failure_rate": "published: Llama 3 405B's Table 5 per GPU, scaled linearly to the GPUs (assumed)",
        "job_wide_share": "published: Table 5's counts of the taxonomy's job-wide kinds (Beta over 419)",
        "restart": "assumed (--restart-minutes)",
    }
    heal_s = (args.heal_minutes if args.heal_minutes is not None else args.restart_minutes) * 60.0
    stall, overhead = Estimate.parse("1..600"), Estimate(0.0)
    source |= {
        "heal": "assumed (--heal-minutes)",
        "stall": "assumed (range)",
        "step_overhead": "assumed (none)",
    }
    if args.from_no_restart:
        measured = no_restart_costs(args.from_no_restart, cfg.restart_s, args.step_seconds)
        heal_s, stall, overhead = measured["heal_s"], measured["stall"], measured["overhead"]
        cfg = replace(cfg, restart_s=measured["restart_s"])
        restart_ettr = simulate(cfg).ettr  # the same failures, the measured restart
        source |= {
            "heal": "measured here (bench_no_restart, 2 CPU ranks) + the job's restart (assumed)",
            "stall": "measured here (bench_no_restart: loopback, 2 CPU ranks), not at scale",
            "step_overhead": "measured here (bench_no_restart, 2 CPU ranks; its 95% CI)",
            "restart": "measured here + the job's restart (assumed)",
        }
    if args.stall_seconds is not None:
        stall, source["stall"] = Estimate.parse(args.stall_seconds), "assumed (--stall-seconds)"
    if args.step_overhead_ms is not None:
        overhead, source["step_overhead"] = (
            Estimate.parse(args.step_overhead_ms),
            "given (--step-overhead-ms)",
        )
    model = GroupModel(args.replica_groups, heal_s, stall, overhead, args.step_seconds)
    ettr = simulate_groups(cfg, model)
    out = {
        "groups": args.replica_groups,
        "heal_minutes": round(heal_s / 60.0, 4),
        "stall_seconds": str(stall),
        "step_overhead_ms": str(overhead),
        "step_seconds": args.step_seconds,
        "job_wide": sorted(k.value for k in kinds),
        "job_wide_share": round(job_wide_share(cfg), 4),
        **_summary(ettr, restart_ettr, interval),
        "restart_ettr_mean": round(float(restart_ettr.mean()), 5),
        "sources": source,
        "sensitivity": [
            {
                "stall_seconds": s,
                **_summary(simulate_groups(cfg, replace(model, stall_s=Estimate(s))), restart_ettr, interval),
            }
            for s in SENSITIVITY_STALLS_S
        ],
    }
    if args.from_no_restart:
        out["from_no_restart"] = {
            "file": args.from_no_restart,
            "restart_minutes": round(cfg.restart_s / 60.0, 4),
        }
    return out


def _summary(ettr: Any, restart: Any, interval: Any) -> dict[str, Any]:
    n = len(ettr)
    ratio = ettr / restart
    return {
        "ettr_mean": round(float(ettr.mean()), 5),
        # Monte Carlo error of the mean only: the standard error over the trials.
        "ettr_mc_se": round(float(ettr.std(ddof=1)) / n**0.5 if n > 1 else 0.0, 5),
        # The trials' central 95%: the inputs' uncertainty and one run's failures.
        "ettr_range95": [round(v, 5) for v in interval(ettr)],
        "ettr_vs_restart": round(float(ettr.mean()) / float(restart.mean()), 4),
        "ettr_vs_restart_range95": [round(v, 4) for v in interval(ratio)],
    }


def render_groups(g: dict[str, Any]) -> list[str]:
    from trainguard.incidents.report import format_table

    lo, hi = g["ettr_range95"]
    rlo, rhi = g["ettr_vs_restart_range95"]
    lines = [
        f"\nreplica groups: {g['groups']} groups; job-wide kinds {', '.join(g['job_wide']) or 'none'} "
        f"({g['job_wide_share']:.1%} of failures) restart the job; any other failure takes one group out for "
        f"{g['heal_minutes']:g} min and stalls the rest {g['stall_seconds']} s; each step costs "
        f"{g['step_overhead_ms']} ms over {g['step_seconds']:g} s",
        f"ETTR {g['ettr_mean']:.4f} (Monte Carlo +/- {g['ettr_mc_se']:.4f}; 95% of trials {lo:.4f}-{hi:.4f}) vs "
        f"the restart mode's {g['restart_ettr_mean']:.4f}: {g['ettr_vs_restart']}x ({rlo}-{rhi})",
        "inputs:",
        *(f"  {k.replace('_', ' ')}: {v}" for k, v in g["sources"].items()),
        "",
    ]
    rows = [["stall per failure", "ETTR", "95% of trials", "vs restart", "95% of trials"]]
    for r in g["sensitivity"]:
        rows.append(
            [
                _duration(r["stall_seconds"]),
                f"{r['ettr_mean']:.4f}",
                "{:.4f}-{:.4f}".format(*r["ettr_range95"]),
                f"{r['ettr_vs_restart']:.3f}x",
                "{:.3f}-{:.3f}".format(*r["ettr_vs_restart_range95"]),
            ]
        )
    return lines + format_table(rows)


def _duration(s: float) -> str:
    return f"{s:g} s" if s < 60 else f"{s / 60:g} min"
