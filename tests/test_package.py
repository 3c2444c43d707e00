"""The package's promises: a stdlib-only import and a working console script."""

from __future__ import annotations

import subprocess
import sys

HEAVY = [
    "torch", "pynvml", "prometheus_client", "numpy", "matplotlib", "rich", "flask", "fastapi", "sklearn",
    "tensorflow", "keras", "tf_keras",
]  # fmt: skip


def test_import_trainguard_pulls_no_heavy_dependency():
    code = (
        "import sys, trainguard, trainguard.records, trainguard.errors, trainguard.rundir, trainguard.cli;"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_help_lists_the_subcommands():
    out = subprocess.run([sys.executable, "-m", "trainguard.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "usage: trainguard" in out.stdout
