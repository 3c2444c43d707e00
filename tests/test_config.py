"""Settings from a TOML file, TRAINGUARD_* variables and --set flags: precedence and clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainguard.config import load
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "trainguard.toml"
    path.write_text(text)
    return path


def test_flag_beats_env_beats_file_beats_default(tmp_path):
    path = write(
        tmp_path, "[thresholds]\npcie_replay_per_min = 20\nnvlink_crc_per_min = 50\napp_xid_repeat = 5\n"
    )
    env = {"TRAINGUARD_THRESHOLDS_NVLINK_CRC_PER_MIN": "70", "TRAINGUARD_THRESHOLDS_APP_XID_REPEAT": "6"}
    th = load(Thresholds, "thresholds", path=path, env=env, overrides=["thresholds.app_xid_repeat=7"])
    assert (th.pcie_replay_per_min, th.nvlink_crc_per_min, th.app_xid_repeat) == (20.0, 70.0, 7)
    assert th.thermal_margin_c == Thresholds().thermal_margin_c


def test_the_config_file_can_come_from_the_environment_and_lists_become_tuples(tmp_path):
    path = write(tmp_path, "[thresholds]\napp_xids = [13, 31, 43, 109]\n")
    th = load(Thresholds, "thresholds", env={"TRAINGUARD_CONFIG": str(path)})
    assert th.app_xids == (13, 31, 43, 109)
    assert load(Thresholds, "thresholds", env={}, overrides=["thresholds.app_xids=13, 31"]).app_xids == (
        13,
        31,
    )


def test_other_sections_of_the_file_and_of_the_flags_are_left_alone(tmp_path):
    path = write(tmp_path, "[agent]\ninterval = 5\n[thresholds]\nxid_hold_s = 60\n")
    th = load(Thresholds, "thresholds", path=path, env={}, overrides=["agent.interval=2"])
    assert th.xid_hold_s == 60.0


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"overrides": ["thresholds.pcie_replay_per_mn=3"]}, "did you mean 'pcie_replay_per_min'"),
        ({"env": {"TRAINGUARD_THRESHOLDS_PCIE_REPLAY_PER_MIN": "many"}}, "'many' is not float"),
        ({"overrides": ["thresholds.app_xid_repeat=2.5"]}, "is not int"),
        ({"overrides": ["pcie_replay_per_min=3"]}, "expected SECTION.FIELD=VALUE"),
        ({"path": "/nonexistent/trainguard.toml"}, "does not exist"),
    ],
)
def test_bad_settings_are_errors_that_name_the_setting(source, message):
    kwargs = {"env": {}, **source}
    with pytest.raises(ConfigError, match=message):
        load(Thresholds, "thresholds", **kwargs)


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "[thresholds\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(Thresholds, "thresholds", path=path, env={})


def test_check_applies_a_threshold_override():
    base = [sys.executable, "-m", "trainguard.cli", "check", "--scenario", "pcie-replay", "--json"]
    default = subprocess.run(base, capture_output=True, text=True)
    relaxed = subprocess.run(
        [*base, "--set", "thresholds.pcie_replay_per_min=1e6"], capture_output=True, text=True
    )
    assert "replays in 30 s" in default.stdout  # the finding's reason, not the scenario's description
    assert "replays in 30 s" not in relaxed.stdout and "downtrained" in relaxed.stdout
    typo = subprocess.run([*base, "--set", "thresholds.pcie_replay=1"], capture_output=True, text=True)
    assert typo.returncode == 3 and "unknown setting 'pcie_replay'" in typo.stderr


def test_run_hands_the_thresholds_to_the_supervisors_health_agent(tmp_path, monkeypatch):
    from trainguard.cli import build_parser
    from trainguard.cli.run import config_from_args
    from trainguard.supervisor.health import NodeHealth

    path = write(tmp_path, "[thresholds]\nxid_hold_s = 60\n")
    monkeypatch.setenv("TRAINGUARD_CONFIG", str(path))
    argv = ["run", "--standalone", "--set", "thresholds.pcie_replay_per_min=20", "--", "python", "train.py"]
    cfg = config_from_args(build_parser().parse_args(argv))
    assert (cfg.health.thresholds.pcie_replay_per_min, cfg.health.thresholds.xid_hold_s) == (20.0, 60.0)
    health = NodeHealth("sim", 2, tmp_path, thresholds=cfg.health.thresholds)
    assert health.source == "local" and health._verdicts.agent.thresholds == cfg.health.thresholds


def test_run_takes_the_warm_pools_refill_delay_and_refuses_a_negative_one():
    from trainguard.cli import build_parser
    from trainguard.cli.run import config_from_args
    from trainguard.errors import ConfigError

    def cfg(*flags: str):
        return config_from_args(
            build_parser().parse_args(["run", "--standalone", *flags, "--", "python", "t.py"])
        )

    assert cfg().standby.refill_delay_s == 2.0
    assert cfg("--warm-refill-delay", "30").standby.refill_delay_s == 30.0
    with pytest.raises(ConfigError, match="--warm-refill-delay -1"):
        cfg("--warm-refill-delay", "-1")
    # the pool fills after the first step unless told to fill at launch
    assert cfg().standby.fill_at_start is False
    assert cfg("--warm-fill-at-start").standby.fill_at_start is True
