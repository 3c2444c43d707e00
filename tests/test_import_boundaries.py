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
    "trainguard.supervisor.tf",  # TensorFlow's launcher: the workers import TF, never the supervisor
    "trainguard.supervisor.lost",
    "trainguard.supervisor.bookkeeping",
    "trainguard.supervisor.state",
    "trainguard.supervisor.policy",
    "trainguard.supervisor.replicas",  # replica groups: torchft only in the groups' workers
    "trainguard.supervisor.launch",
    "trainguard.supervisor.local",  # the launcher without torch
    "trainguard.supervisor.torchrun",  # torch's launcher: torch only once it launches
    "trainguard.supervisor.mpirun",  # Open MPI's launcher: mpi4py is the rank's program's, never ours
    "trainguard.mpi.rank",  # the per-rank wrapper, in every rank
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


# What `trainguard run` imports before its workers start (besides torch's launcher), and what only
# some runs need or what loads only after the workers started: the simulated node (--backend sim), the agent, the analytics, NVML, plotting,
# the flight-recorder judge (a hang).
# Each is seconds of nothing on the first step's path (issue 36: a start no slower than torchrun's).
START_PATH = ["trainguard.cli", "trainguard.cli.run", "trainguard.supervisor.supervisor",
              "trainguard.supervisor.torchrun", "trainguard.supervisor.warm", "trainguard.supervisor.logs"]  # fmt: skip
NOT_ON_THE_START_PATH = ["trainguard.telemetry.sim", "trainguard.telemetry.nvml", "trainguard.agent",
                         "trainguard.reliability", "trainguard.predictor", "trainguard.remediate",
                         "trainguard.demo", "trainguard.incidents.flight",  # judged on a hang only
                         "pynvml", "matplotlib", "sqlite3",
                         # the loop's machinery: loaded after the workers started (supervisor.supervisor)
                         "trainguard.incidents.store", "trainguard.incidents.taxonomy",
                         "trainguard.incidents.correlate", "trainguard.detect.detector",
                         "trainguard.detect.merge", "trainguard.chaos", "trainguard.supervisor.result",
                         "trainguard.supervisor.bookkeeping", "trainguard.supervisor.assess",
                         "trainguard.supervisor.observe", "trainguard.supervisor.decide",
                         "trainguard.supervisor.replicas"]  # fmt: skip


