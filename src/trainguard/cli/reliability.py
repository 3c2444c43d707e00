"""`trainguard reliability fit|predict`: survival models fitted to real GPU lifetimes.

    trainguard reliability fit (--titan DIR | --store PATH) [--json] [--plot PATH.png]
    trainguard reliability predict (--titan DIR [--neural] | --store PATH) [--seed S] [--json]
    trainguard reliability train-predictor (--sim | --store PATH) [--out FILE]   (cli/predictor.py)

``fit`` reports Kaplan-Meier survival, Weibull and exponential fits, MTTF, the competing causes
and the effect of a covariate (Titan: per batch, DBE vs OTB, by cage; a store: hours between a
job's interruptions, by root cause, by job). ``predict`` scores a Cox model and gradient
boosting on held-out Titan GPUs, or on a store's own incident history (plumbing: accuracy is
claimed only on real fleet data); ``--neural`` adds a DeepSurv model beside Cox on Titan, both
with bootstrap intervals. ``train-predictor`` trains the neural failure predictor. Needs ``pip install 'trainguard[analytics]'``. Exit codes: 0
shown, 2 bad usage or unreadable data.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "reliability",
        help="survival fits (Kaplan-Meier, Weibull, competing risks) and failure prediction",
        description="Fit survival models to real GPU lifetimes (the Titan supercomputer's public "
        "data or a trainguard incident store) and predict which GPUs fail next.",
    )
    sub = p.add_subparsers(dest="reliability_command", metavar="{fit,predict,train-predictor}")
    fit = sub.add_parser("fit", help="KM survival, Weibull/exponential MLE, MTTF, causes, covariates")
    src = fit.add_mutually_exclusive_group(required=True)
    src.add_argument("--titan", metavar="DIR", help="folder with the TitanGPULife gc_summary_loc.csv")
    src.add_argument("--store", metavar="PATH", help="a trainguard incident store (SQLite)")
    fit.add_argument("--plot", metavar="PATH.png", help="draw the survival curves to this PNG file")
    pred = sub.add_parser("predict", help="Cox PH and gradient boosting, concordance on held-out GPUs")
    psrc = pred.add_mutually_exclusive_group(required=True)
    psrc.add_argument("--titan", metavar="DIR", help="folder with gc_summary_loc.csv")
    psrc.add_argument("--store", metavar="PATH", help="a trainguard incident store (SQLite)")
    pred.add_argument(
        "--windows", type=int, default=4, help="--store: parts of the job time to cut records at (default 4)"
    )
    pred.add_argument("--seed", type=int, default=0, help="seed of the 70/30 split (default 0)")
    pred.add_argument(
        "--neural",
        action="store_true",
        help="--titan: also a DeepSurv model (an MLP on Cox's partial likelihood), both with 95%% "
        "bootstrap intervals (needs trainguard[predictor])",
    )
    for q in (fit, pred):
        q.add_argument("--json", action="store_true", help="print one JSON object")
    fit.set_defaults(func=run_fit)
    pred.set_defaults(func=run_predict)
    from trainguard.cli import predictor

    predictor.register(sub)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def run_fit(args: argparse.Namespace) -> int:
    from trainguard.reliability.fit import fit_store, fit_titan, store_lifetimes

    if args.titan:
        from trainguard.reliability.titan import load_titan

        gpus = load_titan(args.titan)
        result = fit_titan(gpus)
        if args.plot:
            from trainguard.reliability.plot import plot_titan

            plot_titan(gpus, args.plot)
    else:
        from trainguard.cli.incidents import open_store

        with open_store(args.store) as store:
            result = fit_store(store)
            durations, events, _, _ = store_lifetimes(store)
        if args.plot and any(events):
            from trainguard.reliability.plot import plot_store_fit

            plot_store_fit(durations, events, args.plot)
    if args.json:
        print(json.dumps(result, indent=1, allow_nan=False))
    else:
        print(render_fit(result))
        if args.plot:
            print(f"\nplot: {args.plot}")
    return 0


def _v(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def render_fit(result: dict[str, Any]) -> str:
    from trainguard.incidents.report import format_table

    unit = result["unit"]
    lines = [f"source: {result['source']} (times in {unit})"]
    for name, b in result["batches"].items():
        lines.append(
            f"\n{name}: {b['n']} units, {b['failures']} failures, {b[f'exposure_{unit}']:.0f} {unit} observed"
        )
        if "km" not in b:
            lines.append(f"  {b.get('note', '')}")
            continue
        km = "  ".join(f"S({k})={_v(v)}" for k, v in b["km"].items())
        lines += [
            f"  Kaplan-Meier      {km}",
            f"  Weibull           shape {b['weibull_shape']:.3f}, scale {b[f'weibull_scale_{unit}']:.2f} {unit} "
            f"(AIC {b['aic_weibull']:.0f} vs exponential {b['aic_exponential']:.0f})",
            f"  MTTF              {b[f'mttf_{unit}_weibull']:.2f} {unit} (Weibull mean); "
            f"{b[f'mttf_{unit}_exponential']:.2f} (exponential: exposure / failures)",
            "  causes            "
            + ", ".join(f"{c} {n} ({b['shares'][c]:.1%})" for c, n in b["causes"].items()),
            f"  P(by {b['cumulative_incidence_at']} {unit})    "
            + ", ".join(f"{c} {_v(v)}" for c, v in b["cumulative_incidence"].items()),
        ]
        for key in ("by_cage", "by_job"):
            if key in b:
                g = b[key]
                rows = [
                    [
                        key[3:],
                        "n",
                        "failures",
                        f"rate per {unit[:-1]}",
                        "vs all",
                        f"S({b['cumulative_incidence_at']})",
                    ]
                ]
                for value, r in g["groups"].items():
                    rows.append(
                        [
                            value,
                            str(r["n"]),
                            str(r["failures"]),
                            f"{r['rate']:.4f}",
                            _v(r["rate_ratio"], "{:.2f}x"),
                            _v(r["km"]),
                        ]
                    )
                lines += ["", *("  " + line for line in format_table(rows))]
                lines.append(
                    f"  log-rank test across {key[3:]}s: chi2 {g['logrank_chi2']:.1f}, p {_p(g['logrank_p'])}"
                )
    return "\n".join(lines)


def _p(p: float) -> str:
    return "< 1e-300" if p == 0 else f"= {p:.2g}"


def run_predict(args: argparse.Namespace) -> int:
    if args.store and args.neural:
        from trainguard.errors import ConfigError

        raise ConfigError("--neural compares DeepSurv with Cox on Titan's lifetimes: use it with --titan DIR")
    if args.store:
        from trainguard.cli.incidents import open_store
        from trainguard.reliability.store_predict import predict_store

        with open_store(args.store) as store:
            result = predict_store(store, seed=args.seed, windows=args.windows)
        print(json.dumps(result, indent=1, allow_nan=False) if args.json else render_store_predict(result))
        return 0
    from trainguard.reliability.predict import predict_titan
    from trainguard.reliability.titan import load_titan

    gpus = load_titan(args.titan)
    result = predict_titan(gpus, seed=args.seed)
    if args.neural:
        from trainguard.predictor.titan import compare_titan

        result["neural"] = compare_titan(gpus, seed=args.seed)
    if args.json:
        print(json.dumps(result, indent=1, allow_nan=False))
        return 0
    from trainguard.incidents.report import format_table

    lines = [
        f"Titan old batch: trained on {result['n_train']} GPUs, scored on {result['n_test']} held out "
        f"(seed {result['seed']}); covariates: {', '.join(result['covariates'])}",
        "",
        *format_table(
            [["model", "concordance (held out)"], ["no covariates (baseline)", "0.500"]]
            + [[m, f"{c:.4f}"] for m, c in result["models"].items()]
        ),
        "",
        "hazard ratio by cage (Cox, vs cage 0 at the bottom): "
        + ", ".join(
            f"cage {c} {v['hazard_ratio']:.2f} (95% {v['ci95'][0]:.2f}-{v['ci95'][1]:.2f})"
            for c, v in result["hazard_ratio_by_cage"].items()
            if c != "reference"
        ),
        f"failed among held-out GPUs: {result['failed_share_holdout']:.1%}; among the top risk decile: "
        f"{result['failed_share_top_decile']:.1%}",
        *(render_neural(result["neural"]) if "neural" in result else []),
        "",
        f"highest predicted risk ({result['best_model']}, relative to the median GPU):",
        *format_table(
            [["serial", "location", "risk", "years", "outcome"]]
            + [
                [
                    r["sn"],
                    r["location"],
                    f"{r['risk']:.1f}x",
                    f"{r['years']:.2f}",
                    "failed" if r["failed"] else "censored",
                ]
                for r in result["highest_risk"]
            ]
        ),
    ]
    print("\n".join(lines))
    return 0


def render_neural(n: dict[str, Any]) -> list[str]:
    from trainguard.incidents.report import format_table

    d = n["difference_deepsurv_minus_cox"]
    return [
        "",
        f"neural survival model on the same split ({n['bootstrap_resamples']} bootstrap resamples of the "
        f"{n['n_test']} held-out GPUs):",
        *format_table(
            [["model", "concordance", "95% interval"]]
            + [
                [m, f"{v['concordance']:.4f}", f"{v['ci95'][0]:.4f}-{v['ci95'][1]:.4f}"]
                for m, v in n["models"].items()
            ]
            + [
                [
                    "deepsurv - cox_ph",
                    f"{d['concordance']:+.4f}",
                    f"{d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}",
                ]
            ]
        ),
        f"DeepSurv: {n['deepsurv']['parameters']:,} parameters, {n['deepsurv']['epochs']} epochs, "
        f"{n['deepsurv']['train_s']:.0f} s on the CPU",
    ]


def render_store_predict(r: dict[str, Any]) -> str:
    from trainguard.incidents.report import format_table

    lines = [f"{r['source']}: {r['claims']}", f"telemetry: {r['telemetry']}"]
    for part in (r, r["nodes"]):
        kind = part["unit"]
        if "note" in part:
            lines += ["", f"{kind}s: {part['note']}"]
            continue
        lines += [
            "",
            f"{kind}s: {part['n_units']} ({part['n_train_units']} to train, {part['n_test_units']} held out, seed "
            f"{part['seed']}); {part['windows']} windows of {part['window_hours']:.1f} job hours; failures "
            f"{part['failures_train']} in training, {part['failures_test']} held out (about "
            f"{part['failures_needed']} needed for {part['model_terms']} model terms)",
            *format_table(
                [["model", "concordance (held out)"], ["no covariates (baseline)", "0.500"]]
                + [[m, f"{c:.4f}"] for m, c in part["models"].items()]
            ),
            f"highest predicted risk ({part['ranked_by']} on all {kind}s, relative to the median {kind}):",
            *format_table(
                [[kind, "risk", "failures", "near misses"]]
                + [
                    [u["unit"], f"{u['risk']:.3g}x", str(u["failures"]), str(u["near_misses"])]
                    for u in part["highest_risk"]
                ]
            ),
        ]
        lines += [f"fit warning: {w}" for w in part["fit_warnings"]]
    return "\n".join(lines)


def run_fleet(args: argparse.Namespace) -> int:
    from trainguard.cli.incidents import open_store
    from trainguard.reliability.fleet import fleet_from_store, render_fleet

    with open_store(args.db) as store:
        report = fleet_from_store(store)
    if args.plot:
        from trainguard.reliability.plot import plot_fleet

        plot_fleet(report, args.plot)
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False))
    else:
        print(render_fleet(report))
        if args.plot:
            print(f"\nfleet plot: {args.plot}")
    return 0
