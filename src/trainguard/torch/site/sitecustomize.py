"""Loaded at interpreter start in every worker of ``trainguard run --replica-groups`` (this folder
is put first on the groups' PYTHONPATH: `supervisor.replicas.start.group_env`), so a torchft
script written without trainguard gets what the groups need from torchft:

- when the script imports torchft, `trainguard.torch.ft.patch_torchft` runs: torchft's own DDP
  discards a step whose cross-group all-reduce failed instead of raising in the healthy group,
  and is refused in a group of more than one rank (it does not average within a group); every
  Manager records its discarded steps and beats per committed step; the quorum's store client
  gives up on a stopped peer after torchft's timeout;
- nothing else: no import of torch or torchft before the script's own, and the interpreter's
  own ``sitecustomize`` (the next one on sys.path), if any, still runs.

Stdlib only until torchft is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))


class _AfterTorchft(importlib.abc.MetaPathFinder):
    """Finds ``torchft`` as the other finders do, and patches it once its package has loaded."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torchft":
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not find this finder again
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: ModuleType) -> None:
            exec_module(module)
            try:
                from trainguard.torch.ft import patch_torchft

                patch_torchft()
            except Exception as exc:  # the script runs as torchft alone would
                print(f"trainguard: torchft left unpatched: {exc!r}", file=sys.stderr)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def _next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows (the next one on sys.path), if any."""
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == _HERE:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


if "torchft" not in sys.modules:
    sys.meta_path.insert(0, _AfterTorchft())
_next_sitecustomize()
