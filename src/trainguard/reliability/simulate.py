"""Monte Carlo of a synchronous training job on a failing cluster (`trainguard simulate`).

Failures of every root-cause category arrive as independent Poisson processes over wall time
(a failure during a restart interrupts the restart too). Each one stops the whole job: the work
since the last checkpoint is lost, detection takes the category's delay, the restart its cost,
and training resumes from the last checkpoint. Checkpoints block for ``write_s`` after every
``interval_s`` of compute. ETTR = committed compute / wall time (the final partial period counts:
the job ends with a save).

Vectorised over trials: one matrix of inter-failure gaps (trials x K, K a bound on the count
that the draw extends if a trial needs more), categories drawn per failure, and the run lengths
between a recovery and the next failure in closed form. 16,384 GPUs only scale the rate.

The default calibration is Llama 3 405B's 54-day pre-training record on 16,384 H100s (Table 5 of
"The Llama 3 Herd of Models", the counts; the paper's 30.1% for the 148 faulty-GPU row is a
misprint of 35.3%)::

    >>> r = simulate(SimConfig(gpus=16_384, days=54, trials=200, seed=0))
    >>> 400 < float(r.interruptions.mean()) < 440
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trainguard.errors import ConfigError
from trainguard.incidents.taxonomy import JOB_WIDE_CAUSES, RootCause
from trainguard.reliability import need
from trainguard.reliability.models import DAY_S, LLAMA3_DAYS, LLAMA3_GPUS, exact_ettr, expected_ettr


@dataclass(frozen=True, slots=True)
class FailureCategory:
    name: str
    per_gpu_day: float  # failure rate of one GPU's share of the cluster
    hang: bool = False  # shows as a hang (a collective waits), not as a process death
    detect_s: float = 0.0  # from the failure to its detection
    restart_s: float | None = None  # None: the job's restart cost
    node_fault: bool = False  # the fault stays with its node: recovery must exclude the node
    extra_s: float = 0.0  # more downtime per failure (e.g. waiting for a replacement node)
    job_wide: bool = False  # stops every replica group too (incidents.taxonomy.JOB_WIDE_CAUSES)


# Table 5: unexpected interruptions by root cause, and whether the job sees a hang (the
# collective waits for a peer that no longer answers) rather than a dead process.
LLAMA3_TABLE5: tuple[tuple[str, int, bool], ...] = (
    ("faulty_gpu", 148, False),
    ("gpu_hbm3_memory", 72, False),
    ("software_bug", 54, False),
    ("network_switch_cable", 35, True),
    ("host_maintenance", 32, False),
    ("gpu_sram_memory", 19, False),
    ("gpu_system_processor", 17, False),
    ("nic", 7, True),
    ("nccl_watchdog_timeouts", 7, True),
    ("silent_data_corruption", 6, False),
    ("gpu_thermal_interface_sensor", 6, False),
    ("ssd", 3, False),
    ("power_supply", 3, False),
    ("server_chassis", 2, False),
    ("io_expansion_board", 2, False),
    ("dependency", 2, False),
    ("cpu", 2, False),
    ("system_memory", 2, False),
)


# Root causes that stay with the node (restarting on it fails again) rather than with the
# fabric, the software or the schedule.
NODE_FAULTS = frozenset(
    {
        "faulty_gpu",
        "gpu_hbm3_memory",
        "gpu_sram_memory",
        "gpu_system_processor",
        "silent_data_corruption",
        "gpu_thermal_interface_sensor",
        "nic",
        "ssd",
        "power_supply",
        "server_chassis",
        "io_expansion_board",
        "cpu",
        "system_memory",
    }
)


# Table 5's rows in the incident taxonomy's root causes (incidents/taxonomy.py), which says which
# causes are job-wide.
LLAMA3_CAUSE: dict[str, RootCause] = {
    "faulty_gpu": RootCause.FAULTY_GPU,
    "gpu_hbm3_memory": RootCause.GPU_HBM_MEMORY,
    "software_bug": RootCause.SOFTWARE_BUG,
    "network_switch_cable": RootCause.NETWORK_SWITCH_CABLE,
    "host_maintenance": RootCause.HOST,
    "gpu_sram_memory": RootCause.GPU_SRAM,
    "gpu_system_processor": RootCause.GPU_SYSTEM_PROCESSOR,
    "nic": RootCause.NIC,
    "nccl_watchdog_timeouts": RootCause.NCCL_WATCHDOG_TIMEOUT,
    "silent_data_corruption": RootCause.SILENT_DATA_CORRUPTION,
    "gpu_thermal_interface_sensor": RootCause.GPU_THERMAL,
    "ssd": RootCause.HOST,
    "power_supply": RootCause.HOST,
    "server_chassis": RootCause.HOST,
    "io_expansion_board": RootCause.HOST,
    "dependency": RootCause.DEPENDENCY,
    "cpu": RootCause.HOST,
    "system_memory": RootCause.HOST,
}


def llama3_categories(job_wide: frozenset[RootCause] = JOB_WIDE_CAUSES) -> tuple[FailureCategory, ...]:
    """Table 5 as failure categories; ``job_wide``: the root causes that stop every replica group."""
    scale = LLAMA3_GPUS * LLAMA3_DAYS
    return tuple(
        FailureCategory(
            name, count / scale, hang, node_fault=name in NODE_FAULTS, job_wide=LLAMA3_CAUSE[name] in job_wide
        )
        for name, count, hang in LLAMA3_TABLE5
    )


@dataclass(frozen=True, slots=True)
class SimConfig:
    gpus: int
    days: float
    interval_s: float = 30 * 60.0  # compute between checkpoints
    write_s: float = 0.0  # blocking part of a checkpoint save
    restart_s: float = 10 * 60.0  # failure detected -> training again (reload, re-init, warm-up)
    trials: int = 1000
    seed: int = 0
    categories: tuple[FailureCategory, ...] = field(default_factory=llama3_categories)

    def __post_init__(self) -> None:
        if self.gpus <= 0 or self.days <= 0 or self.trials <= 0:
            raise ConfigError("simulate needs --gpus, --days and --trials above 0")
        if self.interval_s <= 0 or self.write_s < 0 or self.restart_s < 0:
            raise ConfigError("the checkpoint interval must be above 0 and the costs not negative")

    @property
    def rate_per_s(self) -> float:
        return self.gpus * sum(c.per_gpu_day for c in self.categories) / DAY_S

    def downtime_s(self) -> list[float]:
        """Per category: detection delay + restart cost + extra downtime."""
        return [
            c.detect_s + (self.restart_s if c.restart_s is None else c.restart_s) + c.extra_s
            for c in self.categories
        ]


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    interruptions: Any  # (trials,) int
    by_category: Any  # (trials, categories) int
    ettr: Any  # (trials,) float

    def summary(self) -> dict[str, Any]:
        cfg, n = self.config, self.interruptions
        wall_h = cfg.days * 24.0
        total = float(n.sum())
        down = cfg.downtime_s()
        weights = [c.per_gpu_day for c in cfg.categories]
        mean_down = sum(d * w for d, w in zip(down, weights, strict=True)) / sum(weights)
        rate = cfg.rate_per_s
        # Downtimes differ by category: the exact model needs E[exp(-lambda D)], not exp(-lambda E[D]).
        mix = sum(math.exp(-rate * d) * w for d, w in zip(down, weights, strict=True)) / sum(weights)
        effective_down = -math.log(mix) / rate if rate > 0 else mean_down
        return {
            "gpus": cfg.gpus,
            "days": cfg.days,
            "trials": cfg.trials,
            "interruptions_mean": round(float(n.mean()), 3),
            "interruptions_sd": round(float(n.std(ddof=1)) if cfg.trials > 1 else 0.0, 3),
            "interruptions_expected": round(rate * cfg.days * DAY_S, 3),
            "by_category": {
                c.name: round(float(m), 3)
                for c, m in zip(cfg.categories, self.by_category.mean(axis=0), strict=True)
            },
            "mttf_hours": round(wall_h * cfg.trials / total, 4) if total else None,
            "ettr_mean": round(float(self.ettr.mean()), 5),
            "ettr_sd": round(float(self.ettr.std(ddof=1)) if cfg.trials > 1 else 0.0, 5),
            "ettr_p05": round(float(_quantile(self.ettr, 0.05)), 5),
            "ettr_model": round(exact_ettr(rate, effective_down, cfg.interval_s, cfg.write_s), 5),
            "ettr_model_first_order": round(expected_ettr(rate, mean_down, cfg.interval_s, cfg.write_s), 5),
            "checkpoint_interval_minutes": cfg.interval_s / 60.0,
            "checkpoint_write_seconds": cfg.write_s,
            "restart_minutes": cfg.restart_s / 60.0,
            "mean_downtime_minutes": round(mean_down / 60.0, 3),
        }


def _quantile(x: Any, q: float) -> float:
    return float(need("numpy").quantile(x, q))


def simulate(cfg: SimConfig) -> SimResult:
    np = need("numpy")
    rng = np.random.default_rng(cfg.seed)
    horizon = cfg.days * DAY_S
    rate = cfg.rate_per_s
    trials, ncat = cfg.trials, len(cfg.categories)
    if rate == 0:
        zeros = np.zeros(trials, dtype=np.int64)
        full = _committed(np.full(trials, horizon), cfg, final=True) / horizon
        return SimResult(cfg, zeros, np.zeros((trials, ncat), dtype=np.int64), full)
    times, cats, failed = _failures(cfg, rng)
    counts = failed.sum(axis=1)
    row = np.broadcast_to(np.arange(trials)[:, None], times.shape)
    by_cat = np.bincount((row * ncat + cats)[failed], minlength=trials * ncat).reshape(trials, ncat)

    # Run i starts when failure i-1 is recovered from and ends at failure i (or the horizon).
    down = np.asarray(cfg.downtime_s(), dtype=float)[cats]
    starts = np.concatenate([np.zeros((trials, 1)), times[:, :-1] + down[:, :-1]], axis=1)
    ends = np.minimum(times, horizon)
    runs = np.maximum(0.0, ends - starts)
    work = _committed(runs, cfg, final=False)
    # The run the horizon cut short keeps its partial period too (the job ends with a save).
    cut = failed.sum(axis=1)
    last = runs[np.arange(trials), cut]
    work_sum = np.where(failed, work, 0.0).sum(axis=1) + _committed(last, cfg, final=True)
    return SimResult(cfg, counts, by_cat, work_sum / horizon)


def _failures(cfg: SimConfig, rng: Any) -> tuple[Any, Any, Any]:
    """Failure times (trials x K, cumulative), their categories, and which fall in the horizon."""
    np = need("numpy")
    horizon, rate, trials, ncat = cfg.days * DAY_S, cfg.rate_per_s, cfg.trials, len(cfg.categories)
    mean_count = rate * horizon
    k = int(mean_count + 8.0 * math.sqrt(mean_count) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, size=(trials, k)), axis=1)
    while (times[:, -1] < horizon).any():  # some trial needs more failures than drawn: extend all
        more = np.cumsum(rng.exponential(1.0 / rate, size=(trials, k)), axis=1) + times[:, -1:]
        times = np.concatenate([times, more], axis=1)
    failed = times < horizon
    # Category of each failure: inverse CDF of the category shares on one uniform draw.
    shares = np.array([c.per_gpu_day for c in cfg.categories], dtype=float)
    cdf = np.cumsum(shares / shares.sum())
    cats = np.minimum(np.searchsorted(cdf, rng.random(times.shape), side="right"), ncat - 1)
    return times, cats, failed


def _committed(runs: Any, cfg: SimConfig, *, final: bool) -> Any:
    """Compute time that reached a checkpoint in runs of the given lengths; ``final``: the run
    ends normally, so the partial period after the last checkpoint is kept as well."""
    np = need("numpy")
    period = cfg.interval_s + cfg.write_s
    full = np.floor(runs / period)
    work = full * cfg.interval_s
    if final:
        work = work + np.minimum(runs - full * period, cfg.interval_s)
    return work


def with_costs(
    cfg: SimConfig, *, detect_hang_s: float, restart_s: float, node_fault_extra_s: float = 0.0
) -> SimConfig:
    """The same job with other recovery costs: hangs detected after ``detect_hang_s``, every
    failure restarting in ``restart_s``, a fault that stays with its node costing
    ``node_fault_extra_s`` more (a relaunch onto the bad node, or the wait for a replacement)."""
    cats = tuple(
        replace(
            c,
            detect_s=detect_hang_s if c.hang else c.detect_s,
            extra_s=c.extra_s + (node_fault_extra_s if c.node_fault else 0.0),
        )
        for c in cfg.categories
    )
    return replace(cfg, restart_s=restart_s, categories=cats)


def category_table(
    result: SimResult, reference: Sequence[tuple[str, int, bool]] = LLAMA3_TABLE5
) -> list[dict[str, Any]]:
    """Simulated mean count per category next to a published count (scaled to this run's GPUs
    and days), with the Poisson z-score of the difference."""
    cfg = result.config
    scale = cfg.gpus * cfg.days / (LLAMA3_GPUS * LLAMA3_DAYS)
    published = {name: count * scale for name, count, _ in reference}
    rows = []
    for j, c in enumerate(cfg.categories):
        mean = float(result.by_category[:, j].mean())
        expected = published.get(c.name)
        se = math.sqrt(expected / cfg.trials) if expected else None
        rows.append(
            {
                "category": c.name,
                "simulated": round(mean, 3),
                "published": round(expected, 3) if expected is not None else None,
                "z": round((mean - expected) / se, 2) if expected and se else None,
            }
        )
    return rows


def disagreements(result: SimResult, z_max: float = 4.0) -> list[str]:
    """Categories (and "total") whose simulated mean count is more than ``z_max`` standard
    errors from the published count: the simulator's self-check against Table 5."""
    bad = [r["category"] for r in category_table(result) if r["z"] is None or abs(r["z"]) > z_max]
    cfg = result.config
    expected = sum(n for _, n, _ in LLAMA3_TABLE5) * cfg.gpus * cfg.days / (LLAMA3_GPUS * LLAMA3_DAYS)
    z = (float(result.interruptions.mean()) - expected) / math.sqrt(expected / cfg.trials)
    return (["total"] if abs(z) > z_max else []) + bad
