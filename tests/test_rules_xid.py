"""Stateful Xid rules: bursts, sympathetic Xid 45, repeated application Xids, recovery actions."""

from __future__ import annotations

import pytest

from trainguard.actions import Advice
from trainguard.detect.thresholds import Thresholds
from trainguard.detect.xid_rules import XidState, recovery_action_of, xid_policy
from trainguard.records import Event, EventKind, Gpu, Health, RecoveryAction, Severity

GPUS = [Gpu(i, uuid=f"GPU-{i:08x}", pci=f"0000:{0x18 + i:02x}:00") for i in range(8)]


def xid(code: int, t: float, gpu: int = 3, text: str = "some error", **kw: object) -> Event:
    pci = f"0000:{0x18 + gpu:02x}:00"
    line = f"[{t:12.6f}] NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python, {text}"
    return Event(EventKind.XID, line, time=t, xid=code, pci=pci, **kw)  # type: ignore[arg-type]


def state(*events: Event, now: float | None = None) -> XidState:
    s = XidState(Thresholds())
    s.set_gpus(GPUS)
    for ev in events:
        s.observe(ev, now=ev.time if now is None else now)  # type: ignore[arg-type]
    return s


@pytest.mark.parametrize("code", [48, 64, 79, 92, 94, 95, 119, 120])
def test_fatal_hardware_xids_fail_the_gpu(code):
    found = state(xid(code, 10.0)).findings(now=11.0)
    assert [(f.rule, f.gpu, f.health) for f in found] == [("xid", 3, Health.FAILED)]
    assert f"Xid {code}" in found[0].reason


def test_xid_79_asks_for_a_reboot_and_keeps_the_pid_noise_out_of_the_reason():
    (f,) = state(xid(79, 5.0, text="GPU has fallen off the bus.")).findings(now=6.0)
    assert f.action is Advice.REBOOT_NODE
    assert f.reason == "Xid 79: GPU has fallen off the bus."


def test_xid_45_after_another_xid_in_the_burst_adds_nothing():
    found = state(xid(13, 10.0), xid(45, 10.5)).findings(now=12.0)
    assert [f.reason.split(":")[0] for f in found] == ["Xid 13"]


def test_xid_45_alone_is_the_application_being_torn_down():
    (f,) = state(xid(45, 10.0)).findings(now=12.0)
    assert (f.health, f.action) == (Health.OK, Advice.RESTART_APP)


def test_xid_45_long_after_another_xid_is_not_sympathetic():
    found = state(xid(13, 10.0), xid(45, 500.0)).findings(now=501.0)
    assert sorted(f.reason.split(":")[0] for f in found) == ["Xid 13", "Xid 45"]


def test_one_xid_13_is_the_applications_problem():
    (f,) = state(xid(13, 10.0)).findings(now=11.0)
    assert (f.health, f.action) == (Health.OK, Advice.RESTART_APP)


def test_repeated_xid_13_and_31_on_one_gpu_call_for_diagnostics():
    found = state(xid(13, 10.0), xid(31, 40.0), xid(13, 70.0), xid(45, 71.0)).findings(now=80.0)
    assert [(f.rule, f.health, f.action) for f in found] == [
        ("xid_app_repeat", Health.DEGRADED, Advice.RUN_DIAGNOSTICS)
    ]
    assert "3 application Xids (13, 31)" in found[0].reason


def test_application_xids_on_different_gpus_are_not_a_repeat():
    found = state(xid(13, 10.0, gpu=1), xid(13, 20.0, gpu=2), xid(13, 30.0, gpu=3)).findings(now=31.0)
    assert {f.health for f in found} == {Health.OK} and len(found) == 3


def test_application_xids_hours_apart_are_not_a_repeat():
    found = state(xid(13, 0.0), xid(13, 1000.0), xid(13, 2000.0), now=2000.0).findings(now=2000.0)
    assert all(f.health is Health.OK for f in found)


def test_several_fatal_bursts_in_a_day_call_for_support():
    s = state(xid(48, 0.0), xid(48, 3600.0), xid(95, 7200.0), now=7200.0)
    found = s.findings(now=7201.0)
    repeat = [f for f in found if f.rule == "xid_fatal_repeat"]
    assert len(repeat) == 1 and repeat[0].action is Advice.CONTACT_SUPPORT and repeat[0].gpu == 3


def test_one_fatal_burst_of_several_lines_is_not_a_repeat():
    found = state(xid(48, 0.0), xid(63, 0.1), xid(48, 0.2), xid(95, 0.3)).findings(now=1.0)
    assert not [f for f in found if f.rule == "xid_fatal_repeat"]


def test_xid_154_announces_the_recovery_action():
    text = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    (f,) = state(xid(154, 5.0, text=text)).findings(now=6.0)
    assert (f.rule, f.health, f.action) == ("xid_recovery_action", Health.FAILED, Advice.RESET_GPU)


def test_xid_154_back_to_none_clears_the_action():
    a = xid(154, 5.0, text="GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    b = xid(154, 9.0, text="GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)")
    assert state(a, b).findings(now=10.0) == []


