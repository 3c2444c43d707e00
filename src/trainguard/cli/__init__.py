"""The `trainguard` command. Each subcommand lives in its own module here and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` (the exit code).
Subcommand modules import their heavy dependencies inside ``func``, so ``trainguard --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from trainguard import __version__
from trainguard.errors import TrainguardError

# Order is the order of `trainguard --help`.
SUBCOMMANDS = [
    "check",
    "monitor",
    "diagnose",
    "logs",
    "run",
    "demo",
    "incidents",
    "report",
    "checkpoints",
    "agent",
    "remediate",
    "plan",
    "simulate",
    "reliability",
    "fleet",
    "hosts",
]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` one (what ``main`` builds for a command
    line that names it: each subcommand module costs its imports at start-up)."""
    parser = argparse.ArgumentParser(
        prog="trainguard",
        description="Keeps large-scale training alive through GPU failures.",
    )
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        if only is None or name == only:
            importlib.import_module(f"trainguard.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(named if named in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TrainguardError as exc:
        print(f"trainguard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
