"""What the node agent raises with a trained failure predictor on the simulated wear-out fleet:
per failure kind, the recall, precision and lead time of its ``predicted_failure`` findings,
beside the offline scoring of the same model on the same fleet and the agent's fixed rules.

    trainguard reliability train-predictor --sim --nodes 200 --seed 0 --out fleet.safetensors
    python benchmarks/bench_predictor_fleet.py --model fleet.safetensors --nodes 60 --seed 1
    python benchmarks/bench_predictor_fleet.py --json       # trains the model first (MLP, 200 nodes, seed 0)

One node agent per node (agent/fleet_run.py: `AgentDaemon` with ``predictor =`` the model, its
kernel log, its telemetry series and a SQLite store in a temporary directory) watches node after
node of the fleet of ``--seed`` (a fleet the model never saw when it was trained on another
seed) for ``--hours`` on a virtual clock, reading each GPU twice per 10-minute step. A GPU's
first ``predicted_failure`` is its alarm, scored as the offline evaluation scores it
(predictor/evaluate.py): caught when at most ``--horizon-h`` before the planned failure, early
when more, missed, or a false alarm on a healthy GPU. ``offline`` scores every step of the same
fleet's points with the same model (`fleet_run.offline_alarms`: any horizon at its threshold,
as the agent alarms; ``offline_longest_horizon``: the 24-hour horizon's threshold alone, as
docs/predictor.md's held-out table scores it); ``rules`` is the agent's first other degraded or
failed finding. Also: ``alarmed_after_failure``, the GPUs the agent first alarmed on only from
their failure on (it goes on scoring a failed GPU, its readings lost or stale: scored missed,
as offline; their forecast incidents are no forecasts), the forecasts the store recorded
(incidents, and per alarmed GPU: each is one onset), the wall time per node and the machine's
load.

Targets: ``agreement`` 1.0 (on every GPU, the agent's first alarm on a step that ended before
the failure is the offline scoring's first: the agent serves the model it was given; the
offline scoring has no later step), ``precursor_recall`` >= 0.5 (caught among the GPUs of the
five kinds with a precursor) and ``false_alarms_per_1000_gpu_days`` <= 50 (on healthy GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from paired import missed, targets_json

TARGETS = {
    "agreement": (">=", 1.0),
    "precursor_recall": (">=", 0.5),
    "false_alarms_per_1000_gpu_days": ("<=", 50.0),
}
PRECURSORS = ("dbe", "remap_failure", "thermal", "off_bus", "hang")
KINDS = (
    "dbe",
    "remap_failure",
    "thermal",
    "off_bus",
    "hang",
    "off_bus_sudden",
    "dbe_sudden",
    "healthy",
    "all",
)


def _cell(k: dict[str, Any], kind: str) -> str:
    if "false_alarms" in k:
        per = k["false_alarms_per_1000_gpu_days"]
        return f"{k['false_alarms']} false alarms ({per:.0f} per 1,000 GPU-days)"
    if kind == "all":
        return f"{k['recall']:.2f} / {k['precision'] or 0:.2f}"
    lead = "" if k["median_lead_h"] is None else f" / {k['median_lead_h']:.1f} h"
    early = f" ({k['early']} early)" if k["early"] else ""
    prec = "-" if k["precision"] is None else f"{k['precision']:.2f}"
    return f"{k['recall']:.2f} / {prec}{lead}{early}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", help="a model file (default: train an MLP on --train-nodes of the fleet of seed 0)"
    )
    p.add_argument(
        "--train-nodes", type=int, default=200, help="without --model: nodes to train on (default 200)"
    )
    p.add_argument("--nodes", type=int, default=60, help="nodes of 8 GPUs (default 60: 480 GPUs)")
    p.add_argument("--hours", type=float, default=72.0)
    p.add_argument("--seed", type=int, default=1, help="the fleet (default 1; train on another)")
    p.add_argument("--horizon-h", type=float, default=24.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from trainguard.agent.fleet_run import agreement, offline_alarms, report, watch_node
    from trainguard.incidents import IncidentStore
    from trainguard.predictor.predictor import Predictor
    from trainguard.predictor.simfleet import simulate_node

    load = [os.getloadavg()]
    watched, offline, longest, seconds = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "tg.db")
        if args.model is None:
            args.model = train_model(Path(tmp), args.train_nodes, args.hours)
        predictor = Predictor.load(args.model)
        for node in range(args.nodes):
            t0 = time.perf_counter()
            watched += watch_node(node, db, tmp, model=args.model, hours=args.hours, seed=args.seed)
            seconds.append(time.perf_counter() - t0)
            lives = simulate_node(node, hours=args.hours, seed=args.seed)
            offline += offline_alarms(predictor, lives)
            longest += offline_alarms(predictor, lives, horizon=len(predictor.header.thresholds) - 1)
            if not args.json:
                print(f"node {node + 1}/{args.nodes}: {seconds[-1]:.1f} s", file=sys.stderr, flush=True)
        with IncidentStore(db) as store:
            forecasts = [i for i in store.incidents() if i.evidence and i.evidence[0] == "predicted_failure"]
    load.append(os.getloadavg())
    out = report(watched, args.horizon_h * 3600.0, offline=offline)
    out["offline_longest_horizon"] = report(watched, args.horizon_h * 3600.0, offline=longest)["offline"]
    onsets = Counter((i.node, i.gpu) for i in forecasts)
    predictor_all = out["predictor"]["all"]
    caught = sum(out["predictor"][k]["caught"] for k in PRECURSORS if k in out["predictor"])
    n_pre = sum(out["predictor"][k]["n"] for k in PRECURSORS if k in out["predictor"])
    out.update(
        agreement=round(agreement(watched, offline), 4),
        alarmed_after_failure=sum(w.predicted_s is not None and w.forecast_s is None for w in watched),
        precursor_recall=round(caught / n_pre, 4) if n_pre else None,
        false_alarms_per_1000_gpu_days=predictor_all["false_alarms_per_1000_gpu_days"],
        model=str(args.model), arch=predictor.header.arch, thresholds=list(predictor.header.thresholds),
        training=predictor.header.training.get("source"), nodes=args.nodes, hours=args.hours, seed=args.seed,
        forecast_incidents=len(forecasts), alarmed_gpus=len(onsets),
        onsets_per_alarmed_gpu=round(len(forecasts) / len(onsets), 2) if onsets else None,
        seconds_per_node=round(sum(seconds) / len(seconds), 1),
        load=[[round(x, 2) for x in la] for la in load],
    )  # fmt: skip
    out["targets"] = targets_json(TARGETS)
    out["targets_missed"] = miss = missed(out, TARGETS)
    for m in miss:
        print(f"bench_predictor_fleet: target missed: {m}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=1))
        return 1 if miss else 0
    print(f"{out['gpus']} GPUs ({out['failed']} failed), {args.nodes} nodes x {args.hours:g} h, fleet seed "
          f"{args.seed}; model {args.model} ({out['arch']}, trained on {out['training']}); "
          f"caught = first alarm at most {args.horizon_h:g} h before the failure")  # fmt: skip
    head = (
        "kind",
        "GPUs",
        "agent: recall / precision / median lead",
        "offline, same model",
        "agent's fixed rules",
    )
    rows = [head]
    for kind in KINDS:
        if kind not in out["predictor"]:
            continue
        n = out["predictor"][kind]["n"]
        rows.append((kind, str(n), *(_cell(out[m][kind], kind) for m in ("predictor", "offline", "rules"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(f"forecast incidents {len(forecasts)} on {len(onsets)} GPUs ({out['alarmed_after_failure']} first "
          f"alarmed after their failure); the agent's first alarm before the failure equals the offline one "
          f"on {out['agreement']:.1%} of the GPUs; precursor recall {out['precursor_recall']}; "
          f"{out['seconds_per_node']} s per node; load {out['load']}")  # fmt: skip
    return 1 if miss else 0


def train_model(tmp: Path, nodes: int, hours: float) -> str:
    """An MLP on the simulated fleet of seed 0, as `train-predictor --sim --arch mlp` trains it."""
    from trainguard.predictor import modelfile
    from trainguard.predictor.simfleet import simulate_fleet
    from trainguard.predictor.train import train

    source = f"simulated fleet ({nodes} nodes x 8 GPUs, {hours:g} h, seed 0)"
    t = train(simulate_fleet(nodes=nodes, hours=hours, seed=0), seed=0, arch="mlp", source=source)
    return str(modelfile.save(tmp / "model.safetensors", t.header, t.net.state_dict()))


if __name__ == "__main__":
    raise SystemExit(main())
