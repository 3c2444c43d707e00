"""The failure predictor served in the node agent: the agent's series gives the model the points
it trained on, each GPU is scored once per closed step, an alarm is held without flicker and
dropped on a reset, a predictor's failure is counted, a model file is checked at start, and a
forecast is never a root cause or a training label. A scripted model stands in for the net
here (no torch); test_predictor_serve.py serves trained ones."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_service import sim_config
from trainguard.actions import Advice
from trainguard.agent import AgentDaemon
from trainguard.agent.judge import incidents_for
from trainguard.cli import main
from trainguard.clock import VirtualClock
from trainguard.detect.detector import PREDICTED_FAILURE, fixed_rules
from trainguard.errors import ConfigError
from trainguard.predictor.detector import FailurePredictor
from trainguard.predictor.series import Fold, point_of_values
from trainguard.predictor.store import lives_from_points
from trainguard.records import Category, Finding, Health
from trainguard.telemetry.series import Series
from trainguard.telemetry.sim import SimNode, wearout
from trainguard.telemetry.sim.faults import ThermalRunaway

STEP, H = 600.0, 3600.0


def test_the_agents_series_gives_the_model_the_points_the_training_fleet_folds() -> None:
    # A GPU whose readings time out ever more often (a hang's precursor), one throttled now and
    # then, one healthy: the agent's series, read through point_of_values, and the simulated
    # fleet's Fold must give the model the same points.
    clock = VirtualClock()
    sim = SimNode(n_gpus=3, seed=4, clock=clock)
    sim.schedule(0.0, wearout.Wear(0, wearout.ScrapeDecay(0.0, 0.8, 2.0)))
    sim.schedule(0.0, wearout.Wear(1, wearout.FlakyScrape(0.0, 0.3)))
    sim.schedule(3000.0, wearout.Wear(2, wearout.ThermalDrift(3000.0, 4.0)))
    sim.schedule(5 * H, ThermalRunaway(2, rate_c_per_s=0.2))
    series = Series(step_s=STEP, depth=100)
    folds: dict[tuple[int, float], Fold] = {}
    for k in range(1, 6 * 12 + 1):  # 6 h, a reading every 5 minutes
        now = clock.advance_to(k * 300.0)
        samples = sim.sample()
        series.add(now, samples, [])
        start = (now // STEP) * STEP
        for s in samples:
            folds.setdefault((s.gpu.index, start), Fold(start)).add(s)
    compared = missed = throttled = 0
    for gpu in range(3):
        for sp in series.points(gpu):
            ours = point_of_values(sp.t, sp.step_s, sp.n, sp.as_dict())
            theirs = folds[(gpu, sp.t)].point(STEP)
            for name in ours.__slots__:
                a, b = getattr(ours, name), getattr(theirs, name)
                assert a == b or (isinstance(a, float) and a == pytest.approx(b)), (gpu, sp.t, name, a, b)
            compared += 1
            missed += ours.missed
            throttled += bool(ours.throttled)
    assert compared == 3 * 36 and missed > 10 and throttled  # empty and throttled readings were read


# -- a scripted model ------------------------------------------------------------------------------


@dataclass
class _Header:
    width: int = 3
    step_s: float = STEP
    thresholds: tuple[float, ...] = (0.5, 0.6)
    horizons_s: tuple[float, ...] = (H, 24 * H)


@dataclass
class Scripted:
    """Predictor's serving surface: P(24 h) per GPU from ``p24`` (gpu, scoring number) -> p."""

    p24: Any
    header: _Header = field(default_factory=_Header)
    skipped: int = 0
    calls: list[list[tuple[int, int, int]]] = field(default_factory=list)  # per call: (gpu, points, missed)
    driver: str = "ecc_sbe"

    def predict_many(self, series: list[Any]) -> list[Any]:
        from trainguard.predictor.predictor import Prediction, lead_time_s

        self.calls.append([(s.gpu, len(s.points), sum(p.missed for p in s.points)) for s in series])
        out = []
        for s in series:
            p = (min(0.9, self.p24(s.gpu, len(self.calls)) / 4), self.p24(s.gpu, len(self.calls)))
            alarm = any(v >= t for v, t in zip(p, self.header.thresholds, strict=True))
            drivers = ((self.driver, 0.8, f"{self.driver} rose"),) if alarm else ()
            out.append(Prediction("h", s.gpu, s.points[-1].t + STEP, self.header.horizons_s, p, alarm,
                                  24 * H if alarm else None, lead_time_s(p, self.header.horizons_s), drivers))  # fmt: skip
        return out


