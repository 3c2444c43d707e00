"""Trained failure predictors served in real node agents over the simulated wear-out fleet: the
agent raises ``predicted_failure`` exactly where the offline scoring of the same fleet does, and
a model trained with `train-predictor --store` on what agents wrote to a store (SQLite and
PostgreSQL) raises it ahead of failures with a precursor on nodes it never saw, and on none of
their healthy GPUs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pgserver import PASSWORD, USER, PgServer, pg_url, postgres  # noqa: F401 - fixtures
from trainguard.agent.fleet_run import agreement, offline_alarms, report, watch_fleet, watch_node
from trainguard.cli import main

np = pytest.importorskip("numpy")
pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("sklearn")

DAY = 86_400.0
PRECURSORS = {"dbe", "remap_failure", "thermal", "off_bus", "hang"}


@pytest.fixture(scope="module")
def sim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small MLP trained on a simulated fleet (seed 11), as `train-predictor --sim` trains."""
    from trainguard.predictor import modelfile
    from trainguard.predictor.simfleet import simulate_fleet
    from trainguard.predictor.train import train

    t = train(simulate_fleet(nodes=6, hours=36, seed=11), seed=0, arch="mlp", epochs=3, source="test")
    return modelfile.save(tmp_path_factory.mktemp("model") / "sim.safetensors", t.header, t.net.state_dict())


class Recording:
    """A `Predictor` whose every prediction is kept, by GPU and the end of its step."""

    def __init__(self, predictor: Any) -> None:
        self.predictor, self.header, self.skipped = predictor, predictor.header, 0
        self.seen: dict[tuple[int, float], tuple[float, ...]] = {}

    def predict_many(self, series: list[Any]) -> list[Any]:
        out = self.predictor.predict_many(series)
        self.seen.update({(s.gpu, p.time): p.probabilities for s, p in zip(series, out, strict=True) if p})
        return out


@pytest.mark.slow
def test_the_agent_scores_every_step_as_the_offline_scoring_of_the_same_fleet(sim_model, tmp_path) -> None:
    from trainguard.agent import AgentConfig, AgentDaemon
    from trainguard.detect.detector import fixed_rules
    from trainguard.predictor.data import arrays
    from trainguard.predictor.detector import FailurePredictor
    from trainguard.predictor.predictor import Predictor
    from trainguard.predictor.simfleet import plan_node, simulate_node

    # Node 0 of the fleet of seed 12 (thermal, dbe and hang GPUs beside five healthy ones), read
    # by an agent at the times the training fleet reads it.
    predictor = Predictor.load(sim_model)
    lives = simulate_node(0, hours=36, seed=12)
    assert [x.kind for x in lives] == [
        "healthy",
        "healthy",
        "thermal",
        "healthy",
        "dbe",
        "healthy",
        "healthy",
        "hang",
    ]
    plan = plan_node(0, hours=36, seed=12, kmsg_path=tmp_path / "kmsg.log")
    recording = Recording(predictor)
    config = AgentConfig(db=str(tmp_path / "tg.db"), state_dir=str(tmp_path), hostname=plan.host,
                         kernel_log=str(tmp_path / "kmsg.log"), interval_s=300.0, series_step_s=600.0)  # fmt: skip
    detector = FailurePredictor(recording)  # type: ignore[arg-type]
    daemon = AgentDaemon(config, clock=plan.clock, backend=plan.sim, detectors=[*fixed_rules(), detector])
    try:
        applied = 0
        for k in range(36 * 12 + 1):
            applied = plan.load_until(plan.clock.advance_to(k * 300.0), applied)
            daemon.step()
    finally:
        daemon.close()
    data = arrays(lives, predictor.header.width, 600.0)
    offline = predictor.probabilities(data.windows(np.arange(len(data.life))))
    compared = 0
    for life, t_end, probs in zip(data.life, data.t_end, offline, strict=True):
        agent = recording.seen[(lives[life].gpu, float(t_end))]  # every step the offline scoring scores
        assert agent == pytest.approx(tuple(probs), abs=1e-5), (lives[life].kind, t_end)
        compared += 1
    assert compared == len(data.life) > 8 * 50 and detector.scored >= compared


