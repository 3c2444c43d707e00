"""The detector seam in the running agent: the fixed rules by default, a detector added where the
agent is assembled judging every tick from its window (the telemetry series included), a
detector's bug counted without blinding the others, a reset GPU forgotten by every detector."""

from __future__ import annotations

from pathlib import Path

from agent_service import sim_config
from trainguard.actions import Advice
from trainguard.agent import Agent, open_node
from trainguard.agent.assemble import assemble
from trainguard.agent.prometheus import MetricsView
from trainguard.clock import VirtualClock
from trainguard.detect.detector import Window, fixed_rules
from trainguard.records import Category, Finding, Health


class Warming:
    """A stand-in for a learned predictor: flags a GPU whose series shows a closed step."""

    name = "warming"

    def __init__(self, gpu: int) -> None:
        self.gpu, self.skipped, self.windows, self.forgotten = gpu, 0, 0, [0]
        self.forgotten.clear()

    def detect(self, window: Window) -> list[Finding]:
        self.windows += 1
        if window.series is None or not window.series.points(self.gpu):
            return []
        last = window.series.points(self.gpu)[-1]
        why = f"predicted to fail: {last['temperature_c']:.0f} C over the last step"
        return [Finding("warming", Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, gpu=self.gpu,
                        time=window.time, category=Category.THERMAL_POWER)]  # fmt: skip

    def forget(self, gpu: int) -> None:
        self.forgotten.append(gpu)


class Broken:
    name, skipped = "broken", 0

    def detect(self, window: Window) -> list[Finding]:
        raise ZeroDivisionError("a model's bug")

    def forget(self, gpu: int) -> None:
        pass


def test_an_agent_runs_the_fixed_rules_unless_given_detectors() -> None:
    clock = VirtualClock()
    agent = Agent.of(open_node("sim", n_gpus=2, clock=clock), clock=clock)
    try:
        assert [d.name for d in agent.detectors] == ["sample_rules", "xid_rules"]
    finally:
        agent.close()


def test_a_detector_added_at_assembly_reads_the_series_and_its_finding_is_an_incident(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    warming = Warming(gpu=5)
    daemon = assemble(
        sim_config(tmp_path, series_step_s=10.0), clock=clock, detectors=[*fixed_rules(), warming]
    )
    try:
        daemon.step()
        clock.advance(5.0)
        assert daemon.step().verdict.gpus[5].health is Health.OK  # type: ignore[union-attr]
        clock.advance(5.0)  # the first step closes: the detector sees it in the series
        verdict = daemon.step().verdict
        assert verdict is not None and verdict.gpus[5].health is Health.DEGRADED
        assert verdict.gpus[5].reasons[0].startswith("predicted to fail")
        assert warming.windows == 3
        (incident,) = daemon.store().incidents()
        assert incident.gpu == 5 and incident.action == "run_diagnostics"
    finally:
        daemon.close()


def test_a_detector_that_raises_is_counted_and_the_others_still_judge(tmp_path: Path) -> None:
    daemon = assemble(sim_config(tmp_path), detectors=[Broken(), *fixed_rules()])
    try:
        daemon.sim.now().xid(79, gpu=3)
        snap = daemon.step()
        assert snap.verdict is not None and snap.verdict.gpus[3].health is Health.FAILED
        assert snap.health is Health.DEGRADED and "broken" in snap.problems[-1]
        daemon.step()
        assert daemon.tally.copy().errors["detector"] == 2 and daemon.agent.failures["broken"] == 2
        assert 'trainguard_agent_errors_total{source="detector"} 2.0' in MetricsView(daemon).render().decode()
    finally:
        daemon.close()


def test_a_reset_gpu_is_forgotten_by_every_detector() -> None:
    clock = VirtualClock()
    warming = Warming(gpu=1)
    agent = Agent.of(
        open_node("sim", n_gpus=2, clock=clock), clock=clock, detectors=[*fixed_rules(), warming]
    )
    try:
        assert agent.node is not None and agent.node.sim is not None
        agent.node.sim.now().xid(13, gpu=1).xid(13, gpu=1).xid(13, gpu=1)  # a run of them: the GPU's
        assert "xid" in [f.rule for f in agent.tick().gpus[1].findings]
        agent.gpu_was_reset(1)
        assert warming.forgotten == [1]
        assert "xid" not in [f.rule for f in agent.tick().gpus[1].findings]  # the Xid rules forgot it too
    finally:
        agent.close()
