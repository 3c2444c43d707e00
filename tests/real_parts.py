"""Real parts a test needs (a Debian server, a browser, the shared reference data): one helper.

    from real_parts import require_real

    def test_scrape(tmp_path):
        exe = require_real("prometheus", install="apt-get install prometheus")

``require_real`` returns what it found (the executable's path, or ``found`` when it is given and
true). When the part is missing it fails the test, with how to install it, in strict mode (``make
test-all`` sets ``TRAINGUARD_REQUIRE_REAL=1``; ``CI=true`` turns it on too, unless
``TRAINGUARD_REQUIRE_REAL=0``), and skips it otherwise; ``tests/conftest.py`` lists those skips in
the terminal summary, so ``make test`` says what it did not exercise.
"""

from __future__ import annotations

import importlib
import os
import shutil
from typing import Any, NoReturn

import pytest

MISSING = "missing real part"  # how the skips start; conftest's summary looks for it


def strict() -> bool:
    """Whether a missing real part fails the run (CI, `make test-all`) instead of skipping."""
    flag = os.environ.get("TRAINGUARD_REQUIRE_REAL", "").strip().lower()
    if flag in ("1", "true", "yes"):
        return True
    if flag in ("0", "false", "no"):
        return False
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(part: str, install: str) -> NoReturn:
    """Fail (strict) or skip (otherwise) the running test: ``part`` is not on this machine."""
    message = f"{MISSING}: {part} (install: {install})"
    if strict():
        pytest.fail(f"{message}; a missing real part fails `make test-all` and CI", pytrace=False)
    pytest.skip(message, allow_module_level=True)  # also from a module's top: its tests all skip


def require_real(part: str, install: str, found: Any = None) -> Any:
    """The real ``part`` (default: the executable of that name on PATH), else fail or skip.

    ``found``: what stands for the part when it is not an executable (a path that exists, a
    loaded module); a false value means missing.
    """
    what = found if found is not None else shutil.which(part)
    if not what:
        missing(part, install)
    return what


def require_module(name: str, install: str) -> Any:
    """``import name`` (a Python package a real part needs, e.g. selenium or an extra such as
    torchft that `make install` installs), else fail or skip; at a module's top it fails or skips
    the whole module."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"python module {name}", install)
