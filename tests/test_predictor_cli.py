"""`trainguard reliability train-predictor` and `reliability predict --titan --neural`, as a
user runs them: a model file that serves, held-out figures per failure kind, DeepSurv beside
Cox on Titan's real lifetimes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_parts import require_real
from trainguard.cli import main

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("lifelines")

TITAN = Path(__file__).resolve().parents[2] / "shared" / "data" / "titan"


@pytest.mark.slow
def test_train_predictor_on_a_simulated_fleet_saves_a_model_that_serves(tmp_path, capsys):
    from trainguard.predictor.predictor import Predictor
    from trainguard.predictor.series import GpuSeries
    from trainguard.predictor.simfleet import simulate_node

    out = tmp_path / "m.safetensors"
    argv = ["reliability", "train-predictor", "--sim", "--nodes", "8", "--hours", "36", "--epochs", "2",
            "--arch", "mlp", "--seed", "1", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_file"] == str(out) and report["model"] == "mlp"
    assert report["gpus"] == 64 and report["split_gpus"]["held_out"] == 19
    table = report["alarms"]["24h"]
    assert set(table) == {"net", "logistic", "rules"}
    assert {"healthy", "all"} <= set(table["net"])
    # the model serves a series it never saw: a GPU of a node beyond the training fleet
    life = simulate_node(99, hours=14, seed=1)[0]
    p = Predictor.load(out).predict_many([GpuSeries(life.host, life.gpu, life.points)])[0]
    assert p is not None and 0.0 <= p.probabilities[0] <= p.probabilities[1] <= 1.0


def test_train_predictor_on_a_store_without_series_says_so(tmp_path, capsys):
    from trainguard.incidents import IncidentStore

    db = tmp_path / "tg.db"
    IncidentStore(db).close()
    argv = ["reliability", "train-predictor", "--store", str(db), "--out", str(tmp_path / "m.safetensors")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "telemetry series" in err and "--sim" in err
    assert not (tmp_path / "m.safetensors").exists()


@pytest.fixture(scope="module")
def titan() -> Path:
    return require_real(
        "the Titan data set (../shared/data/titan)",
        install=f"check out the project's shared folder beside the repository, so that {TITAN} holds "
        "olcf/TitanGPULife's data/ files",
        found=(TITAN / "gc_summary_loc.csv").exists() and TITAN,
    )


@pytest.mark.slow
def test_deepsurv_scores_beside_cox_on_the_same_held_out_titan_gpus(titan, capsys):
    assert main(["reliability", "predict", "--titan", str(titan), "--neural", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    neural = result["neural"]
    cox, deep = neural["models"]["cox_ph"], neural["models"]["deepsurv"]
    assert cox["concordance"] == result["models"]["cox_ph"]  # the same model on the same split
    assert neural["n_test"] == result["n_test"] == 5651
    for m in (cox, deep):
        lo, hi = m["ci95"]
        assert lo < m["concordance"] < hi and hi - lo < 0.05
    assert deep["concordance"] > 0.78  # location carries Titan's signal; a net finds it too
    d = neural["difference_deepsurv_minus_cox"]
    assert d["ci95"][0] <= d["concordance"] <= d["ci95"][1]


def test_neural_is_refused_on_a_store(tmp_path, capsys):
    assert main(["reliability", "predict", "--store", str(tmp_path / "tg.db"), "--neural"]) == 2
    assert "--neural compares DeepSurv with Cox on Titan" in capsys.readouterr().err
