"""The replica-group model against a published oracle: Meta's FT-HSDP (Salpekar et al., "Training
LLMs with Fault Tolerant HSDP on 100,000 GPUs", arXiv:2602.00277, 2026).

What the paper states (abstract): at O(100K) GPUs, fully synchronous training stalls 10 minutes per
failure and keeps 44% effective training time; FT-HSDP, which takes only the failed replica out,
stalls the healthy replicas 3 minutes per failure and keeps 80%.

What we had to assume, because the text we could read does not state it:
- the failure rate at that scale: fitted to the synchronous point (44% at a 10-minute stall), which
  gives one failure every 12.2 minutes, 2.5x Llama 3's per-GPU rate (Table 5) at 100,000 GPUs; the
  80% is then predicted, not fitted;
- the 10 minutes hold the whole cost of a synchronous failure (restart and lost work), so the
  checkpoint interval is 1 s (no further rollback);
- every failure is replica-local (the paper's 3 minutes are per failure), 100 replicas, a failed
  replica back in 10 minutes (a few tenths of a point either way), no per-step overhead.

A failure during a stall starts it again (the model's rule), so ETTR ~ exp(-stall / MTBF); a rule
where stalls add up instead (ETTR = 1 - stall / MTBF, its rate fitted to the 44% the same way)
would predict 0.83. The published 80% lies between the two.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

pytest.importorskip("numpy")

from trainguard.reliability.groups import Estimate, GroupModel, simulate_groups
from trainguard.reliability.simulate import SimConfig, llama3_categories, simulate

GPUS = 100_000
SYNC_STALL_S, FT_STALL_S = 600.0, 180.0  # stated
SYNC_ETTR, FT_ETTR = 0.44, 0.80  # stated


def _at_100k() -> SimConfig:
    local = SimConfig(
        gpus=GPUS,
        days=7,
        trials=50,
        seed=0,
        interval_s=1.0,
        restart_s=SYNC_STALL_S,
        categories=llama3_categories(frozenset()),
    )
    rate = -math.log(SYNC_ETTR) / SYNC_STALL_S  # assumed: fitted to the synchronous point
    scale = rate / local.rate_per_s
    return replace(
        local, categories=tuple(replace(c, per_gpu_day=c.per_gpu_day * scale) for c in local.categories)
    )


def test_ft_hsdp_at_100k_gpus_keeps_80_percent_where_synchronous_training_keeps_44():
    cfg = _at_100k()
    sync = float(simulate(cfg).ettr.mean())
    ft = float(
        simulate_groups(cfg, GroupModel(groups=100, heal_s=SYNC_STALL_S, stall_s=Estimate(FT_STALL_S))).mean()
    )
    assert sync == pytest.approx(SYNC_ETTR, abs=0.01)  # the fit holds in the Monte Carlo
    assert ft == pytest.approx(FT_ETTR, abs=0.03)  # predicted: 0.78


def test_without_a_shorter_stall_replica_groups_keep_only_the_synchronous_44_percent():
    """The oracle can fail: the gain is the stall's, so stalling the healthy replicas as long as
    a synchronous restart gives the synchronous figure back."""
    cfg = _at_100k()
    same = float(
        simulate_groups(
            cfg, GroupModel(groups=100, heal_s=SYNC_STALL_S, stall_s=Estimate(SYNC_STALL_S))
        ).mean()
    )
    assert same == pytest.approx(SYNC_ETTR, abs=0.01)
    assert abs(same - FT_ETTR) > 0.3
