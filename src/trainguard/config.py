"""Configuration: frozen dataclasses filled from a TOML file, ``TRAINGUARD_*`` environment
variables and ``--set`` flags, with precedence flag > env > file > default.

A section is a frozen dataclass whose fields all have defaults (``detect.thresholds.Thresholds``
is the ``thresholds`` section). The same field can be set three ways::

    # trainguard.toml (given with --config PATH or $TRAINGUARD_CONFIG)
    [thresholds]
    pcie_replay_per_min = 20
    app_xids = [13, 31, 43, 109]

    TRAINGUARD_THRESHOLDS_PCIE_REPLAY_PER_MIN=20 trainguard check
    trainguard check --set thresholds.pcie_replay_per_min=20

    >>> from trainguard.detect.thresholds import Thresholds
    >>> load(Thresholds, "thresholds", env={}, overrides=["thresholds.app_xids=13,31"]).app_xids
    (13, 31)

A misspelt name or a value of the wrong type is a ``ConfigError`` that names where it came from
and what would be accepted: a silently ignored threshold is worse than none.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from trainguard.errors import ConfigError

T = TypeVar("T")

CONFIG_ENV = "TRAINGUARD_CONFIG"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def load(
    cls: type[T],
    section: str,
    *,
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Iterable[str] = (),
) -> T:
    """``cls`` with the defaults overridden by ``path`` (else ``$TRAINGUARD_CONFIG``), then by
    ``TRAINGUARD_<SECTION>_<FIELD>`` variables of ``env``, then by ``section.field=value`` overrides."""
    env = os.environ if env is None else env
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    path = path or env.get(CONFIG_ENV) or None
    if path is not None:
        table = _read_toml(Path(path)).get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{section}] must be a table of settings")
        for name, raw in table.items():
            values[name] = _coerce(
                raw, _known(name, defaults, f"{path} [{section}]"), f"{path} [{section}] {name}"
            )
    prefix = f"TRAINGUARD_{section.upper()}_"
    for key, raw in env.items():
        if key.startswith(prefix):
            name = key[len(prefix) :].lower()
            values[name] = _coerce(raw, _known(name, defaults, f"environment variable {key}"), key)
    for item in overrides:
        where = f"--set {item}"
        dotted, sep, raw = item.partition("=")
        sect, dot, name = dotted.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(
                f"{where}: expected SECTION.FIELD=VALUE, e.g. thresholds.pcie_replay_per_min=20"
            )
        if sect == section:
            values[name] = _coerce(raw.strip(), _known(name, defaults, where), where)
    return cls(**values)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist (given by --config or ${CONFIG_ENV})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _known(name: str, defaults: dict[str, Any], where: str) -> Any:
    if name in defaults:
        return defaults[name]
    close = difflib.get_close_matches(name, defaults, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(defaults))}"
    raise ConfigError(f"{where}: unknown setting {name!r}; {hint}")


def _coerce(raw: Any, default: Any, where: str) -> Any:
    """``raw`` (a TOML value or a string) as the type of ``default``."""
    try:
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError(raw)
        if isinstance(default, tuple):
            items = raw if isinstance(raw, list) else [s for s in str(raw).split(",") if s.strip()]
            kind = type(default[0]) if default else str
            return tuple(_coerce(item, kind(), where) for item in items)
        if isinstance(default, int | float) and isinstance(raw, bool):
            raise ValueError(raw)
        if isinstance(default, int):
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        expected = "a list" if isinstance(default, tuple) else type(default).__name__
        raise ConfigError(f"{where}: {raw!r} is not {expected} (default {default!r})") from None
