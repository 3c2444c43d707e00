"""Reliability models of a synchronous training job: closed forms, stdlib only.

Where it sits: the planner (`trainguard plan`) and the simulator's self-check use these; the
survival fits (survival.py) and the incident store supply their rates. A synchronous job is a
series system: any failure of any of its N nodes interrupts all of it, so failure rates add::

    >>> round(job_mttf_hours(nodes=2048, failures_per_node_day=LLAMA3_FAILURES_PER_NODE_DAY), 2)
    3.09
    >>> round(young_interval(write_s=60, mttf_s=3600) / 60, 2)   # minutes
    10.95

Conventions: times in seconds unless the name says otherwise; ``rate`` is failures per second of
the whole job (lambda = N x r_f).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainguard.errors import ConfigError

DAY_S = 86_400.0
BOLTZMANN_EV_PER_K = 8.617_333_262e-5

# Llama 3 405B pre-training ("The Llama 3 Herd of Models", Table 5): 419 unexpected
# interruptions on 16,384 H100 GPUs (2,048 nodes of 8) in 54 days.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0
LLAMA3_FAILURES_PER_GPU_DAY = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS)
LLAMA3_FAILURES_PER_NODE_DAY = LLAMA3_FAILURES_PER_GPU_DAY * 8
LLAMA3_SOURCE = (
    "Llama 3 405B pre-training (Dubey et al. 2024, 'The Llama 3 Herd of Models', Table 5): "
    "419 unexpected interruptions on 16,384 H100 GPUs in 54 days = "
    f"{LLAMA3_FAILURES_PER_NODE_DAY * 1000:.2f} failures per 1000 node-days of 8 GPUs"
)


def p_failure(rate_per_s: float, t_s: float) -> float:
    """P(at least one failure within t) for exponential failures: 1 - exp(-lambda t)."""
    return -math.expm1(-rate_per_s * t_s)


def job_rate_per_s(nodes: float, failures_per_node_day: float) -> float:
    """Series system: the job fails when any node does, lambda = N x r_f."""
    return nodes * failures_per_node_day / DAY_S


def job_mttf_hours(nodes: float, failures_per_node_day: float) -> float:
    """Job MTTF = 1 / (N x r_f) (Meta's model for its research clusters), in hours."""
    rate = job_rate_per_s(nodes, failures_per_node_day)
    return math.inf if rate == 0 else 1.0 / rate / 3600.0


def failures_per_day(nodes: float, failures_per_node_day: float) -> float:
    return nodes * failures_per_node_day


def young_interval(write_s: float, mttf_s: float) -> float:
    """Young (1974): the compute time between checkpoints that minimises waste, sqrt(2 C M)."""
    return math.sqrt(2.0 * write_s * mttf_s)


def daly_interval(write_s: float, mttf_s: float) -> float:
    """Daly (2006), the higher-order optimum:
    sqrt(2 C M) [1 + 1/3 sqrt(C / 2M) + C / 18M] - C for C < 2M, else M."""
    if write_s >= 2.0 * mttf_s:
        return mttf_s
    x = write_s / (2.0 * mttf_s)
    return math.sqrt(2.0 * write_s * mttf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write_s


def expected_ettr(rate_per_s: float, restart_s: float, interval_s: float, write_s: float = 0.0) -> float:
    """Expected ETTR in the first-order form of Kokolis et al. (HPCA 2025): every failure costs
    the restart overhead u0 plus, on average, half a checkpoint period; a blocking write of W
    per interval T costs T / (T + W) of the rest:

        E[ETTR] = T / (T + W) x (1 - lambda (u0 + (T + W) / 2))

    With W = 0 this is the paper's 1 - N r_f (u0 + T/2). Valid while lambda (u0 + T) << 1;
    clipped at 0 beyond. `exact_ettr` is the same model without the first-order truncation.
    """
    _check_interval(interval_s, write_s)
    period = interval_s + write_s
    return max(0.0, interval_s / period * (1.0 - rate_per_s * (restart_s + period / 2.0)))


def exact_ettr(rate_per_s: float, restart_s: float, interval_s: float, write_s: float = 0.0) -> float:
    """Expected ETTR under Poisson failures (failures strike during restarts too), exactly:
    a period of T + W commits T of work; E[wall time per committed period] is
    e^(lambda u0) (e^(lambda (T + W)) - 1) / lambda, so

        E[ETTR] = lambda T e^(-lambda u0) / (e^(lambda (T + W)) - 1)

    Its first-order expansion in lambda is `expected_ettr`.
    """
    _check_interval(interval_s, write_s)
    if rate_per_s == 0:
        return interval_s / (interval_s + write_s)
    return (
        rate_per_s
        * interval_s
        * math.exp(-rate_per_s * restart_s)
        / math.expm1(rate_per_s * (interval_s + write_s))
    )


def best_interval(rate_per_s: float, restart_s: float, write_s: float) -> float:
    """The interval maximising `exact_ettr` (golden-section search: the function is unimodal)."""
    if rate_per_s == 0:
        return math.inf
    mttf = 1.0 / rate_per_s
    lo, hi = 1e-3 * min(mttf, max(write_s, 1.0)), 4.0 * mttf + write_s
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(200):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if exact_ettr(rate_per_s, restart_s, a, write_s) < exact_ettr(rate_per_s, restart_s, b, write_s):
            lo = a
        else:
            hi = b
    return (lo + hi) / 2.0


def _check_interval(interval_s: float, write_s: float) -> None:
    if interval_s <= 0 or write_s < 0:
        raise ConfigError(
            f"checkpoint interval {interval_s} s and write time {write_s} s: the interval must be "
            "positive and the write time not negative"
        )


# -- temperature and power ---------------------------------------------------------------------


def arrhenius_factor(temp_c: float, ref_temp_c: float, activation_ev: float = 0.7) -> float:
    """Failure-rate acceleration at temp_c relative to ref_temp_c: exp(Ea/k (1/T_ref - 1/T)).
    0.7 eV is the customary activation energy for silicon wear-out; pass your own."""
    t, t_ref = temp_c + 273.15, ref_temp_c + 273.15
    return math.exp(activation_ev / BOLTZMANN_EV_PER_K * (1.0 / t_ref - 1.0 / t))


@dataclass(frozen=True, slots=True)
class PowerCap:
    """What a power cap does to one GPU, under a deliberately simple model.

    Die temperature rises linearly with power above the inlet (``inlet_c + c_per_w x P``); the
    hardware share of failures accelerates with temperature (Arrhenius); throughput follows the
    clock, and under DVFS power grows roughly with the cube of the clock, so throughput scales
    as ``(cap / tdp) ** throughput_exponent``. Memory-bound work loses less: lower the exponent.

        >>> cap = power_cap(600, tdp_w=700)
        >>> round(cap.throughput, 3), round(cap.rate_factor, 3)
        (0.95, 0.626)
    """

    cap_w: float
    tdp_w: float
    temp_c: float  # die temperature at the cap
    tdp_temp_c: float  # die temperature at full power
    throughput: float  # fraction of full-power throughput
    rate_factor: float  # failure rate at the cap / failure rate at full power (hardware share)


def power_cap(
    cap_w: float,
    tdp_w: float = 700.0,
    inlet_c: float = 30.0,
    c_per_w: float = 0.07,  # H100 SXM: ~80 C at 700 W with a 30 C inlet
    activation_ev: float = 0.7,
    throughput_exponent: float = 1.0 / 3.0,
) -> PowerCap:
    if not 0 < cap_w <= tdp_w:
        raise ConfigError(f"power cap {cap_w} W must be positive and at most the TDP ({tdp_w} W)")
    temp, tdp_temp = inlet_c + c_per_w * cap_w, inlet_c + c_per_w * tdp_w
    return PowerCap(
        cap_w=cap_w,
        tdp_w=tdp_w,
        temp_c=temp,
        tdp_temp_c=tdp_temp,
        throughput=(cap_w / tdp_w) ** throughput_exponent,
        rate_factor=arrhenius_factor(temp, tdp_temp, activation_ev),
    )
