"""Node agents over the simulated wear-out fleet: what the agent raises on GPUs that wear out.

    plan_node (predictor/simfleet.py: the same nodes, faults and loads as the training fleet of that seed)
        -> one AgentDaemon per node on the node's virtual clock (its kernel log, its series,
           the fixed rules, and the failure predictor when given a model file), writing its
           incidents and series to ``db`` (SQLite or PostgreSQL), as `trainguard agent` does
        -> per GPU: its planned kind and failure time, the agent's first ``predicted_failure``
           and its first other degraded or failed finding (the fixed rules)
        -> `agreement` with `offline_alarms` (the same model over the fleet's own points): on
           the steps that ended before each failure, the only ones the offline scoring has

The agent reads each GPU ``readings_per_step`` times a series step (every 5 minutes at the
simulated fleet's 10-minute step: time compressed as in predictor/simfleet.py, the rules' rates read over
the same gaps). The plan is the truth the outcomes are scored against (`report`); the agent reads
only its node. A store filled here is what `train-predictor --store` learns from::

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> [(w.kind, round(w.failure_s), w.rule_s) for w in watch_node(0, f"{d}/tg.db", d, gpus=2, hours=2.0, seed=1)]
    [('remap_failure', 4770, 4800.0), ('dbe_sudden', 3815, 3900.0)]

(no model here: the fixed rules see each failure at the agent's next reading)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import AgentDaemon
from trainguard.detect.detector import PREDICTED_FAILURE
from trainguard.predictor.simfleet import plan_node
from trainguard.records import Health

__all__ = ["Watched", "agreement", "offline_alarms", "report", "watch_fleet", "watch_node"]


@dataclass(frozen=True, slots=True)
class Watched:
    host: str
    gpu: int
    kind: str  # the plan's: "healthy" or a wearout.KINDS key (for the report, never the agent)
    failure_s: float | None  # the plan's failure time; None: healthy to the end
    observed_s: float  # how long the GPU was watched before its failure (or in all)
    predicted_s: float | None  # the agent's first predicted_failure
    rule_s: float | None  # the agent's first other degraded or failed finding

    @property
    def forecast_s(self) -> float | None:
        """The agent's first ``predicted_failure`` on a step that ended before the failure: the
        steps the offline scoring scores (a life's points end there, simfleet.py). The agent
        cannot know when the plan's failure came and goes on scoring the failed GPU; its alarms
        from the failure on are no forecasts (scored missed either way)."""
        if self.predicted_s is None or self.failure_s is None or self.predicted_s < self.failure_s:
            return self.predicted_s
        return None


class _Firsts:
    """The daemon's act: the time of each GPU's first prediction and first other alarm."""

    def __init__(self) -> None:
        self.predicted: dict[int, float] = {}
        self.rule: dict[int, float] = {}

    def __call__(self, judged: Any) -> None:
        for f in judged.new:
            if f.gpu is None or f.health not in (Health.DEGRADED, Health.FAILED):
                continue
            first = self.predicted if f.rule == PREDICTED_FAILURE else self.rule
            first.setdefault(f.gpu, judged.time)


def watch_node(
    node: int,
    db: str,
    state_dir: str | Path,
    *,
    model: str | Path | None = None,
    gpus: int = 8,
    hours: float = 72.0,
    step_s: float = 600.0,
    readings_per_step: int = 2,
    failing_share: float = 0.4,
    seed: int = 0,
) -> list[Watched]:
    """Node ``node`` of the fleet of ``seed``, watched by an agent for ``hours``."""
    where = Path(state_dir) / f"node-{seed}-{node}"
    where.mkdir(parents=True, exist_ok=True)
    kmsg = where / "kmsg.log"
    plan = plan_node(node, gpus, hours, failing_share, seed, kmsg_path=kmsg)
    interval = step_s / readings_per_step
    config = AgentConfig(
        db=db, state_dir=str(where), hostname=plan.host, kernel_log=str(kmsg), interval_s=interval,
        series_step_s=step_s, series_points=max(360, int(13 * 3600 / step_s) + 2), predictor=str(model or ""),
    )  # fmt: skip
    firsts = _Firsts()
    daemon = AgentDaemon(config, clock=plan.clock, backend=plan.sim, act=firsts)
    try:
        applied = 0
        # readings at the times the training fleet reads (simfleet.py), and one more at the end
        # that closes the last step
        for k in range(int(plan.life_s // step_s) * readings_per_step + 1):
            now = plan.clock.advance_to(k * interval)
            applied = plan.load_until(now, applied)
            daemon.step()
    finally:
        daemon.close()
    out = []
    for g, p in enumerate(plan.plans):
        observed = p.failure_s if p.failure_s is not None else plan.life_s
        out.append(
            Watched(plan.host, g, p.kind, p.failure_s, observed, firsts.predicted.get(g), firsts.rule.get(g))
        )
    return out


def watch_fleet(
    nodes: int, db: str, state_dir: str | Path, *, model: str | Path | None = None, **kw: Any
) -> list[Watched]:
    """Nodes 0..nodes-1 of the fleet, one after another, into one store (see `watch_node`)."""
    return [w for node in range(nodes) for w in watch_node(node, db, state_dir, model=model, **kw)]


def offline_alarms(
    predictor: Any, lives: Sequence[Any], chunk: int = 4096, horizon: int | None = None
) -> list[float | None]:
    """Each life's first step (its end) at which ``predictor`` (a `Predictor`) alarms on any
    horizon (``horizon``: on that one alone), scoring every step of the simulated fleet's own
    points (simfleet.py) at once: what the agent should raise, from the training side's series."""
    from trainguard.predictor.data import arrays
    from trainguard.predictor.evaluate import first_alarms
    from trainguard.reliability import need

    np = need("numpy", "predictor")
    h = predictor.header
    data = arrays(lives, h.width, h.step_s)
    alarm = np.zeros(len(data.life), dtype=np.float32)
    for i in range(0, len(alarm), chunk):
        rows = np.arange(i, min(i + chunk, len(alarm)))
        hit = predictor.probabilities(data.windows(rows)) >= np.asarray(h.thresholds)[None, :]
        alarm[rows] = hit.any(axis=1) if horizon is None else hit[:, horizon]
    first = first_alarms(alarm, data.life, data.t_end, 0.5, len(lives))
    return [None if math.isnan(t) else float(t) for t in first]


def agreement(watched: Sequence[Watched], offline: Sequence[float | None]) -> float:
    """The share of GPUs whose first forecast in the agent (`Watched.forecast_s`) came at the
    step of the offline scoring's first alarm (`offline_alarms`, None for none on both)."""
    same = [w.forecast_s == o for w, o in zip(watched, offline, strict=True)]  # strict: the same fleet
    return sum(same) / len(same) if same else 1.0


def report(
    watched: Sequence[Watched], horizon_s: float = 86_400.0, offline: Sequence[float | None] | None = None
) -> dict[str, Any]:
    """Per kind, the agent's predictions and its fixed rules (and ``offline``: each GPU's first
    alarm scored offline, `offline_alarms`), by first alarm as the offline evaluation scores
    them (predictor/evaluate.py: caught, early, missed, false alarm)."""
    from trainguard.reliability import need

    np = need("numpy", "predictor")
    from trainguard.predictor.evaluate import alarm_table

    def times(xs: Sequence[float | None]) -> Any:
        return np.array([math.nan if x is None else x for x in xs])

    fail = times([w.failure_s for w in watched])
    kinds = [w.kind for w in watched]
    observed = np.array([w.observed_s for w in watched])
    out = {
        "gpus": len(watched),
        "failed": int(np.sum(~np.isnan(fail))),
        "horizon_h": horizon_s / 3600,
        "predictor": alarm_table(times([w.predicted_s for w in watched]), fail, kinds, observed, horizon_s),
        "rules": alarm_table(times([w.rule_s for w in watched]), fail, kinds, observed, horizon_s),
    }
    if offline is not None:
        out["offline"] = alarm_table(times(offline), fail, kinds, observed, horizon_s)
    return out