def _agent(
    tmp_path: Path, detector: FailurePredictor, gpus: int = 2, **kw: Any
) -> tuple[AgentDaemon, VirtualClock]:
    clock = VirtualClock(0.0)
    config = sim_config(tmp_path, gpus=gpus, series_step_s=STEP, **kw)
    return AgentDaemon(config, clock=clock, detectors=[*fixed_rules(), detector]), clock


def test_each_gpu_is_scored_once_per_closed_step_in_one_batch(tmp_path: Path) -> None:
    model = Scripted(lambda gpu, n: 0.1)
    daemon, clock = _agent(tmp_path, FailurePredictor(model))  # type: ignore[arg-type]
    try:
        for _ in range(12):  # an hour of ticks every 5 minutes: six steps close
            clock.advance(300.0)
            daemon.step()
    finally:
        daemon.close()
    assert len(model.calls) == 6  # not once per tick
    assert all(sorted(g for g, _, _ in call) == [0, 1] for call in model.calls)  # the node's GPUs together
    assert [call[0][1] for call in model.calls] == [1, 2, 3, 4, 4, 4]  # a window is width + 1 points


def test_an_alarm_is_held_until_the_probability_falls_below_half_its_threshold(tmp_path: Path) -> None:
    script = {1: 0.1, 2: 0.7, 3: 0.4, 4: 0.65, 5: 0.2, 6: 0.8}  # scoring -> P(24 h) of GPU 1; threshold 0.6
    model = Scripted(lambda gpu, n: script.get(n, 0.1) if gpu == 1 else 0.1)
    detector = FailurePredictor(model)  # type: ignore[arg-type]
    daemon, clock = _agent(tmp_path, detector)
    held = []
    try:
        for _ in range(12):
            clock.advance(300.0)
            snap = daemon.step()
            predicted = [f for g in snap.verdict.gpus for f in g.findings if f.rule == PREDICTED_FAILURE]
            held.append([f.gpu for f in predicted])
            if predicted:
                model.driver = "temperature"  # the readings change; the category stays the onset's
        incidents = daemon.store().incidents()
    finally:
        daemon.close()
    # scored at ticks 2, 4, 6, 8, 10, 12: alarmed at 4, held through 0.4 (>= 0.3), cleared at 0.2
    assert held == [[], [], [], [1], [1], [1], [1], [1], [1], [], [], [1]]
    predicted = [i for i in incidents if i.evidence[0] == PREDICTED_FAILURE]
    assert [(i.gpu, i.time, i.category) for i in predicted] == [
        (1, 1200.0, "gpu_memory_ecc"),
        (1, 3600.0, "thermal_power"),  # a new alarm: the category of its own onset
    ]
    first = predicted[0]
    assert "within 24 h 0.70" in first.summary and "expected in about" in first.summary
    assert "ecc_sbe rose" in first.summary and first.action == "drain"


def test_a_reset_gpu_loses_its_alarm_until_its_next_step_is_scored(tmp_path: Path) -> None:
    model = Scripted(lambda gpu, n: 0.9 if gpu == 0 else 0.1)
    detector = FailurePredictor(model)  # type: ignore[arg-type]
    daemon, clock = _agent(tmp_path, detector)
    try:
        for _ in range(2):
            clock.advance(300.0)
            daemon.step()
        assert [f.gpu for f in detector.detect(_window(daemon))] == [0]
        daemon.agent.gpu_was_reset(0)
        assert detector.detect(_window(daemon)) == []  # nothing new read: no alarm restated
        for _ in range(2):
            clock.advance(300.0)
            daemon.step()  # the second closes a step: scored afresh, alarmed again (a reset repairs no wear)
        assert [f.gpu for f in detector.detect(_window(daemon))] == [0]
        assert len(model.calls) == 2
    finally:
        daemon.close()


