"""`trainguard plan`: job MTTF, failures per day, Young and Daly checkpoint intervals and the
expected ETTR of a job of N GPUs.

    trainguard plan (--gpus N [--gpus-per-node 8] | --nodes N) [--failure-rate-per-node-day R |
                    --mttf-hours M] [--checkpoint-write-seconds W] [--restart-minutes U]
                    [--checkpoint-interval-minutes T] [--from-job JOB [--db PATH]]
                    [--power-cap-watts P [--tdp-watts 700]] [--json]

With no rate given it uses Llama 3 405B's published interruption rate (and says so). With
--from-job it takes the size, checkpoint and restart costs that `trainguard run` measured for a
job; flags given explicitly win. Exit codes: 0 shown, 2 bad usage or no such job.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "plan",
        help="how often a job of N GPUs fails, how often to checkpoint, and its expected ETTR",
        description="Job MTTF (series system: 1 / (N x r_f)), failures per day, Young's and Daly's "
        "checkpoint intervals and the expected ETTR (Kokolis et al., HPCA 2025) at the recommended "
        "and at your interval, with a table of ETTR against the interval.",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gpus", type=int, metavar="N", help="GPUs in the job")
    size.add_argument("--nodes", type=float, metavar="N", help="nodes in the job")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="G", help="default 8")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument(
        "--failure-rate-per-node-day", type=float, metavar="R", help="failures per node per day (r_f)"
    )
    rate.add_argument("--mttf-hours", type=float, metavar="M", help="the job's mean time to failure")
    p.add_argument(
        "--checkpoint-write-seconds", type=float, metavar="W", help="blocking part of a save (default 60)"
    )
    p.add_argument(
        "--restart-minutes", type=float, metavar="U", help="failure to training again (default 10)"
    )
    p.add_argument("--checkpoint-interval-minutes", type=float, metavar="T", help="your current interval")
    p.add_argument("--from-job", metavar="JOB", help="take size and costs from a job in the incident store")
    p.add_argument("--db", metavar="PATH", help="incident store for --from-job (default $TRAINGUARD_DB)")
    p.add_argument(
        "--power-cap-watts",
        type=float,
        metavar="P",
        help="also answer: is capping the GPUs at P watts worth it?",
    )
    p.add_argument(
        "--tdp-watts", type=float, default=700.0, metavar="W", help="uncapped board power (default 700)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def inputs_from_args(args: argparse.Namespace) -> Any:
    from trainguard.errors import ConfigError
    from trainguard.reliability import models
    from trainguard.reliability.planner import PlanInputs, job_costs, rate_from_mttf

    gpus, nodes = args.gpus, args.nodes
    write = args.checkpoint_write_seconds
    restart = args.restart_minutes * 60.0 if args.restart_minutes is not None else None
    interval = args.checkpoint_interval_minutes * 60.0 if args.checkpoint_interval_minutes else None
    cost_source = "flags" if write is not None or restart is not None else "defaults"
    if args.from_job:
        from trainguard.cli.incidents import open_store

        with open_store(args.db) as store:
            costs = job_costs(store, args.from_job)
        measured = [k for k in ("write_s", "restart_s", "interval_s") if getattr(costs, k) is not None]
        cost_source = f"job {costs.job}: measured {', '.join(measured) or 'nothing'}"
        gpus = gpus if gpus or nodes else costs.world_size
        write = write if write is not None else costs.write_s
        restart = restart if restart is not None else costs.restart_s
        interval = interval or costs.interval_s
    if nodes is None:
        if not gpus:
            raise ConfigError("plan needs the job size: --gpus N or --nodes N (or --from-job JOB)")
        nodes = gpus / args.gpus_per_node
    if args.failure_rate_per_node_day is not None:
        r_f, source = args.failure_rate_per_node_day, "--failure-rate-per-node-day"
    elif args.mttf_hours is not None:
        r_f, source = rate_from_mttf(nodes, args.mttf_hours), "--mttf-hours"
    else:
        r_f, source = models.LLAMA3_FAILURES_PER_NODE_DAY * args.gpus_per_node / 8, models.LLAMA3_SOURCE
    return PlanInputs(
        nodes=nodes,
        failures_per_node_day=r_f,
        write_s=60.0 if write is None else write,
        restart_s=600.0 if restart is None else restart,
        interval_s=interval,
        gpus_per_node=args.gpus_per_node,
        rate_source=source,
        cost_source=cost_source,
    )


def run(args: argparse.Namespace) -> int:
    from trainguard.reliability.planner import plan, power_cap_tradeoff

    inputs = inputs_from_args(args)
    result = plan(inputs)
    if args.power_cap_watts:
        result["power_cap"] = power_cap_tradeoff(inputs, args.power_cap_watts, args.tdp_watts)
    if args.json:
        print(json.dumps(result, indent=1, allow_nan=False))
    else:
        print(render(result))
    return 0


def _m(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(p: dict[str, Any]) -> str:
    from trainguard.incidents.report import format_table

    lines = [
        f"job: {p['gpus']:g} GPUs on {p['nodes']:g} nodes, {p['failures_per_node_day'] * 1000:.2f} failures "
        "per 1000 node-days",
        f"  rate from: {p['rate_source']}",
        f"  costs from: {p['cost_source']}: checkpoint blocks {p['checkpoint_write_seconds']:.1f} s, "
        f"restart {p['restart_minutes']:.1f} min",
        "",
        f"job MTTF            {_m(p['mttf_hours'], '{:.2f}')} h   ({p['failures_per_day']:.2f} failures per day, "
        f"P(failure within 24 h) = {p['p_failure_24h']:.3f})",
        f"Young interval      {_m(p['young_interval_minutes'])} min   sqrt(2 W MTTF)",
        f"Daly interval       {_m(p['daly_interval_minutes'])} min   (recommended)",
        f"expected ETTR       {p['expected_ettr_recommended']:.3f} at the recommended interval "
        f"(exact model {p['expected_ettr_recommended_exact']:.3f})",
    ]
    if p["checkpoint_interval_minutes"]:
        lines.append(
            f"                    {p['expected_ettr']:.3f} at your {p['checkpoint_interval_minutes']:.1f} min "
            f"(exact model {p['expected_ettr_exact']:.3f})"
        )
    rows = [["interval (min)", "E[ETTR]", "exact"]]
    rows += [
        [f"{r['interval_minutes']:g}", f"{r['expected_ettr']:.3f}", f"{r['expected_ettr_exact']:.3f}"]
        for r in p["table"]
    ]
    lines += ["", *format_table(rows), "", f"model: {p['model']}"]
    if "power_cap" in p:
        c = p["power_cap"]
        lines += [
            "",
            f"power cap {c['cap_w']:g} W of {c['tdp_w']:g} W: GPU ~{c['gpu_temp_c']:.0f} C instead of "
            f"~{c['gpu_temp_c_uncapped']:.0f} C, failure rate x{c['failure_rate_factor']:.3f}, "
            f"throughput x{c['throughput']:.3f}",
            f"  job MTTF {_m(c['mttf_hours'], '{:.2f}')} h, ETTR {c['expected_ettr_recommended']:.3f}; useful work per "
            f"hour {c['useful_work']:.3f} vs {c['useful_work_uncapped']:.3f} uncapped: "
            + ("worth it" if c["worth_it"] else "not worth it"),
            f"  assumptions: {c['assumptions']}",
        ]
    return "\n".join(lines)
