"""The neural failure predictor: trained on a small generated set of GPU series, it ranks a GPU
with a precursor above healthy ones, is calibrated, raises a finding that names the readings,
never raises on bad series, and its model file round-trips and refuses other versions."""

from __future__ import annotations

import json
import math
import random
import struct
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("sklearn")

from trainguard.actions import Advice
from trainguard.errors import InputError
from trainguard.predictor import modelfile
from trainguard.predictor.evaluate import alarm_table, first_alarms
from trainguard.predictor.predictor import RULE, Predictor, lead_time_s
from trainguard.predictor.series import Fold, GpuSeries, Point
from trainguard.predictor.store import StoreLife, lives_from_points
from trainguard.predictor.train import train
from trainguard.records import Gpu, Health, Sample

STEP = 600.0
H = 3600.0


STEADY = {
    "temp_slowdown_c": 89.0, "util_gpu_pct": 95.0, "power_w": 600.0, "power_limit_w": 700.0, "sm_clock_mhz": 1900.0,
    "sm_clock_max_mhz": 1980.0, "throttled": 0.0, "ecc_dbe_aggregate": 0.0, "remap_correctable": 0.0,
    "remap_uncorrectable": 0.0, "pcie_replay": 0.0, "nvlink_crc_errors": 0.0,
}  # fmt: skip


def _life(rng: random.Random, i: int, failing: bool, hours: float = 30.0) -> StoreLife:
    """A GPU at steady load: healthy ones with a trickle of correctable errors, failing ones with
    errors creeping ever faster for the 12 h before a failure."""
    fail = rng.uniform(16, hours) * H if failing else None
    onset = (fail or 0.0) - 12 * H
    sbe, pts = 0.0, []
    trickle = rng.uniform(0.0, 0.3)
    for k in range(int(hours * H / STEP)):
        t = k * STEP
        if fail is not None and t + STEP > fail:
            break
        sbe += trickle * rng.random()
        if failing and t > onset:
            sbe += 0.5 * math.exp((t - onset) / (3 * H))
        pts.append(
            Point(
                t, STEP, n=2, temperature_c=60 + rng.gauss(0, 1), ecc_sbe_aggregate=float(int(sbe)), **STEADY
            )
        )
    return StoreLife("h", i, tuple(pts), fail, "dbe" if failing else "healthy")


@pytest.fixture(scope="module")
def trained():
    rng = random.Random(7)
    lives = [_life(rng, i, failing=i % 2 == 0) for i in range(100)]
    return lives, train(lives, seed=0, arch="mlp", epochs=4, width=36, source="test")


def test_a_precursor_gpu_scores_above_healthy_ones(trained):
    lives, t = trained
    p = Predictor(t.header, t.net)
    healthy = [s for s in lives if s.failure_s is None]
    failing = [s for s in lives if s.failure_s is not None]
    # The failing GPUs three hours before their failure, the healthy ones at their end.
    near = [
        GpuSeries("h", s.gpu, tuple(x for x in s.points if x.t + STEP <= s.failure_s - 3 * H))
        for s in failing
    ]
    calm = [GpuSeries("h", s.gpu, s.points) for s in healthy]
    p_near = [x.probabilities[-1] for x in p.predict_many(near)]
    p_calm = [x.probabilities[-1] for x in p.predict_many(calm)]
    assert sorted(p_near)[len(p_near) // 4] > max(p_calm)  # three quarters of them above every healthy GPU


def test_held_out_probabilities_are_calibrated_and_beat_chance(trained):
    _, t = trained
    day = t.report["held_out"]["24h"]["net"]
    ap, chance = day["average_precision"], day["base_rate"]
    assert (ap - chance) / (1 - chance) > 0.5  # more than half the way from chance to a perfect ranking
    assert day["ece"] < 0.1
    assert t.report["alarms"]["24h"]["net"]["dbe"]["recall"] > 0.5


def test_an_alarmed_gpu_gets_a_predicted_failure_finding_naming_the_readings(trained):
    lives, t = trained
    p = Predictor(t.header, t.net)
    s = next(s for s in lives if s.failure_s is not None)
    findings = p.findings([GpuSeries("h", s.gpu, s.points)], now=123.0)
    assert len(findings) == 1
    f = findings[0]
    assert (f.rule, f.health, f.action, f.gpu, f.time) == (RULE, Health.DEGRADED, Advice.DRAIN, s.gpu, 123.0)
    assert "correctable ECC errors" in f.reason and f.evidence[0].startswith("ecc_sbe")
    assert f.category.value == "gpu_memory_ecc"


def test_series_that_cannot_be_scored_are_skipped_and_counted(trained):
    lives, t = trained
    p = Predictor(t.header, t.net)
    short = GpuSeries("h", 0, lives[0].points[:3])  # half an hour: too little to judge
    wrong = GpuSeries("h", 1, tuple(Point(x.t, 60.0, n=1) for x in lives[0].points))  # another step
    empty = GpuSeries("h", 2, ())
    assert p.predict_many([short, wrong, empty]) == [None, None, None]
    assert p.findings([short, wrong, empty]) == []
    assert p.skipped == 4  # wrong and empty, once per call


def test_the_model_file_round_trips(trained, tmp_path):
    lives, t = trained
    path = modelfile.save(tmp_path / "m.safetensors", t.header, t.net.state_dict())
    loaded = Predictor.load(path)
    series = [GpuSeries("h", s.gpu, s.points) for s in lives[:6]]
    before = [x.probabilities for x in Predictor(t.header, t.net).predict_many(series)]
    assert [x.probabilities for x in loaded.predict_many(series)] == before
    assert loaded.header == t.header
    assert (
        modelfile.read_header(path).training["held_out"]["24h"]["net"]["ece"]
        == t.report["held_out"]["24h"]["net"]["ece"]
    )


def _rewrite_header(path, **change):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    table = json.loads(data[8 : 8 + n])
    header = json.loads(table["__metadata__"]["trainguard_predictor"])
    header.update(change)
    table["__metadata__"]["trainguard_predictor"] = json.dumps(header)
    head = json.dumps(table).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + n :])


