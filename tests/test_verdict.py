"""Folding findings into GPU and node verdicts: worst health, strongest action, every reason."""

from __future__ import annotations

import json

from trainguard.actions import Advice
from trainguard.detect.verdict import node_reasons, node_verdict, verdict_to_dict
from trainguard.records import Finding, Gpu, Health

GPUS = [Gpu(0, uuid="GPU-a", pci="0000:18:00"), Gpu(1, uuid="GPU-b", pci="0000:19:00")]


def f(rule: str, health: Health, action: Advice, gpu: int | None = 1) -> Finding:
    return Finding(rule, health, action, f"{rule} fired", gpu=gpu)


def test_no_findings_is_ok_with_no_action():
    v = node_verdict(GPUS, [])
    assert (v.health, v.action) == (Health.OK, Advice.NONE)
    assert [g.health for g in v.gpus] == [Health.OK, Health.OK]


def test_worst_health_and_strongest_action_win_per_gpu_and_node():
    v = node_verdict(
        GPUS,
        [
            f("thermal", Health.DEGRADED, Advice.RUN_DIAGNOSTICS),
            f("ecc_dbe", Health.FAILED, Advice.RESET_GPU),
            f("xid", Health.OK, Advice.RESTART_APP, gpu=0),
        ],
    )
    assert (v.health, v.action) == (Health.FAILED, Advice.RESET_GPU)
    g0, g1 = v.gpus
    assert (g0.health, g0.action) == (Health.OK, Advice.RESTART_APP)
    assert (g1.health, g1.action) == (Health.FAILED, Advice.RESET_GPU)
    assert g1.reasons == ["ecc_dbe fired", "thermal fired"]  # every reason, worst first


def test_unknown_gpu_makes_an_otherwise_healthy_node_unknown_but_not_a_degraded_one():
    assert node_verdict(GPUS, [f("no_readings", Health.UNKNOWN, Advice.NONE)]).health is Health.UNKNOWN
    v = node_verdict(
        GPUS,
        [
            f("no_readings", Health.UNKNOWN, Advice.NONE),
            f("thermal", Health.DEGRADED, Advice.RUN_DIAGNOSTICS, gpu=0),
        ],
    )
    assert v.health is Health.DEGRADED


def test_node_without_gpus_is_unknown():
    assert node_verdict([], []).health is Health.UNKNOWN


def test_findings_for_no_gpu_or_a_foreign_gpu_are_node_scoped():
    v = node_verdict(
        GPUS,
        [
            f("sxid", Health.FAILED, Advice.REBOOT_NODE, gpu=None),
            f("xid", Health.DEGRADED, Advice.RUN_DIAGNOSTICS, gpu=9),
        ],
    )
    assert [x.rule for x in v.findings] == ["sxid", "xid"]
    assert all(g.health is Health.OK for g in v.gpus) and v.health is Health.FAILED


def test_json_shape_has_verdict_action_reasons_and_gpus():
    v = node_verdict(GPUS, [f("ecc_dbe", Health.FAILED, Advice.RESET_GPU)])
    d = json.loads(json.dumps(verdict_to_dict(v)))
    assert (d["verdict"], d["action"], d["exit_code"]) == ("failed", "reset_gpu", 2)
    assert d["reasons"] == ["GPU 1: ecc_dbe fired"] == node_reasons(v)
    g = d["gpus"][1]
    assert {k: g[k] for k in ("index", "uuid", "pci", "verdict", "action", "reasons")} == {
        "index": 1,
        "uuid": "GPU-b",
        "pci": "0000:19:00",
        "verdict": "failed",
        "action": "reset_gpu",
        "reasons": ["ecc_dbe fired"],
    }
