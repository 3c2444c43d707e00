"""docs/architecture.md names only what exists: every path, module, class, method and function it
cites in backticks (and every ``*.py`` path in its prose) is found in the tree, so the map cannot drift from the code unnoticed.

What a citation is, by its shape (anything else in backticks, a flag or a URL, is prose):

    `supervisor/elastic.py`, `checkpoint/`      a path under src/trainguard/ (or the repository)
    `trainguard.torch`                          a module or package
    `Supervisor`, `AgentDaemon.act(judged)`     a class (and a method or attribute of it)
    `assemble()`, `bookkeeping.incident_of`     a function (in that module, when one is named)
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "trainguard"
DOC = ROOT / "docs" / "architecture.md"

CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w./<>-]*/[\w./<>-]*$|^[\w-]+\.py$")
PY_IN_PROSE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b")
DATA = re.compile(r"^[\w.-]+\.(json|toml|csv|txt|md|db|log|yaml|safetensors)$")  # a file made at run time
MODULE = re.compile(r"^trainguard(\.\w+)+$")
CLASS = re.compile(r"^([A-Z]\w*[a-z]\w*)(?:\.(\w+))?(?:\(.*\))?$")  # CamelCase, not CONSTANTS
FUNCTION = re.compile(r"^(?:(\w+)\.)?([a-z_]\w*)\(.*\)$|^(\w+)\.([a-z_]\w*)$")


@functools.cache
def definitions() -> dict[str, set[str]]:
    """Every class and function defined in src/trainguard, by name -> the modules (dotted) that
    define it; a class's methods and attributes as ``Class.name``."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, set()).add(module)
                for item in node.body:
                    names: list[str] = []
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names = [item.name]
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names = [item.target.id]
                    elif isinstance(item, ast.Assign):
                        names = [t.id for t in item.targets if isinstance(t, ast.Name)]
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):  # self.NAME = ...
                        names += [
                            t.attr
                            for sub in ast.walk(item)
                            if isinstance(sub, ast.Assign | ast.AnnAssign)
                            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
                            if isinstance(t, ast.Attribute)
                            and isinstance(t.value, ast.Name)
                            and t.value.id == "self"
                        ]
                    for name in names:
                        found.setdefault(f"{node.name}.{name}", set()).add(module)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.setdefault(node.name, set()).add(module)
    return found


def _module_exists(dotted: str) -> bool:
    base = SRC.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _path_exists(cited: str) -> bool:
    cited = re.sub(r"<[^>]*>", "*", cited).removeprefix("src/trainguard/").removeprefix("trainguard/")
    if "*" in cited or cited.startswith("."):  # a pattern of names made at run time
        return True
    if "/" not in cited:  # a file named in its folder's paragraph: somewhere in the package
        return any(SRC.rglob(cited))
    return any((base / cited).exists() for base in (SRC, ROOT, ROOT / "src"))


def problems(text: str) -> list[str]:
    """What the document cites that the tree does not hold, one line each."""
    defs, out = definitions(), []
    cited_py = {m for m in PY_IN_PROSE.findall(CODE.sub("", text))}  # file names outside backticks too
    for cited in sorted(set(CODE.findall(text)) | cited_py):
        cited = cited.strip()
        if " " in cited or cited.startswith(("-", "/", "http")):
            continue  # a command line, a flag, a route, a URL
        if DATA.match(cited):
            continue
        if PATH.match(cited):
            if not _path_exists(cited):
                out.append(f"{cited}: no such file or folder")
        elif MODULE.match(cited):
            if not _module_exists(cited):
                out.append(f"{cited}: no such module")
        elif m := CLASS.match(cited):
            cls, member = m.groups()
            if cls not in defs:
                out.append(f"{cited}: no class {cls}")
            elif member and f"{cls}.{member}" not in defs:
                out.append(f"{cited}: {cls} has no {member}")
        elif m := FUNCTION.match(cited):
            owner, name = (m.group(1), m.group(2)) if m.group(2) else (m.group(3), m.group(4))
            if name not in defs:
                out.append(f"{cited}: no function {name}")
            elif owner and not any(mod.rsplit(".", 1)[-1] == owner for mod in defs[name]):
                out.append(f"{cited}: {name} is not in a module {owner}")
    return out


def test_every_path_and_name_architecture_md_cites_exists():
    assert problems(DOC.read_text(encoding="utf-8")) == []


def test_the_check_catches_a_path_a_class_a_method_and_a_function_that_do_not_exist():
    text = (
        "`supervisor/elastic.py` `agentd/` `Supervisor` `Supervisor.run()` `NoSuchThing` "
        "`Supervisor.fly()` `assemble()` `vanish()` `bookkeeping.incident_of` `policy.incident_of` "
        "`trainguard.torch` `trainguard.recover` `--json` `trainguard run` `control.json` "
        "and in prose agent/daemon.py, agent/gone.py, daemon.py, gone.py."
    )
    assert problems(text) == [
        "NoSuchThing: no class NoSuchThing",
        "Supervisor.fly(): Supervisor has no fly",
        "agent/gone.py: no such file or folder",
        "agentd/: no such file or folder",
        "gone.py: no such file or folder",
        "policy.incident_of: incident_of is not in a module policy",
        "trainguard.recover: no such module",
        "vanish(): no function vanish",
    ]
