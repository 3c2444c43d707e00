"""The runnable examples in the docstrings of the seams between the loops: the config's argv,
the results that travel between loops, the launchers, the control file, processes and colours."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "trainguard.control",
        "trainguard.palette",
        "trainguard.procs",
        "trainguard.rundir",
        "trainguard.supervisor.config",
        "trainguard.supervisor.launch",
        "trainguard.supervisor.local",
        "trainguard.supervisor.policy",
        "trainguard.supervisor.replicas.judge",
        "trainguard.supervisor.replicas.result",
        "trainguard.supervisor.result",
    ],
)
def test_module_examples_run(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
