"""Flags shared by the subcommands that judge node health: ``--config`` and ``--set``; usage
errors with a gate's own exit code."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

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


def usage_errors_exit(parser: argparse.ArgumentParser, code: int) -> None:
    """Bad flags end ``parser``'s command with ``code``, not argparse's 2: a gate (a Slurm prolog,
    a probe) must not read a typo as "failed" (2). Leftover arguments, which the top-level parser
    would reject with 2, are rejected here too."""

    def usage_error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        parser.exit(code, f"{parser.prog}: error: {message}\n")

    parse_known = parser.parse_known_args

    def parse_strict(args: Any = None, namespace: Any = None) -> Any:
        ns, extras = parse_known(args, namespace)
        if extras:
            usage_error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    parser.error = usage_error  # type: ignore[method-assign]
    parser.parse_known_args = parse_strict  # type: ignore[method-assign]
