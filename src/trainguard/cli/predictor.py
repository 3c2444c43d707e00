"""`trainguard reliability train-predictor`: train the neural failure predictor and report it.

    trainguard reliability train-predictor --sim [--nodes N] [--hours H] [--out FILE] [--seed S]
    trainguard reliability train-predictor --store PATH [--out FILE] [--seed S]

Trains on every GPU's telemetry series (a store's, or a simulated fleet's with failure
precursors), picks an MLP or a 1D-CNN on validation GPUs, calibrates it, saves the model file
and prints its held-out figures: per step (average precision, AUC, Brier, calibration error)
and per GPU (per failure kind: recall, precision, median lead time) beside a logistic baseline
and, on the simulated fleet, the fixed rules. Needs ``pip install 'trainguard[predictor]'``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "train-predictor",
        help="train the neural failure predictor (P(failure within 1 h / 24 h) per GPU)",
        description="Train the neural failure predictor on GPU telemetry series and report it on "
        "held-out GPUs.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--store", metavar="PATH", help="an incident store holding the agents' series")
    src.add_argument("--sim", action="store_true", help="a simulated fleet with failure precursors")
    p.add_argument("--out", metavar="FILE", default="failure-predictor.safetensors", help="the model file")
    p.add_argument("--nodes", type=int, default=200, help="--sim: nodes of 8 GPUs (default 200)")
    p.add_argument("--hours", type=float, default=72.0, help="--sim: hours each GPU is watched (default 72)")
    p.add_argument("--seed", type=int, default=0, help="the fleet's and the split's seed (default 0)")
    p.add_argument("--arch", choices=("auto", "mlp", "cnn"), default="auto", help="the net (default: the "
                   "better on validation GPUs)")  # fmt: skip
    p.add_argument("--epochs", type=int, default=8, help="at most this many epochs (default 8)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from trainguard.predictor import modelfile
    from trainguard.predictor.train import train

    lives: Any
    if args.sim:
        from trainguard.predictor.simfleet import simulate_fleet

        lives = simulate_fleet(nodes=args.nodes, hours=args.hours, seed=args.seed)
        source = f"simulated fleet ({args.nodes} nodes x 8 GPUs, {args.hours:g} h, seed {args.seed})"
    else:
        from trainguard.cli.incidents import open_store
        from trainguard.predictor.store import lives_from_store

        with open_store(args.store) as store:
            lives = lives_from_store(store)
        source = f"store:{args.store}"
    trained = train(lives, seed=args.seed, arch=args.arch, epochs=args.epochs, source=source)
    path = modelfile.save(args.out, trained.header, trained.net.state_dict())
    report = {**trained.report, "model_file": str(path), "format_version": modelfile.VERSION}
    print(json.dumps(report, indent=1, allow_nan=False) if args.json else render(report))
    return 0


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(r: dict[str, Any]) -> str:
    from trainguard.incidents.report import format_table

    c = r["candidates"]
    lines = [
        f"trained on {r['source']}: {r['gpus']} GPUs, {r['failed']} failed; split by GPU "
        f"{r['split_gpus']['fit']} fit / {r['split_gpus']['validation']} validation / "
        f"{r['split_gpus']['held_out']} held out",
        "model: " + r["model"] + " (picked on validation average precision: "
        + ", ".join(f"{a} {v['validation_ap']:.3f}, {v['parameters']:,} parameters, {v['train_s']:.0f} s" for a, v in c.items())
        + ")",
        f"saved: {r['model_file']} (format version {r['format_version']}); alarm thresholds "
        + ", ".join(f"{t:.3f}" for t in r["thresholds"]),
        "",
        "held out, per step (calibrated probabilities):",
    ]  # fmt: skip
    rows = [["horizon", "model", "avg precision", "ROC AUC", "Brier", "calib. error", "base rate"]]
    for h, models in r["held_out"].items():
        for m, s in models.items():
            rows.append([h, m, _f(s["average_precision"], "{:.3f}"), _f(s["roc_auc"], "{:.3f}"),
                         _f(s["brier"], "{:.4f}"), _f(s["ece"], "{:.4f}"), _f(s.get("base_rate"), "{:.4f}")])  # fmt: skip
    lines += format_table(rows)
    for h, by_model in r["alarms"].items():
        models = list(by_model)
        lines += ["", f"held out, per GPU (first alarm; caught = within {h} before the failure):"]
        head = ["kind", "GPUs", *(f"{m} recall/precision/lead h" for m in models)]
        rows = [head]
        for kind in by_model[models[0]]:
            row = [kind, str(by_model[models[0]][kind]["n"])]
            for m in models:
                k = by_model[m][kind]
                if "false_alarms" in k:
                    row.append(
                        f"{k['false_alarms']} false alarms ({_f(k['false_alarms_per_1000_gpu_days'], '{:.0f}')}/1000 GPU-days)"
                    )
                elif kind == "all":
                    row.append(
                        f"{_f(k['recall'])} / {_f(k['precision'])} ({_f(k['false_alarms_per_1000_gpu_days'], '{:.0f}')} FA/1000 GPU-days)"
                    )
                else:
                    row.append(f"{_f(k['recall'])} / {_f(k['precision'])} / {_f(k['median_lead_h'], '{:.1f}')}")  # fmt: skip
            rows.append(row)
        lines += format_table(rows)
    return "\n".join(lines)
