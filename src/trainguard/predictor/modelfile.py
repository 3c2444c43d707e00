"""The failure predictor's model file: one safetensors file, weights plus a JSON header.

    model.safetensors = 8-byte header length | header JSON {tensor table, "__metadata__":
                        {"trainguard_predictor": <the Header as JSON>}} | the weights

No pickle anywhere: the weights load with safetensors, the header is plain JSON, and
`read_header` reads it with the standard library alone (what a version check needs). A file of
another format version is refused with the command that makes a new one. Written atomically
(temp file, fsync, rename, fsync the folder): a crash leaves the old file or the new one.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import InputError
from trainguard.reliability import need

__all__ = ["FORMAT", "VERSION", "Header", "load", "read_header", "save"]

FORMAT = "trainguard-predictor"
VERSION = 1  # bump when the header's meaning or the nets' layout changes
_KEY = "trainguard_predictor"
_RETRAIN = "train a new one with `trainguard reliability train-predictor`"


@dataclass(frozen=True)
class Header:
    """Everything but the weights: how to turn a series into the net's input, and what the
    probabilities mean."""

    arch: str  # "mlp" (over `features`) or "cnn" (over the window's `channels`)
    size: int  # the net's input width: features or channels
    step_s: float  # the series' step the model was trained on
    width: int  # steps in a window
    horizons_s: tuple[float, ...]  # P(failure within each)
    channels: tuple[str, ...]
    features: tuple[str, ...]
    mean: tuple[float, ...]  # input normalisation (per feature or per channel)
    std: tuple[float, ...]
    platt: tuple[tuple[float, float], ...]  # per horizon: p = sigmoid(a * logit + b)
    thresholds: tuple[float, ...]  # per horizon: the probability that raises a finding
    training: dict[str, Any] = field(default_factory=dict)  # data, split, seed, held-out figures
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str, path: Path) -> Header:
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise InputError(f"{path} is not a trainguard failure-predictor model file; {_RETRAIN}")
        if raw.get("version") != VERSION:
            raise InputError(
                f"{path} is a failure-predictor model of format version {raw.get('version')}; this "
                f"trainguard reads version {VERSION}: {_RETRAIN}"
            )
        tuples = ("horizons_s", "channels", "features", "mean", "std", "thresholds")
        raw.update({k: tuple(raw[k]) for k in tuples})
        raw["platt"] = tuple(tuple(ab) for ab in raw["platt"])
        try:
            return cls(**raw)
        except TypeError as exc:
            raise InputError(
                f"{path}: the model header does not hold what version {VERSION} needs ({exc})"
            ) from None


def read_header(path: str | Path) -> Header:
    """The header alone, read with the standard library (no torch, no safetensors)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 2**20:
                raise ValueError("header too long")
            table = json.loads(f.read(n))
        text = table["__metadata__"][_KEY]
    except OSError as exc:
        raise InputError(f"cannot read the model file {p}: {exc.strerror}") from None
    except (struct.error, ValueError, KeyError, TypeError):
        raise InputError(f"{p} is not a trainguard failure-predictor model file; {_RETRAIN}") from None
    return Header.from_json(text, p)


def save(path: str | Path, header: Header, state: dict[str, Any]) -> Path:
    """Write the weights (a state dict) and the header, atomically."""
    from trainguard.rundir import atomic_write_bytes

    st = need("safetensors.torch", "predictor")
    p = Path(path)
    data = st.save({k: v.detach().contiguous() for k, v in state.items()}, metadata={_KEY: header.to_json()})
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(p, data)
    return p


def load(path: str | Path) -> tuple[Header, dict[str, Any]]:
    """The header (checked first) and the weights."""
    header = read_header(path)
    st = need("safetensors.torch", "predictor")
    try:
        state = st.load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types on a torn file
        raise InputError(f"{path}: the model weights cannot be read ({exc}); {_RETRAIN}") from None
    return header, state
