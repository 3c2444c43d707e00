"""``trainguard logs explain DIR|FILES... [--json]``: which rank's error brought a job down.

When a directory holds torch flight-recorder dumps (``<prefix><rank>`` files from
``TORCH_FR_DUMP_TEMP_FILE`` / ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, pickled or JSON), they are read
with torch's parser and judged by ``incidents.flight``: the culprit ranks of a hang, with the group,
the operation and the evidence, lead the answer; the logs' own explanation follows.

Reads every rank's log (torchrun ``--log-dir``, Slurm per-task files, one interleaved file with
``[rankN]:`` prefixes, plus any kernel log given alongside), orders the findings by time across
files and prints the root-cause finding, the ranks that failed as a consequence and how, the
action, a confidence and the evidence. Exit 0, or 2 when a path cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # imported where used: `trainguard logs scan` starts without them
    from trainguard.incidents.advice import AttemptOutcome, Recommendation
    from trainguard.incidents.correlate import Explanation, JobFinding
    from trainguard.incidents.flight import FlightVerdict
    from trainguard.incidents.nodes import LostNode


def explanation_json(
    ex: Explanation,
    flight: FlightVerdict | None = None,
    node: LostNode | None = None,
    lone: int | None = None,
) -> dict[str, Any]:
    root: dict[str, Any] | None = None
    if ex.root is not None:
        e = ex.root.event
        root = {"rank": ex.root.rank, "host": ex.root.host, "pci": ex.root.pci, "path": e.path,
                "line_no": e.line_no, "time": e.time, "category": e.category.value, "text": e.text,
                "ranks": [] if ex.root.rank is None else [ex.root.rank], "source": "logs",
                "evidence": {} if ex.root.rank is None else {str(ex.root.rank): [e.text.strip()[:300]]}}  # fmt: skip
    out_flight = flight.as_json() if flight is not None else None
    if flight is not None and flight.ranks:
        evidence = {
            str(r): [f"{e.group} {e.op}: {e.text}" for e in evs] for r, evs in flight.evidence.items()
        }
        root = {"ranks": list(flight.ranks), "category": flight.category, "source": "flight_recorder",
                "evidence": evidence, "log_root": root,
                "rank": flight.ranks[0] if len(flight.ranks) == 1 else None}  # fmt: skip
    if flight is not None and not flight.ranks and flight.category == "unknown":  # the dumps cannot decide
        evidence = {
            str(r): [f"{e.group} {e.op}: {e.text}" for e in evs] for r, evs in flight.suspects.items()
        }
        root = {"ranks": [], "category": "unknown", "source": "flight_recorder", "suspects": sorted(flight.suspects),
                "evidence": evidence, "log_root": root, "rank": None}  # fmt: skip
    cause = ex.cause.value
    if lone is not None and node is None and not (flight is not None and flight.ranks):
        root = {"ranks": [lone], "rank": lone, "category": "hang_origin", "source": "logs", "log_root": root,
                "evidence": {str(lone): ["the only rank that did not time out: it never entered the collective "
                                         "every other rank waited in"]}}  # fmt: skip
    if node is not None and not (flight is not None and flight.ranks):
        cause = "host" if node.host else "unknown"  # a lost peer node, never the network by default
        evidence = {str(r): list(node.evidence) for r in node.ranks} if node.host else {}
        root = {"ranks": list(node.ranks), "host": node.host, "category": node.category, "source": "node",
                "suspects": list(node.suspects), "evidence": evidence, "log_root": root,
                "rank": node.ranks[0] if len(node.ranks) == 1 else None}  # fmt: skip
    return {
        "root_cause": root,
        "flight_recorder": out_flight,
        "node": None
        if node is None
        else {
            "host": node.host,
            "ranks": list(node.ranks),
            "category": node.category,
            "suspects": list(node.suspects),
            "evidence": list(node.evidence),
        },
        "cause": cause,
        "consequences": [{"rank": c.rank, "category": c.category, "count": c.count} for c in ex.consequences],
        "action": ex.action.value,
        "confidence": ex.confidence,
        "evidence": list(ex.evidence),
    }


def _when(t: float | None) -> str:
    if t is None:
        return "time unknown"
    try:
        return datetime.fromtimestamp(t).isoformat(sep=" ", timespec="milliseconds")
    except (ValueError, OverflowError, OSError):
        return str(t)


def render_flight(v: FlightVerdict, out: TextIO) -> None:
    if not v.ranks and v.category == "unknown":
        who = _ranges(list(v.suspects))
        out.write(f"flight recorder ({v.dumps} dumps): unknown: the evidence cannot decide; suspects {who}\n")
    elif not v.ranks:
        out.write(f"flight recorder ({v.dumps} dumps): no rank stands out\n")
    else:
        late = f"; late, joined in the end: {_ranges(list(v.late))}" if v.late else ""
        named = f"culprit rank(s) {_ranges(list(v.causes))}" if v.causes else "no rank holds the job up"
        out.write(f"flight recorder ({v.dumps} dumps): {named}{late}  [{v.category}]\n")
    for rank, evs in sorted(v.evidence.items()):
        for e in evs:
            out.write(f"  rank {rank}: {e.group} {e.op}: {e.text}\n")
    for rank, evs in sorted(v.suspects.items()):
        for e in evs:
            out.write(f"  suspect rank {rank}: {e.group} {e.op}: {e.text}\n")
    if v.victims:
        out.write(f"  waiting because of them: {len(v.victims)} rank(s): {_ranges(list(v.victims))}\n")
    for note in v.notes:
        out.write(f"  note: {note}\n")


def render_node(v: LostNode, out: TextIO) -> None:
    if v.host:
        out.write(f"node failure: {v.host} ({len(v.ranks)} rank(s): {_ranges(list(v.ranks))}) left the job\n")
    else:
        out.write(f"a node left the job, which one is unknown: suspects {', '.join(v.suspects)}\n")
    out.write("".join(f"  - {e}\n" for e in v.evidence))


def render(ex: Explanation, out: TextIO) -> None:
    if ex.root is None:
        out.write("no failure found in these logs\n")
        return
    r, e = ex.root, ex.root.event
    who = f"rank {r.rank}" if r.rank is not None else "no rank (kernel or launcher log)"
    where = " ".join(x for x in (f"on {r.host}" if r.host else "", f"GPU {r.pci}" if r.pci else "") if x)
    out.write(f"root cause: {who}{' ' + where if where else ''}, {_when(e.time)}\n")
    out.write(f"  {e.category.value} ({ex.cause.value})  {e.path}:{e.line_no}\n")
    out.write(f"  {e.text.strip()[:300]}\n")
    ranks = {c.rank for c in ex.consequences}
    out.write(f"consequences: {len(ranks)} other rank(s)\n")
    by_category: dict[str, list[int | None]] = {}
    for c in ex.consequences:
        by_category.setdefault(c.category, []).append(c.rank)
    for category, members in sorted(by_category.items(), key=lambda kv: -len(kv[1])):
        out.write(f"  {category:<18} {len(members):>5} rank(s): {_ranges(members)}\n")
    out.write(f"action: {ex.action.value}    confidence: {ex.confidence}\n")
    out.write("evidence:\n" + "".join(f"  - {line}\n" for line in ex.evidence))


def _ranges(ranks: list[int | None]) -> str:
    """[0, 1, 2, 5, None] -> "0-2, 5, ?"."""
    known = sorted(r for r in ranks if r is not None)
    spans: list[str] = []
    for r in known:
        if spans and r == int(spans[-1].split("-")[-1]) + 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{r}"
        else:
            spans.append(str(r))
    return ", ".join(spans + ["?"] * (len(ranks) - len(known)))


def run_explain(args: argparse.Namespace) -> int:
    from trainguard.errors import InputError
    from trainguard.incidents.correlate import explain_job
    from trainguard.incidents.joblogs import job_files, job_findings

    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
    ranks: set[int] = set()
    findings = list(job_findings(paths, engine=args.engine, ranks=ranks))
    ex = explain_job(findings, ranks)
    flight = flight_verdict(paths, ranks)
    node = job_node(job_files(paths))
    advice = advise(paths, findings, ranks, ex)
    lone = lone_origin(ex, findings, ranks)
    if args.json:
        out = explanation_json(ex, flight, node, lone)
        out["attempts"] = [{"attempt": o.number, "root": o.root, "step": o.step, "gpu": o.gpu, "node": o.node,
                            "recommendation": asdict(r)} for o, r in advice]  # fmt: skip
        out["recommendation"] = asdict(advice[-1][1]) if advice else None
        print(json.dumps(out))
    else:
        if flight is not None:
            render_flight(flight, sys.stdout)
        if node is not None:
            render_node(node, sys.stdout)
        if lone is not None:
            sys.stdout.write(f"hang origin: rank {lone}, the only rank that did not time out\n")
        render(ex, sys.stdout)
        for o, r in advice:
            step = "step unknown" if o.step is None else f"reached step {o.step}"
            out_line = f"attempt {o.number} ({step}): {r.verb}: {r.reason}"
            sys.stdout.write(out_line + (f"  [exit {r.exit_code}]" if o is advice[-1][0] else "") + "\n")
    return advice[-1][1].exit_code if args.advise and advice else 0


def lone_origin(ex: Explanation, findings: list[JobFinding], ranks: set[int]) -> int | None:
    """The only rank that did not time out, when every finding of the job is a timeout."""
    from trainguard.incidents.nodes import lone_rank
    from trainguard.records import Category

    if ex.cause.value != "nccl_watchdog_timeout":
        return None
    timed = {
        f.rank for f in findings if f.rank is not None and f.event.category is Category.NCCL_TIMEOUT_HANG
    }
    lone = lone_rank(timed, ranks)
    return lone if lone is not None and lone not in {f.rank for f in findings} else None


def job_node(files: list[Path]) -> LostNode | None:
    """The node a multi-node job lost (``incidents.nodes``), None when nothing points at one."""
    from trainguard.incidents.joblogs import job_hosts, node_lines
    from trainguard.incidents.nodes import node_failure

    hosts, addresses = job_hosts(files)
    if len(set(hosts.values())) < 2:
        return None
    lines, last = node_lines(files, hosts)
    return node_failure(lines, hosts, addresses, last)


_HARDWARE_CAUSES = {"faulty_gpu", "gpu_hbm_memory", "gpu_sram", "gpu_system_processor", "gpu_thermal"}


def advise(
    paths: list[Path], findings: list[JobFinding], ranks: set[int], whole: Explanation
) -> list[tuple[AttemptOutcome, Recommendation]]:
    """One recommendation per attempt (torchrun's ``attempt_<n>`` folders; one attempt otherwise)."""
    from trainguard.incidents.advice import CASCADE, AttemptOutcome, recommend
    from trainguard.incidents.correlate import explain_job
    from trainguard.incidents.joblogs import (
        attempts_of,
        final_exception,
        job_files,
        last_step,
        rank_of_path,
        tail_lines,
    )

    groups = attempts_of(job_files(paths))
    history: list[AttemptOutcome] = []
    out = []
    for number, files in groups.items():
        mine = {str(f) for f in files}
        ex = whole if len(groups) == 1 else explain_job([f for f in findings if f.event.path in mine], ranks)
        rank = ex.root.rank if ex.root is not None else None
        own = [f for f in files if rank is not None and rank_of_path(f) == rank] or files
        exc = final_exception((ln for f in own for ln in tail_lines(f)), CASCADE)
        root = exc if exc is not None else (ex.root.event.text.strip() if ex.root is not None else None)
        gpu = ex.root.pci if ex.root is not None and ex.cause.value in _HARDWARE_CAUSES else None
        node = job_node(files)
        history.append(AttemptOutcome(number, root, last_step(files), gpu, node.host if node else None))
        out.append((history[-1], recommend(history)))
    return out


def flight_verdict(paths: list[Path], ranks: set[int]) -> FlightVerdict | None:
    """The flight-recorder judgement of the dumps under ``paths``, None when there are none."""
    from trainguard.incidents.flight import dump_files, judge

    found = [p for p in paths if p.is_dir() and dump_files(p)]
    if not found:
        return None
    try:
        from trainguard.torch.flight_recorder import load_dumps, torch_matcher
    except ImportError:
        raise ImportError(
            "reading torch flight-recorder dumps needs torch's parser: pip install 'trainguard[torch]'"
        ) from None
    dumps = [d for p in found for d in load_dumps(p)]
    return judge(dumps, torch_matcher(), world=ranks) if dumps else None
