"""Flags shared by the subcommands that judge node health: ``--config`` and ``--set``."""

from __future__ import annotations

import argparse
from typing import Any

from trainguard.config import CONFIG_ENV, load
from trainguard.detect.thresholds import Thresholds


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="PATH", default=None, help=f"TOML settings file (default ${CONFIG_ENV})"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one setting, e.g. thresholds.pcie_replay_per_min=20 (repeatable; see docs/config.md)",
    )


def thresholds(args: Any) -> Thresholds:
    """The health thresholds: flags over $TRAINGUARD_THRESHOLDS_* over the file over defaults."""
    return load(
        Thresholds, "thresholds", path=getattr(args, "config", None), overrides=getattr(args, "settings", ())
    )
