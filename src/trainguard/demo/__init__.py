"""`trainguard demo`: a simulated 4-GPU node trains the DDP digits CNN under `trainguard run`
while a built-in chaos plan hits it with seven faults; a live view shows it, a report matches every
injected fault to the incident trainguard recorded (the demo is also a self-test: exit 0 only when
every fault was explained right, no incident is unexplained, accuracy stayed within the fault-free
reference's and the ETTR is the one the incidents' losses predict). See docs/demo.md.

    trainguard demo                      # ~2-3 minutes on 2 CPU cores, with a fault-free reference
    trainguard demo --quick --no-reference --json report.json
    trainguard demo --replica-groups 2   # torchft groups: one loses a GPU, the other never stops
    trainguard demo --framework keras    # the Keras tour: one Keras process, five faults

The CLI module registers the flags with `add_arguments` and calls `run`. Torch is imported by the
supervisor only when the demo runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "find_example", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags (the `trainguard demo` subcommand adds them to its parser)."""
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the report as JSON here")
    parser.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="keep checkpoints, run dirs, the incident DB and the plot here (default: a new temp dir)",
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="never run the fault-free reference (a recorded one of the same training is still used)",
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run (what the tests use)")
    parser.add_argument("--steps", type=int, metavar="N", help="training steps (faults scale with it)")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="divide the per-step delay by X (faster machine, or a quicker look; default 1)",
    )
    parser.add_argument("--plain", action="store_true", help="plain line output even on a terminal")
    parser.add_argument(
        "--replica-groups",
        type=int,
        default=0,
        metavar="N",
        help="instead: N torchft replica groups, a GPU fails in one and the others never stop "
        "(needs trainguard[torch,ft]; see trainguard.demo.groups)",
    )
    parser.add_argument(
        "--framework",
        choices=("torch", "keras"),
        default="torch",
        help="keras: the shorter Keras tour instead (one Keras process over the node's GPUs under "
        "--framework tf: NaN, Xid 79, kill, torn checkpoint, hang; needs trainguard[tf])",
    )
    parser.add_argument(
        "--script",
        type=Path,
        metavar="PATH",
        help="the training script (default: the digits example, examples/train_digits.py, or "
        "examples/train_keras.py with --framework keras)",
    )


def find_example(explicit: Path | None = None, framework: str = "torch") -> Path | None:
    """The training script: ``explicit`` if given, else the digits example shipped with the package
    (``examples/train_digits.py`` and ``examples/train_keras.py`` in the source tree link to them)."""
    if explicit is not None:
        return explicit if explicit.is_file() else None
    shipped = (
        Path(__file__).resolve().with_name("train_keras.py" if framework == "keras" else "train_digits.py")
    )
    return shipped if shipped.is_file() else None


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when the self-test passed (`trainguard.demo.report.verdict`)."""
    if getattr(args, "replica_groups", 0):
        from trainguard.demo.groups import main as groups_main

        return groups_main(args)
    from trainguard.demo.main import main

    return main(args)
