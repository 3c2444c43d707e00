"""The spine's import boundaries: stdlib-only cores, data flowing one way, the CLI on top."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "trainguard"

# Importing these must pull in no third-party module (torch, pynvml, rich, numpy...).
SPINE = [
    "trainguard",
    "trainguard.telemetry",
    "trainguard.telemetry.sim",
    "trainguard.detect",
    "trainguard.incidents",
    "trainguard.checkpoint",
    "trainguard.agent",
    "trainguard.agent.daemon",
    "trainguard.chaos",
    "trainguard.supervisor",
    "trainguard.supervisor.supervisor",  # the monitor loop: torch only once it launches
    "trainguard.supervisor.observe",
    "trainguard.supervisor.assess",
    "trainguard.supervisor.idle",
    "trainguard.supervisor.lost",
    "trainguard.supervisor.bookkeeping",
    "trainguard.supervisor.state",
    "trainguard.supervisor.policy",
    "trainguard.supervisor.replicas",  # replica groups: torchft only in the groups' workers
    "trainguard.supervisor.launch",
    "trainguard.supervisor.local",  # the launcher without torch
    "trainguard.supervisor.torchrun",  # torch's launcher: torch only once it launches
    "trainguard.procs",
    "trainguard.diagnose",  # the GPU tests: torch/pynvml only when a test runs
    "trainguard.reliability",
]

_PROBE = """
import importlib, json, sys
before = set(sys.modules)
importlib.import_module(sys.argv[1])
roots = {m.split(".")[0] for m in set(sys.modules) - before}
print(json.dumps(sorted(r for r in roots if r not in sys.stdlib_module_names and r != "trainguard")))
"""


@pytest.mark.parametrize("module", SPINE)
def test_the_spine_imports_no_third_party_module(module):
    out = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _forbidden(folders: list[str], prefixes: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {
        str(p.relative_to(SRC)): sorted(n for n in _imports(p) if n.startswith(prefixes))
        for folder in folders
        for p in _modules(SRC / folder)
    }
    return {k: v for k, v in bad.items() if v}


def test_detect_never_imports_the_supervisor():
    assert _forbidden(["detect"], ("trainguard.supervisor",)) == {}


def test_the_libraries_the_supervisor_uses_never_import_it():
    # Diagnostics, incidents, telemetry and the reliability models are used by the supervisor,
    # the node agent and the CLI alike: data flows from them, never back.
    assert _forbidden(["diagnose", "incidents", "telemetry", "reliability"], ("trainguard.supervisor",)) == {}


# The agent's HTTP side and Prometheus view: they read the loop's state; the loop runs without them.
AGENT_EDGES = (
    "trainguard.agent.serve",
    "trainguard.agent.server",
    "trainguard.agent.api",
    "trainguard.agent.prometheus",
)
AGENT_LOOP = ["config", "daemon", "judge", "node", "snapshot", "state", "tick", "verdicts"]


def test_the_node_agent_never_imports_what_serves_it():
    bad = {
        f"agent/{m}.py": sorted(n for n in _imports(SRC / "agent" / f"{m}.py") if n.startswith(AGENT_EDGES))
        for m in AGENT_LOOP
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_only_the_agents_server_imports_aiohttp():
    importers = {
        str(p.relative_to(SRC))
        for p in _modules(SRC)
        if any(n.split(".")[0] == "aiohttp" for n in _imports(p))
    }
    assert importers == {"agent/server.py"}


def test_nothing_below_the_cli_imports_the_cli():
    # The demo too is below it: `trainguard demo` (cli/demo.py) runs it, and the colours both
    # draw with are the ground floor's (palette.py).
    below = [p for p in _modules(SRC) if "cli" not in p.relative_to(SRC).parts]
    bad = {
        str(p.relative_to(SRC)): sorted(n for n in _imports(p) if n.startswith("trainguard.cli"))
        for p in below
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_boundary_checks_see_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from trainguard.supervisor.assess import assess\nimport trainguard.cli.run\n")
    assert {"trainguard.supervisor.assess", "trainguard.cli.run"} <= _imports(bad)
