"""The runnable examples in the incidents modules' docstrings stay true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "taxonomy",
    "correlate",
    "incident",
    "goodput",
    "store",
    "series",
    "flight",
    "flight_order",
    "hosts",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    # importlib: the package re-exports the function `goodput`, which shadows the submodule's name.
    module = importlib.import_module(f"trainguard.incidents.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
