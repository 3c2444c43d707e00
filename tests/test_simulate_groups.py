"""`trainguard simulate`'s third recovery mode: replica groups that train on while one heals."""

from __future__ import annotations

import pytest

pytest.importorskip("numpy")

from trainguard.errors import ConfigError
from trainguard.reliability.simulate import SimConfig, simulate, simulate_groups

CFG = SimConfig(gpus=16_384, days=54, trials=100, seed=0)


def test_replica_groups_lose_a_share_of_the_downtime_instead_of_the_job():
    restart = float(simulate(CFG).ettr.mean())
    groups = simulate_groups(CFG, groups=128, heal_s=CFG.restart_s, lost_s=10.0)
    assert float(groups.mean()) > restart
    assert 0.99 < float(groups.mean()) < 1.0


def test_one_group_heals_no_better_than_a_restart_without_rollback():
    one = float(simulate_groups(CFG, groups=1, heal_s=CFG.restart_s, lost_s=0.0).mean())
    more = float(simulate_groups(CFG, groups=8, heal_s=CFG.restart_s, lost_s=0.0).mean())
    assert one < more
    assert one < 0.99  # each failure's whole downtime is lost with a single group


def test_the_steps_the_healthy_groups_discard_are_charged():
    none = float(simulate_groups(CFG, groups=128, heal_s=60.0, lost_s=0.0).mean())
    some = float(simulate_groups(CFG, groups=128, heal_s=60.0, lost_s=60.0).mean())
    assert some < none


def test_bad_group_settings_are_a_clear_error():
    with pytest.raises(ConfigError, match="1 or more groups"):
        simulate_groups(CFG, groups=0, heal_s=1.0, lost_s=0.0)