@pytest.mark.slow
def test_a_failed_gpu_gets_no_forecast_and_every_first_alarm_is_the_offline_scorings(
    sim_model, tmp_path
) -> None:
    from trainguard.predictor.predictor import Predictor
    from trainguard.predictor.simfleet import simulate_node

    # Node 1 of the fleet of seed 1 over 24 h: its GPU 4 fails with no precursor (dbe_sudden). The
    # model, scoring the failed GPU on, would alarm from the failure's own symptoms, where the
    # offline scoring (a life's points end before its failure) has no step to score; the rules
    # found it failed first, so the agent forecasts nothing of it (agent/tick.py).
    served = watch_node(1, str(tmp_path / "tg.db"), tmp_path, model=sim_model, hours=24.0, seed=1)
    offline = offline_alarms(Predictor.load(sim_model), simulate_node(1, hours=24.0, seed=1))
    after = [
        (w.gpu, w.kind)
        for w in served
        if w.predicted_s is not None and w.predicted_s >= (w.failure_s or math.inf)
    ]
    assert after == []
    assert offline[4] is None and served[4].rule_s is not None  # the rules saw the failure
    assert served[4].kind == "dbe_sudden" and served[4].predicted_s is None
    assert [w.forecast_s for w in served] == offline  # every other GPU's first alarm, step for step
    assert agreement(served, offline) == 1.0
    scored = report(served, offline=offline)
    assert scored["predictor"] == scored["offline"]  # an alarm after the failure is a miss in both
    assert sum(w.predicted_s is not None for w in served) >= 3  # alarms before failures agree too


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """(what the agents are configured with, what the CLI is given: no password on a command line)."""
    if request.param == "sqlite":
        return str(tmp_path / "tg.db"), str(tmp_path / "tg.db")
    server: PgServer = request.getfixturevalue("postgres")
    db = server.create_db()
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{server.port}:{db}:{USER}:{PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    return server.url(db), server.url(db, password=False)


@pytest.mark.slow
def test_a_model_trained_on_what_agents_stored_is_served_by_agents_on_new_nodes(
    backend: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainguard.incidents import IncidentStore
    from trainguard.predictor.predictor import Predictor
    from trainguard.predictor.simfleet import simulate_node
    from trainguard.predictor.store import lives_from_store

    agents_db, cli_db = backend
    run = {"hours": 36.0, "failing_share": 0.6, "readings_per_step": 1}
    trained_on = watch_fleet(
        8, agents_db, tmp_path / "train", seed=21, **run
    )  # no model: series and incidents
    out = tmp_path / "fleet.safetensors"
    argv = ["reliability", "train-predictor", "--store", cli_db, "--arch", "mlp", "--epochs", "3",
            "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    failed = [w for w in trained_on if w.failure_s is not None]
    assert report["gpus"] == 64 and report["source"] == f"store:{cli_db}"
    # the labels are the incidents' GPU-hardware root causes (the agent's evidence), not the plan's kinds
    assert set(report["kinds"]) <= {
        "healthy",
        "faulty_gpu",
        "gpu_hbm_memory",
        "gpu_thermal",
        "gpu_system_processor",
    }
    assert 0.6 * len(failed) <= report["failed"] <= len(failed)

    served = watch_fleet(2, agents_db, tmp_path / "serve", model=out, seed=22, **run)  # nodes it never saw
    model = Predictor.load(out)
    offline = [t for node in range(2) for t in offline_alarms(model, simulate_node(node, seed=22, **run))]
    assert [w.forecast_s for w in served] == offline  # the agents serve the trained model, step for step
    caught = [w for w in served if w.kind in PRECURSORS and w.predicted_s is not None
              and 0 < (w.failure_s or 0) - w.predicted_s <= DAY]  # fmt: skip
    assert caught, served  # ahead of a failure with a precursor
    with IncidentStore(agents_db) as store:
        forecasts = [i for i in store.incidents() if i.evidence and i.evidence[0] == "predicted_failure"]
        lives = {(x.host, x.gpu): x for x in lives_from_store(store)}
    alarmed = {(w.host, w.gpu) for w in served if w.predicted_s is not None}
    assert {(i.node, i.gpu) for i in forecasts} == alarmed
    assert {i.root_cause.value for i in forecasts} == {"unknown"}
    for w in served:  # a forecast is never a label: a GPU's label is its failure, the rules' incident
        if w.predicted_s is None:
            continue
        failure_s = lives[(w.host, w.gpu)].failure_s
        first = min(i.time for i in forecasts if (i.node, i.gpu) == (w.host, w.gpu))
        if w.forecast_s is not None:  # forecast before the failure: labelled by the failure, after it
            assert failure_s is None or failure_s > first
        else:  # alarmed only once it had failed (scored missed): labelled by the failure, before it
            assert failure_s is not None and failure_s < first
