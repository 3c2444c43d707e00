"""The Guard's settings as one frozen value: the keyword arguments and a `GuardConfig` build the
same Guard, a keyword overrides the config's field, and a misspelt one is a clear error."""

from __future__ import annotations

import dataclasses
import doctest
import signal

import pytest

torch = pytest.importorskip("torch")

import trainguard.torch.guard_config as guard_config  # noqa: E402
from trainguard.torch.guard import Guard, GuardConfig  # noqa: E402


def test_keywords_and_a_config_value_make_the_same_guard(tmp_path):
    by_keywords = Guard(None, None, on_nan="skip", checkpoint_every=7, run_dir=tmp_path, watchdog=False)
    config = GuardConfig(on_nan="skip", checkpoint_every=7, run_dir=tmp_path, watchdog=False)
    by_config = Guard(None, None, config)
    assert by_keywords.config == by_config.config == config
    assert by_config.run_dir == tmp_path and by_config.check_every == 1 and by_config.check_lag == 0


def test_a_keyword_overrides_the_configs_field_and_the_config_is_left_as_it_was():
    base = GuardConfig(checkpoint_every=100, hang_floor_s=300.0)
    guard = Guard(None, None, base, checkpoint_every=5, preempt_signals=[signal.SIGUSR1])
    assert guard.config.checkpoint_every == 5 and guard.config.hang_floor_s == 300.0
    assert guard.config.preempt_signals == (signal.SIGUSR1,)  # a list given, a tuple kept
    assert base.checkpoint_every == 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.checkpoint_every = 1  # type: ignore[misc]


def test_a_misspelt_setting_names_the_known_ones():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'hang_floor'.*hang_floor_s"):
        Guard(None, None, hang_floor=1.0)


def test_the_defaults_are_the_documented_ones():
    c = GuardConfig()
    assert (c.on_nan, c.on_spike, c.check_every, c.check_lag) == ("rollback", "rollback", None, None)
    assert (c.hang_floor_s, c.hang_factor, c.first_step_s, c.checkpoint_s) == (120.0, 10.0, 600.0, 600.0)
    assert c.preempt_signals == (signal.SIGTERM,) and c.heartbeat_interval_s == 0.25


def test_the_module_example_holds():
    assert doctest.testmod(guard_config).failed == 0
