"""Survival fits and failure prediction on the Titan supercomputer's real GPU lifetimes
(read from ../shared/data/titan, never copied into the repository)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_parts import require_real
from trainguard.cli import main
from trainguard.errors import InputError

pytest.importorskip("lifelines")

TITAN = Path(__file__).resolve().parents[2] / "shared" / "data" / "titan"


@pytest.fixture(scope="module")
def titan_data() -> Path:
    return require_real(
        "the Titan data set (../shared/data/titan)",
        install=f"check out the project's shared folder beside the repository, so that {TITAN} holds "
        "olcf/TitanGPULife's data/ files",
        found=(TITAN / "gc_summary_loc.csv").exists() and TITAN,
    )


needs_titan = pytest.mark.usefixtures("titan_data")


@pytest.fixture(scope="module")
def fit(titan_data):
    from trainguard.reliability.fit import fit_titan
    from trainguard.reliability.titan import load_titan

    return fit_titan(load_titan(TITAN))


@needs_titan
def test_old_batch_counts_and_survival_match_the_data(fit):
    old = fit["batches"]["old"]
    assert (old["n"], old["failures"]) == (18_837, 5_027)
    # The SC'20 paper's story: almost no failures for two years, then wear-out.
    assert old["km"]["1"] > 0.99 and old["km"]["2"] > 0.98
    assert 0.60 < old["km"]["5"] < 0.75
    lo, hi = old["km_ci95"]["5"]
    assert lo < old["km"]["5"] < hi
    assert old["weibull_shape"] > 2  # a rising hazard: wear-out, not random failures
    assert old["aic_weibull"] < old["aic_exponential"]
    assert old["dbe_share"] + old["otb_share"] == pytest.approx(1.0)
    assert old["dbe_share"] > old["otb_share"]


@needs_titan
def test_the_new_batch_outlives_the_old_one(fit):
    old, new = fit["batches"]["old"], fit["batches"]["new"]
    assert new["n"] == 11_370
    assert new["km"]["3"] > old["km"]["3"]
    assert new["km"]["5"] is None  # observed for less than four years: no estimate, not a guess
    assert new["mttf_years_exponential"] > 10 * old["mttf_years_exponential"]


@needs_titan
def test_the_top_cage_fails_most_in_the_old_batch(fit):
    cages = fit["batches"]["old"]["by_cage"]
    rate = {c: g["rate"] for c, g in cages["groups"].items()}
    assert rate["0"] < rate["1"] < rate["2"]
    assert cages["logrank_p"] < 1e-6


@needs_titan
def test_fit_cli_prints_the_issue_keys_and_draws_the_curves(tmp_path, capsys):
    plot = tmp_path / "km.png"
    assert main(["reliability", "fit", "--titan", str(TITAN), "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    for batch in ("old", "new"):
        b = out["batches"][batch]
        for key in ("n", "failures", "km", "weibull_shape", "weibull_scale_years"):
            assert key in b
        assert set(b["km"]) == {"1", "2", "3", "4", "5"}
    assert plot.stat().st_size > 20_000


def test_a_folder_without_the_titan_file_is_an_input_error(tmp_path):
    from trainguard.reliability.titan import load_titan

    with pytest.raises(InputError, match=r"gc_summary_loc\.csv"):
        load_titan(tmp_path)


@needs_titan
@pytest.mark.slow
def test_location_predicts_failure_on_held_out_gpus():
    from trainguard.reliability.predict import predict_titan
    from trainguard.reliability.titan import load_titan

    result = predict_titan(load_titan(TITAN), seed=0)
    assert result["n_train"] + result["n_test"] == 18_837
    assert result["concordance_holdout"] > 0.7  # vs 0.5 for no covariates
    for model, c in result["models"].items():
        assert c > 0.7, model
    assert (
        1
        < result["hazard_ratio_by_cage"]["1"]["hazard_ratio"]
        < result["hazard_ratio_by_cage"]["2"]["hazard_ratio"]
    )
    assert result["failed_share_top_decile"] > result["failed_share_holdout"]
    assert len(result["highest_risk"]) == 10


def test_concordance_of_a_useless_score_is_the_half_baseline():
    # The self-check behind concordance_holdout: a score unrelated to the outcome ranks at 0.5,
    # a perfect one at 1.0.
    import numpy as np
    import pandas as pd

    from trainguard.reliability.predict import concordance

    rng = np.random.default_rng(0)
    years = rng.exponential(3.0, 4000)
    df = pd.DataFrame({"years": years, "dead": np.ones(4000, dtype=int)})
    assert concordance(df, rng.random(4000)) == pytest.approx(0.5, abs=0.02)
    assert concordance(df, -years) == pytest.approx(1.0)
