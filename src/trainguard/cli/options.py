"""Flags shared by the subcommands: ``--config`` and ``--set``; the simulated node's
(``--backend``, ``--scenario``, ``--gpus``, ``--seed``); which GPUs (``--gpu-ids``); usage errors
with a gate's own exit code.

``--gpus`` means one thing in every command: how many GPUs (of the simulated node, or of the job a
planner models). Which GPUs, by index, is ``--gpu-ids``.
"""

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


def gpu_count(text: str) -> int:
    """``--gpus``: a number of GPUs. A list of indices is the other flag, said so."""
    if not text.strip().isdigit() or int(text) < 1:
        hint = f"; to pick GPUs by index use --gpu-ids {text}" if "," in text else ""
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs (--gpus N counts GPUs){hint}")
    return int(text)


def add_sim_node_options(
    parser: argparse.ArgumentParser,
    backends: tuple[str, ...] = ("nvml", "sim"),
    default_backend: str = "nvml",
    defaults: bool = True,
) -> None:
    """Where a command's node comes from and, when it is simulated, its size and seed.
    ``defaults=False``: unset flags stay None (the command's config file decides)."""
    parser.add_argument(
        "--backend", choices=backends, default=None, help=f"telemetry source (default {default_backend})"
    )
    parser.add_argument("--scenario", metavar="NAME", help="simulated fault scenario (implies --backend sim)")
    parser.add_argument(
        "--gpus",
        type=gpu_count,
        default=8 if defaults else None,
        metavar="N",
        help="GPUs of the simulated node (default 8)",
    )
    parser.add_argument(
        "--seed", type=int, default=0 if defaults else None, metavar="S", help="seed of the simulated node"
    )


class _MovedToGpuIds(argparse.Action):
    def __call__(
        self, parser: argparse.ArgumentParser, ns: Any, values: Any, option: str | None = None
    ) -> None:
        parser.error(
            f"--gpus {values} picks GPUs here no more: use --gpu-ids {values} (--gpus N counts GPUs)"
        )


def add_gpu_ids(parser: Any, help: str) -> None:
    """``--gpu-ids LIST`` (dest ``gpu_ids``), and ``--gpus LIST``, its former spelling, refused
    with the fix (``parser``: a parser or an argument group)."""
    parser.add_argument("--gpu-ids", default=None, metavar="LIST", help=help)
    parser.add_argument("--gpus", action=_MovedToGpuIds, metavar="LIST", help=argparse.SUPPRESS)


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