@pytest.mark.parametrize(
    ("text", "ra"),
    [
        ("changed from 0x0 (None) to 0x3 (Drain P2P)", RecoveryAction.DRAIN_P2P),
        ("changed from 0x0 (None) to 0x4 (Drain and Reset)", RecoveryAction.DRAIN_AND_RESET),
        ("recovery action changed to Node Reboot Required", RecoveryAction.NODE_REBOOT),
    ],
)
def test_recovery_action_text_is_decoded(text, ra):
    assert recovery_action_of(text) is ra


def test_sxid_is_a_node_finding_never_a_gpu_xid():
    ev = Event(
        EventKind.SXID,
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44",
        time=1.0,
        xid=24007,
        pci="0000:05:00",
        severity=Severity.FATAL,
    )
    (f,) = state(ev).findings(now=2.0)
    assert (f.rule, f.gpu, f.health) == ("sxid", None, Health.FAILED)


def test_fallen_off_the_bus_without_an_xid_fails_the_gpu():
    ev = Event(
        EventKind.GPU_LOST, "NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.", time=3.0, pci="0000:1a:00"
    )
    (f,) = state(ev).findings(now=4.0)
    assert (f.rule, f.gpu, f.health, f.action) == ("gpu_lost_log", 2, Health.FAILED, Advice.REBOOT_NODE)


def test_xid_with_pci_known_only_through_the_driver_map_line_reaches_its_gpu():
    s = XidState()
    s.set_gpus([Gpu(5, uuid="GPU-abc")])  # telemetry without a PCI address
    s.observe(
        Event(EventKind.GPU_MAP, "NVRM: GPU at PCI:0000:9a:00: GPU-abc", pci="0000:9a:00", uuid="GPU-abc"),
        now=0.0,
    )
    s.observe(
        Event(
            EventKind.XID,
            "NVRM: Xid (PCI:0000:9a:00): 79, GPU has fallen off the bus.",
            time=1.0,
            xid=79,
            pci="0000:9a:00",
        ),
        now=1.0,
    )
    assert [f.gpu for f in s.findings(now=2.0)] == [5]


def test_xid_on_an_unknown_pci_is_a_node_finding_naming_it():
    ev = Event(
        EventKind.XID, "NVRM: Xid (PCI:0000:ee:00): 79, off the bus", time=1.0, xid=79, pci="0000:ee:00"
    )
    (f,) = state(ev).findings(now=2.0)
    assert f.gpu is None and "0000:ee:00" in f.reason and f.health is Health.FAILED


def test_gpu_reinit_clears_its_earlier_xids():
    s = state(xid(48, 10.0))
    s.observe(
        Event(
            EventKind.GPU_MAP,
            "NVRM: GPU at PCI:0000:1b:00: GPU-00000003",
            time=20.0,
            pci="0000:1b:00",
            uuid="GPU-00000003",
        ),
        now=20.0,
    )
    assert s.findings(now=21.0) == []


def test_fatal_xid_is_held_for_a_day_then_expires():
    s = state(xid(79, 0.0))
    assert s.findings(now=3600.0)
    assert s.findings(now=86_401.0) == []


def test_observe_never_raises_on_nonsense():
    s = state()
    s.observe(Event(EventKind.XID, "", xid=-5), now=1.0)
    s.observe("not an event", now=1.0)  # type: ignore[arg-type]
    assert s.skipped == 1
    s.findings(now=2.0)


def test_unknown_xid_falls_back_to_the_parsers_severity():
    assert xid_policy(
        9999, Event(EventKind.XID, "x", xid=9999, severity=Severity.FATAL, action=Advice.RESET_GPU)
    ) == (Health.FAILED, Advice.RESET_GPU)


def test_one_xid_13_printed_as_two_lines_counts_once():
    found = state(
        xid(13, 10.0, text="Graphics SM Warp Exception"),
        xid(13, 10.0, text="Graphics Exception: ESR"),
        xid(13, 50.0),
        xid(13, 50.0),
    ).findings(now=60.0)
    assert [(f.health, f.action) for f in found] == [(Health.OK, Advice.RESTART_APP)]
    assert "(x2)" in found[0].reason


def test_fallen_off_the_bus_line_after_xid_79_is_not_reported_twice():
    lost = Event(
        EventKind.GPU_LOST, "NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus.", time=5.0, pci="0000:1b:00"
    )
    found = state(xid(79, 5.0), lost).findings(now=6.0)
    assert [f.rule for f in found] == ["xid"]


def test_a_wall_clock_stamped_xid_ages_from_its_own_time():
    day, now = 86_400.0, 1_760_000_000.0
    old = xid(79, now - 2 * day)  # from a journal two days back
    fresh = xid(48, now - 60.0, gpu=4)
    found = state(old, fresh, now=now).findings(now=now)
    assert [(f.gpu, f.reason.split(":")[0]) for f in found] == [(4, "Xid 48")]


def test_support_call_expires_after_a_day_without_fatal_xids():
    s = state(xid(48, 0.0), xid(48, 3600.0), xid(95, 7200.0), now=7200.0)
    assert any(f.rule == "xid_fatal_repeat" for f in s.findings(now=7201.0))
    assert not any(f.rule == "xid_fatal_repeat" for f in s.findings(now=7200.0 + 86_401.0))
