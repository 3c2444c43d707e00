"""What an exact resume of a Keras job restores, as plain NumPy arrays (imports NumPy).

A Keras 3 model's whole training state is variables: the model's (weights, and the state of
every ``SeedGenerator`` its layers draw dropout and noise from), the optimizer's (``iteration``,
the learning rate, momenta) and Keras's global seed generator. Beside them, the host's own
generators (Python's ``random``, NumPy's legacy global state) that input code may draw from.
A Keras 2 model (``tf_keras``) is read the same way; its dropout draws from TensorFlow's
stateful generators, which are not variables: its resume is exact up to those draws.

    >>> arrays, host = snapshot(model)        # doctest: +SKIP
    >>> restore(model, arrays, host)          # doctest: +SKIP

Arrays are keyed ``<group>/<index>`` (``model/0003``: the model's fourth variable) in the order
Keras keeps them, which the model's structure fixes; names would not do (Keras numbers its
layers per process: ``dense_4`` in one is ``dense`` in the next). ``restore`` requires every key
of the model to be there with the same shape and dtype, and names the first that is not, by its
path (`StateMismatch`): a checkpoint of another model never half-loads.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from trainguard.errors import CheckpointError

__all__ = [
    "StateMismatch",
    "dtype_of",
    "host_rng",
    "path_of",
    "restore",
    "set_host_rng",
    "snapshot",
    "variables",
]


class StateMismatch(CheckpointError):
    """A checkpoint does not fit the model it is loaded into (another model, or changed layers)."""


def _global_seed_generator() -> Any | None:
    """Keras's global ``SeedGenerator`` (used by random ops given no seed), if one was made."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # a Keras whose internals moved: its global stream is not restored
        return None
    return global_state.get_global_attribute("global_seed_generator")


def variables(model: Any) -> dict[str, Any]:
    """Every variable of the training state, keyed as in the module docstring, in a fixed order."""
    out: dict[str, Any] = {}
    for i, v in enumerate(model.variables):
        out[f"model/{i:04d}"] = v
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        # Slots exist once built, which Keras 3 (``built``) and tf_keras (``_built``, set only by
        # ``build``: absent on a fresh optimizer) do at the first step: a resume before it builds.
        built = getattr(optimizer, "built", getattr(optimizer, "_built", False))
        if not built and callable(getattr(optimizer, "build", None)):
            with model.distribute_strategy.scope():
                optimizer.build(model.trainable_variables)
        for i, v in enumerate(optimizer.variables):
            out[f"optimizer/{i:04d}"] = v
    seeds = _global_seed_generator()
    if seeds is not None:
        out["seed/0000"] = seeds.state
    return out


def snapshot(model: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(every variable's value as a host array, the host generators' state as JSON-able values)."""
    arrays = {key: np.array(v.numpy()) for key, v in variables(model).items()}
    return arrays, host_rng()


def path_of(v: Any) -> str:
    """A variable's name as its Keras shows it (Keras 3: ``path``; Keras 2: ``name``)."""
    return str(getattr(v, "path", None) or v.name)


def dtype_of(v: Any) -> np.dtype[Any]:
    return np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype))


def restore(model: Any, arrays: dict[str, np.ndarray], host: dict[str, Any] | None) -> None:
    """Put ``arrays`` (and the host generators' ``host``) back into ``model``; checked whole first."""
    targets = variables(model)
    missing = [k for k in targets if k not in arrays and not k.startswith("seed/")]
    if missing:
        raise StateMismatch(
            f"the checkpoint has no {missing[0]} ({path_of(targets[missing[0]])}): it was written for another model"
        )
    extra = [k for k in arrays if k not in targets and not k.startswith("seed/")]
    if extra:
        raise StateMismatch(
            f"the checkpoint has {extra[0]}, which this model lacks: it was written for another model"
        )
    for key, v in targets.items():
        if key not in arrays:
            continue
        value = arrays[key]
        shape, dtype = tuple(v.shape), dtype_of(v)
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise StateMismatch(
                f"{key} ({path_of(v)}): the checkpoint holds {value.dtype}{list(value.shape)}, the model "
                f"{dtype}{list(shape)}: it was written for another model"
            )
    for key, v in targets.items():
        if key in arrays:
            v.assign(arrays[key])
    if host is not None:
        set_host_rng(host)


def host_rng() -> dict[str, Any]:
    """Python's and NumPy's global generator state, as JSON-able values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": [version, list(internal), gauss],
        "numpy": [str(kind), np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }


def set_host_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