def test_the_start_path_of_trainguard_run_imports_only_what_every_run_needs():
    probe = (
        "import importlib, json, sys\n"
        f"for m in {START_PATH!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert [m for m in NOT_ON_THE_START_PATH if m in loaded] == []


# The floors of the house, lowest first (docs/architecture.md draws them). A module imports its own
# floor and those below, never one above, and no two folders import each other (no circle), even
# on one floor. A folder or top-level module that is on no floor, or a name here that is gone,
# fails the tests below: placing one is a one-line change. "trainguard" is the package's own
# __init__.py. Imports are read from the AST, those inside functions and under TYPE_CHECKING too.
FLOORS: tuple[tuple[str, ...], ...] = (
    (
        "trainguard",
        "records",
        "actions",
        "errors",
        "clock",
        "config",
        "rundir",
        "control",
        "procs",
        "tokens",
        "palette",
    ),  # nouns, files
    ("telemetry",),  # look: NVML, the simulated node, kernel-log lines
    ("detect", "checkpoint", "diagnose", "balance"),  # judge: rules, verdicts, checks, GPU tests, shares
    ("incidents", "chaos"),  # record: the store, taxonomy, goodput; fault plans
    (
        "remediate",
        "reliability",
        "predictor",
        "torch",
        "keras",
        "mpi",
    ),  # the agent's act, failure models, the trainer's side
    ("agent", "supervisor"),  # the two loops
    ("demo",),
    ("cli",),
)
# Imports that go up a floor, each with why: at most one, and none today.
UPWARD: dict[tuple[str, str], str] = {}


def _imports(path: Path, package: str = "trainguard") -> set[str]:
    """Every module ``path`` imports, absolute (relative imports resolved against ``package``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _room(src: Path, module: str) -> str | None:
    """The folder or top-level module of the package that ``module`` names (None: not ours)."""
    parts = module.split(".")
    if parts[0] != "trainguard":
        return None
    if len(parts) == 1:
        return "trainguard"
    if (src / parts[1]).is_dir() or (src / f"{parts[1]}.py").is_file():
        return parts[1]
    return "trainguard"  # a name the package itself defines (`from trainguard import __version__`)


def _room_of_file(src: Path, path: Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0] if len(rel.parts) > 1 else ("trainguard" if rel.stem == "__init__" else rel.stem)


def _arrows(src: Path) -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) -> the files that import across, for every pair of rooms."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in _modules(src):
        rel = path.relative_to(src)
        package = ".".join(["trainguard", *rel.parts[:-1]])
        here = _room_of_file(src, path)
        for name in sorted(_imports(path, package)):
            there = _room(src, name)
            if there is not None and there != here:
                files = arrows.setdefault((here, there), [])
                if str(rel) not in files:
                    files.append(str(rel))
    return arrows


def _upward(src: Path, floors: tuple[tuple[str, ...], ...]) -> dict[str, list[str]]:
    """``"importer (floor i) -> imported (floor j)": files`` for every arrow that goes up a floor
    and is not named in UPWARD."""
    floor = {room: n for n, rooms in enumerate(floors) for room in rooms}
    return {
        f"{a} (floor {floor[a]}) -> {b} (floor {floor[b]})": files
        for (a, b), files in sorted(_arrows(src).items())
        if a in floor and b in floor and floor[b] > floor[a] and (a, b) not in UPWARD
    }


def _circles(src: Path) -> list[list[str]]:
    """Groups of folders that reach each other through imports (strongly connected, 2 or more)."""
    graph: dict[str, set[str]] = {}
    for a, b in _arrows(src):
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    reach = {a: _reachable(graph, a) for a in graph}
    groups = {frozenset(b for b in reach[a] if a in reach[b]) | {a} for a in graph}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for b in graph[todo.pop()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def _rooms(src: Path) -> set[str]:
    return {_room_of_file(src, p) for p in _modules(src)}


def test_every_folder_and_top_level_module_is_on_a_floor():
    placed = {room for rooms in FLOORS for room in rooms}
    assert sorted(_rooms(SRC) - placed) == []
    assert sorted(placed - _rooms(SRC)) == []  # a name that is gone: take it out


def test_no_module_imports_a_floor_above_its_own():
    assert _upward(SRC, FLOORS) == {}
    assert len(UPWARD) <= 1, "one named arrow upward at most: move the code instead"


def test_no_two_folders_import_each_other():
    assert _circles(SRC) == []


def test_the_floor_checks_see_an_import_upward_and_a_circle(tmp_path):
    src = tmp_path / "trainguard"
    files = {
        "__init__.py": "from trainguard.records import Health\n",
        "records.py": "",
        "detect/rules.py": "def f():\n    from trainguard.cli.run import main  # upward, inside a function\n",
        "remediate/api.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..agent import auth\n",
        "agent/daemon.py": "from trainguard import remediate\n",
        "cli/run.py": "import trainguard.detect.rules\n",
    }
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    floors = (("trainguard", "records"), ("detect",), ("remediate",), ("agent",), ("cli",))
    assert _upward(src, floors) == {
        "detect (floor 1) -> cli (floor 4)": ["detect/rules.py"],
        "remediate (floor 2) -> agent (floor 3)": ["remediate/api.py"],
    }
    assert _circles(src) == [["agent", "remediate"], ["cli", "detect"]]
    assert (
        _room(src, "trainguard.agent.auth") == "agent"
        and _room(src, "trainguard.__version__") == "trainguard"
    )


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


def test_only_the_checkpoint_sealing_imports_cryptography():
    importers = {
        str(p.relative_to(SRC))
        for p in _modules(SRC)
        if any(n.split(".")[0] == "cryptography" for n in _imports(p))
    }
    assert importers == {"checkpoint/sealing.py"}


# Names of records.py's and actions.py's nouns that another module also gives a class, each with
# why it may. Empty, and kept so.
SAME_NAME: set[tuple[str, str]] = set()


def _classes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_each_shared_noun_is_defined_once():
    shared = (SRC / "records.py", SRC / "actions.py")
    nouns = _classes(shared[0]) | _classes(shared[1])
    again = {
        (str(p.relative_to(SRC)), name)
        for p in _modules(SRC)
        if p not in shared
        for name in _classes(p) & nouns
    }
    assert sorted(again - SAME_NAME) == []


# Run as a user runs it: what `trainguard run` has loaded when it starts its first worker.
SPAWN_PROBE = """
import json, subprocess, sys
out, argv = sys.argv[1], sys.argv[2:]
start = subprocess.Popen.__init__
def spawn(self, args, *a, **k):
    if "worker.py" in " ".join(map(str, args)) and not open(out).read():
        with open(out, "w") as f:
            json.dump(sorted(sys.modules), f)
    return start(self, args, *a, **k)
subprocess.Popen.__init__ = spawn
from trainguard.cli import main
sys.exit(main(argv))
"""


def test_trainguard_run_starts_its_workers_before_it_loads_the_loops_machinery(tmp_path):
    (tmp_path / "worker.py").write_text("")  # a rank that exits at once
    out = tmp_path / "modules.json"
    out.write_text("")
    argv = ["run", "--launcher", "local", "--nproc-per-node", "2", "--no-tee", "--db", str(tmp_path / "tg.db"),
            "--runs-dir", str(tmp_path / "runs"), str(tmp_path / "worker.py")]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SPAWN_PROBE, str(out), *argv], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(out.read_text()))
    assert "trainguard.supervisor.supervisor" in loaded  # the probe saw the supervisor's spawn
    assert [m for m in NOT_ON_THE_START_PATH if m in loaded] == []
    # ...and the machinery came after: the job is in the store, its attempt recorded
    assert "all workers finished" in done.stderr and "1 attempt(s)" in done.stderr
