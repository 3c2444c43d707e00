"""Reliability analytics: how often a job of N GPUs fails, how often it should checkpoint, what
ETTR it can expect, and which GPUs, nodes and locations are lemons.

Reads the incident store (or a public fleet data set), never writes it::

    telemetry -> detect -> diagnose -> incidents -> recover
                                          |
                                          +--> reliability (fit, predict, plan, simulate, fleet)

`models` is stdlib-only closed forms. The rest needs ``pip install 'trainguard[analytics]'``
(numpy, scipy, lifelines, scikit-learn) and, for plots, ``trainguard[plot]``; each module
imports them when used, so ``import trainguard.reliability`` stays light.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["need"]


def need(module: str, extra: str = "analytics") -> ModuleType:
    """Import an optional dependency, or say which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise ImportError(
            f"trainguard's reliability analytics need {top}: pip install 'trainguard[{extra}]'"
        ) from None