def test_a_model_file_of_another_version_is_refused(trained, tmp_path):
    _, t = trained
    path = modelfile.save(tmp_path / "m.safetensors", t.header, t.net.state_dict())
    _rewrite_header(path, version=modelfile.VERSION + 1)
    with pytest.raises(
        InputError,
        match=rf"version {modelfile.VERSION + 1}.*reads version {modelfile.VERSION}.*train-predictor",
    ):
        Predictor.load(path)


def test_a_file_that_is_no_model_is_refused(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(InputError, match="not a trainguard failure-predictor model file"):
        modelfile.read_header(junk)
    with pytest.raises(InputError, match="cannot read the model file"):
        modelfile.read_header(tmp_path / "absent.safetensors")


def test_reading_a_header_imports_no_torch(trained, tmp_path):
    _, t = trained
    path = modelfile.save(tmp_path / "m.safetensors", t.header, t.net.state_dict())
    probe = (
        "import sys; from trainguard.predictor.modelfile import read_header; "
        f"h = read_header({str(path)!r}); print(h.arch, 'torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["mlp", "False", "False"]


def test_lead_time_follows_the_two_horizons():
    horizons = (H, 24 * H)
    assert lead_time_s((0.5, 0.6), horizons) < H  # most of the risk is in the first hour
    assert 6 * H < lead_time_s((0.01, 0.6), horizons) < 24 * H
    assert lead_time_s((0.0, 0.0), horizons) == 24 * H


def test_first_alarms_are_scored_as_caught_early_missed_or_false():
    import numpy as np

    # four lives: caught 2 h ahead, alarmed 30 h ahead (early), never alarmed (missed), healthy but alarmed
    prob = np.array([0.1, 0.9, 0.9, 0.1, 0.1, 0.9])
    life = np.array([0, 0, 1, 2, 3, 3])
    t_end = np.array([0.0, 8 * H, 0.0, 0.0, 0.0, 5 * H])
    failure = np.array([10 * H, 30 * H, 10 * H, np.nan])
    alarms = first_alarms(prob, life, t_end, 0.5, 4)
    table = alarm_table(alarms, failure, ["dbe", "dbe", "dbe", "healthy"], np.full(4, 24 * H), 24 * H)
    assert table["dbe"] == {"n": 3, "caught": 1, "early": 1, "missed": 1, "recall": 0.3333, "precision": 0.5,
                            "median_lead_h": 2.0}  # fmt: skip
    assert table["healthy"]["false_alarms"] == 1
    assert table["all"]["precision"] == round(1 / 3, 4)


def test_a_fold_counts_empty_readings_and_keeps_counters_last():
    fold = Fold(0.0)
    fold.add(Sample(Gpu(0), 0.0, temperature_c=60.0, util_gpu_pct=90.0, pcie_replay=4))
    fold.add(Sample(Gpu(0), 1.0, error="NVML: Timeout"))
    fold.add(Sample(Gpu(0), 2.0, temperature_c=62.0, util_gpu_pct=92.0, pcie_replay=9))
    p = fold.point(60.0)
    assert (p.n, p.missed, p.temperature_c, p.util_gpu_pct, p.pcie_replay) == (3, 1, 61.0, 91.0, 9.0)


class _P:
    def __init__(self, host, gpu, t, n, values):
        self.host, self.gpu, self.t, self.step_s, self.n, self._v = host, gpu, t, STEP, n, values

    def as_dict(self):
        return self._v


class _I:
    def __init__(self, node, gpu, time, cause, resolved=False):
        from trainguard.incidents.taxonomy import RootCause

        self.node, self.gpu, self.time, self.resolved, self.root_cause = (
            node,
            gpu,
            time,
            resolved,
            RootCause(cause),
        )


def test_a_stores_series_become_lives_cut_at_each_gpus_first_failure():
    series = [_P("n1", g, k * STEP, 2, {"temperature_c": 60.0 + k}) for g in (0, 1) for k in range(10)]
    series.append(_P("n1", -1, 0.0, 0, {"xids": 1.0}))  # the node's own events: no GPU's life
    incidents = [_I("n1", 1, 5 * STEP, "faulty_gpu"), _I("n1", 1, 8 * STEP, "faulty_gpu"),
                 _I("n1", 0, 2 * STEP, "faulty_gpu", resolved=True)]  # fmt: skip
    lives = lives_from_points(series, incidents)
    assert [(x.gpu, len(x.points), x.failure_s, x.kind) for x in lives] == [
        (0, 10, None, "healthy"),
        (1, 5, 5 * STEP, "faulty_gpu"),
    ]
    with pytest.raises(InputError, match="no telemetry series"):
        lives_from_points([], incidents)