def _window(daemon: AgentDaemon) -> Any:
    from trainguard.detect.detector import Window
    from trainguard.detect.thresholds import Thresholds

    return Window(daemon.clock.time(), (), (), (), Thresholds(), daemon.series)


def test_a_model_that_raises_is_counted_and_the_rules_still_judge(tmp_path: Path) -> None:
    def boom(gpu: int, n: int) -> float:
        raise RuntimeError("a torn weight")

    detector = FailurePredictor(Scripted(boom))  # type: ignore[arg-type]
    daemon, clock = _agent(tmp_path, detector)
    try:
        clock.advance(300.0)
        daemon.step()
        daemon.sim.now().xid(79, gpu=1)
        clock.advance(300.0)
        snap = daemon.step()  # a step closes: the model raises
    finally:
        daemon.close()
    assert detector.failed == 1 and detector.skipped == 2 and not daemon.agent.failures
    assert {f.rule for g in snap.verdict.gpus for f in g.findings} >= {"xid"}


# -- the model file, checked at start -----------------------------------------------------------------


def _header_only(path: Path, step_s: float = STEP, width: int = 72) -> Path:
    """A model file with a version-1 header and no weights (what the start-up checks read)."""
    header = {"arch": "mlp", "size": 1, "step_s": step_s, "width": width, "horizons_s": [H, 24 * H],
              "channels": [], "features": [], "mean": [0.0], "std": [1.0], "platt": [[1, 0], [1, 0]],
              "thresholds": [0.5, 0.5], "training": {}, "format": "trainguard-predictor", "version": 1}  # fmt: skip
    head = json.dumps({"__metadata__": {"trainguard_predictor": json.dumps(header)}}).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head)
    return path


def test_an_agent_refuses_a_model_of_another_step_naming_the_setting(tmp_path: Path) -> None:
    model = _header_only(tmp_path / "m.safetensors", step_s=STEP)
    with pytest.raises(ConfigError, match=r"600 s steps.*keeps 60 s steps: set series_step_s = 600"):
        AgentDaemon(sim_config(tmp_path, predictor=str(model)))
    with pytest.raises(ConfigError, match=r"last 73 points.*keeps 50: set series_points >= 73"):
        AgentDaemon(sim_config(tmp_path, predictor=str(model), series_step_s=STEP, series_points=50))
    with pytest.raises(ConfigError, match="agent predictor: cannot read the model file"):
        AgentDaemon(sim_config(tmp_path, predictor=str(tmp_path / "absent.safetensors")))


def test_trainguard_agent_with_a_model_of_another_step_exits_saying_what_to_set(
    tmp_path: Path, capsys
) -> None:
    model = _header_only(tmp_path / "m.safetensors")
    argv = ["agent", "--backend", "sim", "--db", str(tmp_path / "tg.db"), "--state-dir", str(tmp_path),
            "--listen", "127.0.0.1:0", "--predictor", str(model)]  # fmt: skip
    assert main(argv) == 2
    assert "set series_step_s = 600 in [agent]" in capsys.readouterr().err


# -- a forecast is no failure ----------------------------------------------------------------------------


def test_a_predicted_failure_has_no_root_cause_and_labels_nothing() -> None:
    forecast = Finding(PREDICTED_FAILURE, Health.DEGRADED, Advice.DRAIN, "P(failure) within 24 h 0.9",
                       gpu=1, time=5 * STEP, category=Category.GPU_MEMORY_ECC)  # fmt: skip
    (incident,) = incidents_for([forecast], "n1", 5 * STEP)
    assert incident.root_cause.value == "unknown" and incident.category == "gpu_memory_ecc"

    @dataclass
    class P:
        host: str
        gpu: int
        t: float
        step_s: float = STEP
        n: int = 2

        def as_dict(self) -> dict[str, float]:
            return {"temperature_c": 60.0}

    lives = lives_from_points([P("n1", 1, k * STEP) for k in range(10)], [incident])
    assert [(x.failure_s, x.kind, len(x.points)) for x in lives] == [(None, "healthy", 10)]


