"""Score `logs explain`'s flight-recorder judgement, and torch's own analyser, on recorded jobs.

    .venv/bin/python tools/flight_score.py [DIR] [--set design|score] [--json]

DIR (default tests/data/flight) holds one folder per job: the ranks' dumps and an
``expected.json`` with the ranks the faults were put on (``culprits``, late ones included), the
world size and the job's set (``design``: what the analysis was written against; ``score``: set
aside, only measured). For each job and each analyser it counts the faulted ranks named and the
healthy ranks named (a false culprit is a wrong action: it would exclude a healthy GPU).

trainguard: the ranks `logs explain` names (``FlightVerdict.ranks``, late ranks included), the way
the CLI judges (`cli.logs_explain.flight_verdict`); its suspects are listed, not counted.

torch's analyser (``torch.distributed.flight_recorder``, what ``torchfrtrace`` runs), given the
same dumps (``--allow-incomplete-ranks``, as a job with a dead rank needs): the ranks it reports,
the ``missing ranks`` of a collective not every rank joined, the ``Culprit rank``s of a mismatch,
and the ranks it says it "missed FR dumps from" (it names them as the reason it cannot decide).
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def ours(job: Path) -> dict[str, Any]:
    from trainguard.cli.logs_explain import flight_verdict

    verdict = flight_verdict([job], set())
    if verdict is None:
        return {"named": [], "suspects": [], "category": "no dumps"}
    return {"named": list(verdict.ranks), "suspects": sorted(verdict.suspects), "category": verdict.category}


def reference(job: Path) -> dict[str, Any]:
    """The ranks torch's flight-recorder analyser reports for the dumps under ``job``."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig

    from trainguard.incidents.flight import dump_files
    from trainguard.torch.flight_recorder import read_dump

    details = {}
    for rank, path in dump_files(job).items():
        data = read_dump(path)
        if data is not None:
            details[path.name] = copy.deepcopy({**data, "rank": rank})
    if not details:
        return {"named": [], "error": "no dumps"}
    version = str(next(iter(details.values()))["version"])
    args = JobConfig().parse_args([str(job), "--allow-incomplete-ranks"])
    log, stream = logging.getLogger("Flight Recorder"), io.StringIO()
    handler = logging.StreamHandler(stream)
    saved = log.handlers[:]
    log.handlers = [handler]
    try:
        db = build_db(details, args, version)
    except Exception as exc:  # torch's analyser gives up on some jobs: that is its answer
        return {"named": [], "error": f"{type(exc).__name__}: {exc}"[:200]}
    finally:
        log.handlers = saved
    named: set[int] = set()
    for c in db.collectives:
        named |= set(c.missing_ranks or ())
        named |= set(c.mismatch_collectives or {})
    text = stream.getvalue()
    for found in re.findall(r"Culprit rank (\d+)", text):
        named.add(int(found))
    no_dump: set[int] = set()
    for group in re.findall(r"missed FR dumps from ranks \((\{[^}]*\})\)", text):
        no_dump |= {int(x) for x in re.findall(r"\d+", group)}
    return {"named": sorted(named | no_dump), "no_dump": sorted(no_dump)}


def score(root: Path, which: str | None = None) -> list[dict[str, Any]]:
    rows = []
    from trainguard.incidents.flight import dump_files

    for job in sorted(p for p in root.iterdir() if (p / "expected.json").exists() and dump_files(p)):
        expected = json.loads((job / "expected.json").read_text())
        if which is not None and expected.get("set", "design") != which:
            continue
        faulted = set(expected["culprits"])
        row: dict[str, Any] = {
            "job": job.name,
            "set": expected.get("set", "design"),
            "faulted": sorted(faulted),
        }
        for name, analyse in (("trainguard", ours), ("torch", reference)):
            got = analyse(job)
            named = set(got["named"])
            row[name] = {**got, "right": sorted(named & faulted), "false": sorted(named - faulted)}
        rows.append(row)
    return rows


def totals(rows: list[dict[str, Any]], who: str) -> dict[str, int]:
    return {
        "jobs": len(rows),
        "faulted": sum(len(r["faulted"]) for r in rows),
        "right": sum(len(r[who]["right"]) for r in rows),
        "false": sum(len(r[who]["false"]) for r in rows),
        "jobs_exact": sum(set(r[who]["named"]) == set(r["faulted"]) for r in rows),
        "jobs_with_false": sum(bool(r[who]["false"]) for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", nargs="?", type=Path, default=ROOT / "tests" / "data" / "flight")
    p.add_argument("--set", choices=("design", "score"), default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    logging.getLogger("trainguard").setLevel(logging.ERROR)
    rows = score(args.root, args.set)
    sets = sorted({r["set"] for r in rows})
    summary = {
        s: {w: totals([r for r in rows if r["set"] == s], w) for w in ("trainguard", "torch")} for s in sets
    }
    if args.json:
        print(json.dumps({"jobs": rows, "totals": summary}))
        return 0
    print(
        f"{'job':10} {'set':6} {'faulted':10} {'trainguard: named (false) [suspects]':40} torch: named (false)"
    )
    for r in rows:
        t, f = r["trainguard"], r["torch"]
        mine = f"{t['named']} ({t['false']}) [{t['suspects']}] {t['category']}"
        print(f"{r['job']:10} {r['set']:6} {r['faulted']!s:10} {mine:40} {f['named']} ({f['false']})")
    for s, by in summary.items():
        for who, tot in by.items():
            print(
                f"{s:6} {who:10}: {tot['right']}/{tot['faulted']} faulted ranks named, {tot['false']} healthy ranks "
                f"named; {tot['jobs_exact']}/{tot['jobs']} jobs exact, {tot['jobs_with_false']} with a false culprit"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
