"""How fast each simulated GPU computes, for the ranks that train on it.

A real throttled GPU makes its rank's kernels take longer; a simulated one cannot, so the process
that owns the ``SimNode`` (the supervisor, under ``trainguard run --backend sim``) writes each
GPU's speed to the run directory (`SPEEDS_FILE`) and the rank on that GPU stretches its own
compute by ``1 / speed`` (``trainguard.torch.sim_gpu``). The speed follows from the state the
faults left, as the hardware's would: the SM clock under load against its max (a power cap, a
thermal slowdown, a clock stuck low), times the rate of a GPU whose products run slow with normal
clocks (``SlowProducts``). Clock dither near the max (boost bins) is full speed.

    >>> from trainguard.clock import VirtualClock
    >>> from trainguard.telemetry.sim import SimNode
    >>> sim = SimNode(n_gpus=3, clock=VirtualClock())
    >>> _ = sim.now().throttled(gpu=1, fraction=0.5).slow_products(gpu=2, fraction=0.75)
    >>> gpu_speeds(sim)
    {0: 1.0, 1: 0.5, 2: 0.75}
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from trainguard.rundir import atomic_write_bytes
from trainguard.telemetry.sim import state
from trainguard.telemetry.sim.node import SimNode

__all__ = ["SPEEDS_ENV", "SPEEDS_FILE", "gpu_speeds", "read_speed", "write_speeds"]

log = logging.getLogger(__name__)

SPEEDS_FILE = "sim-gpus.json"
SPEEDS_ENV = "TRAINGUARD_SIM_SPEEDS"  # the file's path, in the environment of the ranks on a simulated node
FULL_CLOCK = 0.9  # a clock within this of its max under load is boost dither, not a slowdown


def gpu_speeds(node: SimNode) -> dict[int, float]:
    """Each GPU's compute speed, 1.0 for a healthy one; a lost GPU has none (its rank dies of it)."""
    out: dict[int, float] = {}
    for s in node.sample():
        if s.lost:
            continue
        clock = 1.0
        if s.sm_clock_mhz and s.sm_clock_max_mhz and (s.util_gpu_pct or 0) > 5:
            ratio = s.sm_clock_mhz / s.sm_clock_max_mhz
            clock = 1.0 if ratio >= FULL_CLOCK else ratio
        st = node.state(s.gpu.index)
        products = min((d.fraction for d in st.defects if isinstance(d, state.SlowProducts)), default=1.0)
        out[s.gpu.index] = round(clock * products, 3)
    return out


def write_speeds(path: Path, speeds: dict[int, float]) -> None:
    """Atomically write the speeds (``{"gpus": {"0": 1.0, ...}}``)."""
    body = {"gpus": {str(g): v for g, v in sorted(speeds.items())}}
    atomic_write_bytes(path, json.dumps(body).encode())


def read_speed(path: Path, gpu: int) -> float | None:
    """GPU ``gpu``'s speed in the file; None when the file or the GPU is not there (no slowdown)."""
    try:
        body = json.loads(path.read_bytes())
        value = body["gpus"].get(str(gpu))
        return None if value is None else float(value)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.debug("unreadable %s: %s", path, exc)
        return None