def test_scoring_states_nothing_without_a_series() -> None:
    from trainguard.detect.detector import Window
    from trainguard.detect.thresholds import Thresholds

    model = Scripted(lambda gpu, n: 0.9)
    detector = FailurePredictor(model)  # type: ignore[arg-type]
    assert detector.detect(Window(0.0, (), (), (), Thresholds(), None)) == [] and model.calls == []


# -- remediation acts on a forecast only where the policy opts in ----------------------------------------


@pytest.mark.parametrize("opted_in", [False, True])
def test_an_agent_drains_its_node_on_a_forecast_only_where_the_policy_says(
    tmp_path: Path, opted_in: bool
) -> None:
    from trainguard.agent.assemble import assemble, remediation_of

    text = "[remediation]\nenforce = true\n" + (
        '[remediation.actions]\npredicted_failure = "drain"\n' if opted_in else ""
    )
    (tmp_path / "policy.toml").write_text(text)
    clock = VirtualClock(0.0)
    detector = FailurePredictor(Scripted(lambda gpu, n: 0.9 if gpu == 1 else 0.1))  # type: ignore[arg-type]
    config = sim_config(tmp_path, gpus=2, series_step_s=STEP, policy=str(tmp_path / "policy.toml"))
    daemon = assemble(config, clock=clock, detectors=[*fixed_rules(), detector])
    try:
        for _ in range(3):
            clock.advance(300.0)
            daemon.step()
        remediation = remediation_of(daemon)
        assert remediation is not None
        remediation.flush()
        node = remediation.remediator.providers["node"]
        records = [i for i in daemon.store().incidents() if i.detected_by == "remediation"]
    finally:
        daemon.close()
    if opted_in:
        assert node.state("node-a")[0] == "drained"  # type: ignore[attr-defined]
        assert [(r.action, r.gpu, r.resolution) for r in records] == [("drain", 1, "done: node-a drained")]
        assert dict(remediation.counts) == {("drain", "done"): 1}  # no reset, no reboot
    else:
        assert node.state("node-a")[0] == "idle" and records == []  # type: ignore[attr-defined]
        assert not remediation.counts


@pytest.mark.parametrize("name", ["trainguard.agent.fleet_run", "trainguard.predictor.detector"])
def test_the_examples_in_the_docstrings_run(name: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0


def test_a_gpu_a_detector_found_failed_gets_no_forecast_until_it_is_reset(tmp_path: Path) -> None:
    # The model keeps alarming on a GPU that has failed (its failure's own symptoms push it): that
    # is no forecast, and the incident store must not get one after the fact.
    model = Scripted(lambda gpu, n: 0.9)
    daemon, clock = _agent(tmp_path, FailurePredictor(model))  # type: ignore[arg-type]

    def forecasts(snap: Any) -> list[int]:
        return sorted(f.gpu for g in snap.verdict.gpus for f in g.findings if f.rule == PREDICTED_FAILURE)

    try:
        clock.advance(300.0)
        daemon.step()
        daemon.sim.now().xid(48, gpu=1)  # a double-bit ECC error: failed until reset
        clock.advance(300.0)
        snap = daemon.step()  # a step closes: the model alarms on both, the rules fail GPU 1
        failed = [g.gpu.index for g in snap.verdict.gpus if g.health is Health.FAILED]
        assert failed == [1] and forecasts(snap) == [0]
        for _ in range(6):  # the model stays alarmed on GPU 1: still no forecast of it
            clock.advance(300.0)
            assert forecasts(daemon.step()) == [0]
        daemon.agent.gpu_was_reset(1)
        daemon.sim.now().reset_gpu(1)
        for _ in range(2):
            clock.advance(300.0)
            snap = daemon.step()
        assert forecasts(snap) == [0, 1]  # reset: a forecast of GPU 1 is one again
    finally:
        daemon.close()
