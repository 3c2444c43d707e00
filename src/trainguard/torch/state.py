"""``TrainState``: everything a training run needs to continue exactly where it stopped.

    >>> state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler)  # doctest: +SKIP
    >>> sd = state.state_dict()           # model, optimizer, scheduler, scaler, extra + local parts
    >>> state.load_state_dict(sd)         # doctest: +SKIP

*Local* parts differ per rank and are gathered from every rank by the Checkpointer: the RNG
states (Python ``random``, NumPy, torch CPU, every CUDA device) and the sampler position.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

log = logging.getLogger(__name__)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose state_dict is portable: strips DDP/DataParallel and torch.compile wrappers."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
            model = model._orig_mod
        else:
            return model


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = (kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuplify(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:
            log.warning(
                "checkpoint has %d CUDA RNG states, this node %d: not restored",
                len(states),
                torch.cuda.device_count(),
            )


def _tuplify(value: Any) -> Any:
    # random.setstate wants tuples; a round trip through some loaders yields lists.
    return tuple(_tuplify(v) for v in value) if isinstance(value, list | tuple) else value


class TrainState:
    """Bundles the objects of a training run; every one with state_dict()/load_state_dict().

    ``extra`` values that have state_dict()/load_state_dict() are saved through them; other values
    (numbers, strings, small containers, tensors) are saved as they are and put back into ``extra``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        sampler: Any = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.sampler = sampler
        self.extra: dict[str, object] = dict(extra or {})

    @property
    def module(self) -> torch.nn.Module:
        return unwrap_model(self.model)

    def global_state_dict(self, include_model: bool = True) -> dict[str, Any]:
        """The replicated part: identical on every rank (taken from rank 0)."""
        out: dict[str, Any] = {}
        if include_model:
            out["model"] = self.module.state_dict()
            if self.optimizer is not None:
                out["optimizer"] = self.optimizer.state_dict()
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            out["scaler"] = self.scaler.state_dict()
        extra: dict[str, Any] = dict(self.extra)
        out["extra"] = {k: v.state_dict() if _stateful(v) else v for k, v in extra.items()}
        return out

    def local_state_dict(self) -> dict[str, Any]:
        """The per-rank part: RNG states and the sampler position."""
        out: dict[str, Any] = {"rng": rng_state()}
        if self.sampler is not None and hasattr(self.sampler, "state_dict"):
            out["sampler"] = self.sampler.state_dict()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**self.global_state_dict(), "local": self.local_state_dict()}

    def load_global_state_dict(self, sd: dict[str, Any], include_model: bool = True) -> None:
        if include_model:
            self.module.load_state_dict(sd["model"])
            if self.optimizer is not None and "optimizer" in sd:
                self.optimizer.load_state_dict(sd["optimizer"])
        if self.scheduler is not None and "scheduler" in sd:
            self.scheduler.load_state_dict(sd["scheduler"])
        if self.scaler is not None and sd.get("scaler"):  # a disabled GradScaler saves {}
            self.scaler.load_state_dict(sd["scaler"])
        for key, value in (sd.get("extra") or {}).items():
            current: Any = self.extra.get(key)
            if _stateful(current):
                current.load_state_dict(value)
            else:
                self.extra[key] = value

    def load_local_state_dict(self, sd: dict[str, Any]) -> None:
        if "rng" in sd:
            set_rng_state(sd["rng"])
        if self.sampler is not None and "sampler" in sd and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(sd["sampler"])

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.load_global_state_dict(sd)
        if "local" in sd:
            self.load_local_state_dict(sd["local"])


def _stateful(obj: object) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
