from __future__ import annotations

from trainguard.actions import Advice
from trainguard.records import Health, normalize_pci, strongest_action, worst_health


def test_worst_health_prefers_failed_over_degraded_over_unknown():
    assert worst_health([Health.OK, Health.UNKNOWN]) is Health.UNKNOWN
    assert worst_health([Health.UNKNOWN, Health.DEGRADED]) is Health.DEGRADED
    assert worst_health([Health.DEGRADED, Health.FAILED, Health.OK]) is Health.FAILED
    assert worst_health([]) is Health.OK


def test_check_exit_codes_follow_the_documented_contract():
    assert [h.exit_code for h in (Health.OK, Health.DEGRADED, Health.FAILED, Health.UNKNOWN)] == [0, 1, 2, 3]


def test_strongest_action_orders_support_above_restart():
    assert (
        strongest_action([Advice.RESTART_APP, Advice.CONTACT_SUPPORT, Advice.RESET_GPU])
        is Advice.CONTACT_SUPPORT
    )
    assert strongest_action([]) is Advice.NONE


def test_normalize_pci_accepts_every_spelling():
    assert normalize_pci("00000000:3B:00.0") == "0000:3b:00"
    assert normalize_pci("PCI:0000:3b:00") == "0000:3b:00"
    assert normalize_pci("3b:00.0") == "0000:3b:00"
    assert normalize_pci("0002:c1:1f.0") == "0002:c1:1f"
    assert normalize_pci("garbage") is None
    assert normalize_pci("") is None
