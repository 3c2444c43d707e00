"""`trainguard.detect` imports its modules on first use: `logs scan` does not load the followers."""

from __future__ import annotations

import importlib
import subprocess
import sys

import trainguard.detect as detect


def test_every_exported_name_resolves_to_its_module() -> None:
    assert sorted(detect._HOME) == sorted(detect.__all__)
    for name in detect.__all__:
        module = importlib.import_module(detect._HOME[name])
        assert getattr(detect, name) is getattr(module, name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        detect.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_the_scanner_does_not_load_the_followers() -> None:
    code = "import sys, trainguard.detect.scan; print('trainguard.telemetry.follow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
