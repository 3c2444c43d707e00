"""Remediation of a forecast (a ``predicted_failure`` finding): nothing unless the policy names
it, at most a drain (or cordon, or a webhook), never a reset or a reboot, through the same
breakers and dry run as every other remedy."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.actions import Advice
from trainguard.detect.detector import PREDICTED_FAILURE
from trainguard.errors import ConfigError
from trainguard.incidents.store import IncidentStore
from trainguard.records import Category, Finding, Health
from trainguard.remediate import NodeAction, Policy, Remediator, choose, parse_policy
from trainguard.remediate.policy import BreakerLimits
from trainguard.remediate.providers.sim import SimScheduler

FORECAST = Finding(PREDICTED_FAILURE, Health.DEGRADED, Advice.DRAIN, "P(failure) within 24 h 0.91; expected "
                   "in about 6.2 h; driven by correctable ECC errors +40 in 12 h", gpu=3, time=10.0,
                   category=Category.GPU_MEMORY_ECC)  # fmt: skip
OPT_IN = {"enforce": True, "actions": {PREDICTED_FAILURE: "drain"}}


def test_a_forecast_gets_no_remedy_unless_the_policy_names_it() -> None:
    assert choose(Policy(enforce=True), FORECAST, "n1").remedy is NodeAction.NONE
    # an entry for its suggested action (drain) is not an entry for forecasts
    by_action = parse_policy({"remediation": {"actions": {"drain": "reboot_node"}}})
    assert choose(by_action, FORECAST, "n1").remedy is NodeAction.NONE
    opted = choose(parse_policy({"remediation": OPT_IN}), FORECAST, "n1")
    assert (opted.remedy, opted.enforce, opted.why) == (
        NodeAction.DRAIN,
        True,
        f"policy actions.{PREDICTED_FAILURE}",
    )
    k8s = parse_policy({"remediation": {"provider": "kubernetes", "actions": {PREDICTED_FAILURE: "drain"}}})
    assert choose(k8s, FORECAST, "n1").remedy is NodeAction.CORDON
    group = parse_policy({"remediation": {"group": [{"name": "pod-a", "nodes": ["gpu-a*"],
                                                     "actions": {PREDICTED_FAILURE: "webhook"}}]}})  # fmt: skip
    assert choose(group, FORECAST, "gpu-a7").remedy is NodeAction.WEBHOOK
    assert choose(group, FORECAST, "gpu-b1").remedy is NodeAction.NONE


@pytest.mark.parametrize("remedy", ["reset_gpu", "reboot_node", "hardware_inspection"])
def test_a_policy_that_would_reset_or_reboot_on_a_forecast_is_refused(remedy: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy({"remediation": {"actions": {PREDICTED_FAILURE: remedy}}})
    message = str(err.value)
    assert f"{PREDICTED_FAILURE} = '{remedy}'" in message and "never reset or reboot" in message
    assert "none, webhook, drain, cordon" in message
    with pytest.raises(ConfigError, match="never reset or reboot"):
        parse_policy({"remediation": {"group": [{"name": "g", "actions": {PREDICTED_FAILURE: remedy}}]}})


def test_a_forecast_is_a_dry_run_unless_enforced(tmp_path: Path) -> None:
    sched = SimScheduler(["n1"])
    policy = parse_policy({"remediation": {"actions": {PREDICTED_FAILURE: "drain"}}})
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = Remediator(policy, "n1", store, state_dir=tmp_path, providers={"node": sched}).act(
            [FORECAST]
        )
    assert rec.resolution == "dry_run: would drain" and rec.gpu == 3 and rec.root_cause.value == "unknown"
    assert sched.calls == []


def test_enforced_forecasts_drain_ahead_of_the_next_job_behind_the_fleet_breaker(tmp_path: Path) -> None:
    nodes = ["n1", "n2", "n3"]
    sched = SimScheduler(nodes)
    policy = parse_policy({"remediation": {**OPT_IN, "breaker": {"max_nodes": 1, "max_fraction": 1.0}}})
    assert policy.breaker == BreakerLimits(max_nodes=1, max_fraction=1.0)
    with IncidentStore(tmp_path / "tg.db") as store:
        records = [
            Remediator(policy, n, store, state_dir=tmp_path / n, breaker_path=tmp_path / "fleet-breaker.json",
                       providers={"node": sched}).act([FORECAST])[0]
            for n in nodes
        ]  # fmt: skip
    assert [r.resolution.split(":")[0] for r in records] == ["done", "held", "held"]
    assert [sched.state(n)[0] for n in nodes] == ["drained", "idle", "idle"]
    assert all(call[0] == "drain" for call in sched.calls)  # drained, never rebooted
    assert "trainguard: predicted_failure GPU 3" in sched.state("n1")[1]
