"""The demo's final report: each injected fault next to the incident it became, ETTR, accuracy.

`build_report` gathers plain data into one JSON-ready dict (what ``--json`` writes);
`render` prints it for a human in 80 columns. `verdict` decides the exit code: the demo is
also a self-test, of precision as much as recall. It fails on a fault not explained right
(`demo.match`), on any incident no fault explains, on an accuracy below the fault-free
reference's by more than ACCURACY_TOLERANCE (or no reference to compare with), on an ETTR
that the incidents' own time-lost figures do not predict within ETTR_TOLERANCE. The ETTR the
fault-free reference's time predicts is reported beside it and judges nothing: scaled by median
step times, it does not hold on a host whose load varies.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from trainguard.demo.match import MATCHING_RULE, WINDOW_S, Outcome, unmatched
from trainguard.demo.measure import predicted_ettr, reference_ettr, slow_time_lost
from trainguard.demo.plan import DemoPlan
from trainguard.demo.truth import InjectedFault
from trainguard.incidents import Incident
from trainguard.records import Health

# Under chaos the model may end a little below the reference (steps replayed after a rollback,
# world sizes changing): 3 points is ~11 of the 359 test digits.
ACCURACY_TOLERANCE = 0.03
ETTR_TOLERANCE = 0.03  # ledger vs the incidents' own figures, as a share of the wall time
# ledger vs the fault-free reference's time: two runs, each step-time median a little noisy
REFERENCE_ETTR_TOLERANCE = 0.05  # reported with the figure, for a quiet host's own check
_HEALTH = {h.value for h in Health}


def build_report(
    plan: DemoPlan,
    injected: list[InjectedFault],
    outcomes: list[Outcome],
    incidents: list[Incident],
    *,
    job: str,
    started: float,
    goodput: dict[str, Any],
    accuracy: float | None,
    reference_accuracy: float | None,
    reference_ran: bool = True,
    reference_source: str | None = None,
    reference_train_s: float | None = None,
    reference_step_s: float | None = None,
    startup_s: float | None = None,
    run_dir: Path | None = None,
    supervisor: dict[str, Any],
    step_time: float | None,
    paths: dict[str, str | None],
    rollback_steps: int | None = None,
    duration_s: float,
) -> dict[str, Any]:
    by_id = {i.id: i for i in incidents if i.id is not None}
    spec = {f.id: f for f in plan.faults}
    out_of = {o.fault_id: o for o in outcomes}
    fault_of: dict[int, str] = {}
    related_of: dict[int, str] = {}
    for oc in outcomes:
        if oc.incident_id is not None:
            fault_of[oc.incident_id] = oc.fault_id
        for r in oc.related:
            related_of[r] = oc.fault_id
    faults = []
    for inj in injected:
        f, o = spec[inj.id], out_of.get(inj.id)
        inc = by_id.get(o.incident_id) if o is not None and o.incident_id is not None else None
        lost, estimated = _time_lost(inj, inc, step_time, rollback_steps, run_dir)
        faults.append(
            {
                "id": inj.id,
                "kind": inj.kind,
                "label": inj.label,
                "fired": inj.fired,
                "time": inj.time,  # the injection (the drill's own record, not the run's evidence)
                "t_s": round(inj.time - started, 3) if inj.time is not None else None,
                "step": inj.step,
                "rank": inj.rank,
                "gpu": inj.gpu,
                "detail": inj.detail,
                "expected_root_cause": list(f.expected_causes),
                "expected_action": list(f.expected_actions),
                "matched_incident": o.incident_id if o else None,
                "matched": bool(o and o.ok),
                "reason": o.reason if o else "not evaluated",
                "detected_by": inc.detected_by if inc else None,
                "detection_delay_s": o.detection_delay_s if o else None,
                "root_cause": inc.root_cause.value if inc else None,
                "action": inc.action if inc else None,
                "time_lost_s": lost,
                "time_lost_estimated": estimated,
                "related_incidents": list(o.related) if o else [],
                "diagnostics": _diagnostics(inc),
            }
        )
    rows = []
    for inc in incidents:
        d = inc.to_dict()
        d["t_s"] = round(inc.time - started, 3)
        d["matched_fault"] = fault_of.get(inc.id) if inc.id is not None else None
        d["related_to_fault"] = related_of.get(inc.id) if inc.id is not None else None
        rows.append(d)
    report: dict[str, Any] = {
        "job": job,
        "steps": plan.steps,
        "nproc": plan.nproc,
        "injected": faults,
        "incidents": rows,
        "unmatched_incidents": [i.id for i in unmatched(outcomes, incidents)],
        "matching_rule": MATCHING_RULE,
        "window_s": WINDOW_S,
        "ettr": goodput.get("ettr"),
        "goodput": goodput,
        "accuracy": accuracy,
        "reference_accuracy": reference_accuracy,
        "reference_ran": reference_ran,
        "reference_source": reference_source,
        "accuracy_tolerance": ACCURACY_TOLERANCE,
        "ettr_predicted": predicted_ettr(goodput, incidents, startup_s),
        "ettr_tolerance": ETTR_TOLERANCE,
        "ettr_reference": reference_ettr(goodput, reference_train_s, reference_step_s, step_time),
        "ettr_reference_tolerance": REFERENCE_ETTR_TOLERANCE,
        "reference_train_s": reference_train_s,
        "reference_step_s": reference_step_s,
        "step_s": step_time,
        "supervisor": supervisor,
        "duration_s": round(duration_s, 2),
        **paths,
    }
    problems = verdict(report)
    report["all_matched"] = all(f["matched"] for f in faults) and bool(faults)
    report["problems"] = problems
    report["passed"] = not problems
    return report


def verdict(report: dict[str, Any]) -> list[str]:
    """Everything that makes the self-test fail, in words (empty: passed)."""
    problems = []
    for f in report["injected"]:
        if not f["matched"]:
            problems.append(f"{f['id']} {f['label']}: {f['reason']}")
    by_id = {i["id"]: i for i in report["incidents"]}
    for iid in report["unmatched_incidents"]:
        i = by_id.get(iid, {"id": iid})
        where = ", ".join(f"{k} {i[k]}" for k in ("rank", "gpu") if i.get(k) is not None) or "job-wide"
        problems.append(
            f"false incident #{iid} ({where}): {i.get('detected_by') or '-'} -> {i.get('root_cause')} "
            f"-> {i.get('action')}; no injected fault explains it"
        )
    acc, ref = report["accuracy"], report["reference_accuracy"]
    if acc is None:
        problems.append("training did not finish: no test accuracy was printed")
    elif ref is None:
        problems.append(
            "no fault-free reference accuracy to compare with: run once without --no-reference "
            "(its result is recorded and reused by later runs of the same training)"
        )
    elif acc < ref - ACCURACY_TOLERANCE:
        problems.append(
            f"accuracy {acc:.1%} under chaos is more than {ACCURACY_TOLERANCE:.0%} below the "
            f"fault-free reference's {ref:.1%}"
        )
    ettr, predicted = report["ettr"], report["ettr_predicted"]
    if ettr is None or predicted is None:
        problems.append("no ETTR: the goodput ledger or the start-up time is missing")
    elif abs(ettr - predicted) > ETTR_TOLERANCE:
        problems.append(
            f"ETTR {ettr:.1%} from the goodput ledger, but the incidents' time lost predicts "
            f"{predicted:.1%} (more than {ETTR_TOLERANCE:.0%} apart)"
        )
    if report["supervisor"].get("exit_code") != 0:
        problems.append(
            f"trainguard run ended with {report['supervisor'].get('status')}: {report['supervisor'].get('reason')}"
        )
    return problems


def _diagnostics(inc: Incident | None) -> list[str]:
    """What the active tests measured for this incident (pre-flight or after it), in words."""
    if inc is None:
        return []
    said = [str(e).split(": ", 1)[1] for e in inc.evidence if str(e).startswith("diagnostics on GPU ")]
    return [d for d in said if d not in _HEALTH]  # the bare verdict repeats what the tests say


def _time_lost(
    inj: InjectedFault,
    inc: Incident | None,
    step_time: float | None,
    rollback_steps: int | None,
    run_dir: Path | None,
) -> tuple[float | None, bool]:
    """The incident's own figure when it has one, else an estimate from the run's evidence
    (flagged as such): the steps a rollback replayed, the slow steps before the incident, the
    steps redone because a checkpoint was torn."""
    if inc is not None and inc.time_lost_s is not None:
        return round(inc.time_lost_s, 2), False
    if inj.kind == "nan" and rollback_steps is not None and step_time:  # the steps replayed
        return round(rollback_steps * step_time, 2), True
    if inj.kind == "straggler" and inc is not None and run_dir is not None:  # the slow stretch it ended
        lost = slow_time_lost(run_dir, inc.time - WINDOW_S, inc.time)
        return (lost, True) if lost is not None else (None, False)
    if inj.kind == "corrupt_checkpoint" and inc is not None and step_time:  # the steps redone
        steps = next((e for e in inc.evidence if isinstance(e, dict) and "resume_step" in e), None)
        if steps is not None:
            return round(max(0, steps["skipped_step"] - (steps["resume_step"] or 0)) * step_time, 2), True
    return None, False


def render(report: dict[str, Any]) -> str:
    """The report for a terminal or a log, 80 columns."""
    lines = ["", "trainguard demo report", "=" * 22, ""]
    lines.append(f"injected faults ({len(report['injected'])}) and the incidents they became")
    lines.append("(times since the chaos run started; a delay counts from the injection, which the")
    lines.append("drill records: the incidents themselves know only the run's own evidence):")
    for f in report["injected"]:
        where = []
        if f["rank"] is not None:
            where.append(f"rank {f['rank']}")
        if f["gpu"] is not None:
            where.append(f"GPU {f['gpu']}")
        when = f"injected at {_clock(f['t_s'])}, step {f['step']}" if f["fired"] else "never fired"
        mark = "ok  " if f["matched"] else "FAIL"
        inc = f" -> incident #{f['matched_incident']}" if f["matched_incident"] is not None else ""
        lines.append(f" {mark} {f['id']} {f['label']}{' (' + ', '.join(where) + ')' if where else ''}")
        lines.append(f"        {when}{inc}")
        if f["detected_by"] or f["matched_incident"] is not None:
            delay = f" after {f['detection_delay_s']:.1f}s" if f["detection_delay_s"] is not None else ""
            lost = (
                "-"
                if f["time_lost_s"] is None
                else f"{'~' if f['time_lost_estimated'] else ''}{f['time_lost_s']:.1f}s"
            )
            if f["root_cause"]:
                by = f["detected_by"] or "-"
                lines.append(f"        detected by {by}{delay}; root cause {f['root_cause']}")
            else:
                lines.append("        no incident recorded for it")
            lines.append(f"        action {f['action']}; time lost {lost}")
        for d in f.get("diagnostics", []):
            lines += textwrap.wrap(d, 78, initial_indent="        measured: ", subsequent_indent=" " * 18)
        if not f["matched"]:
            lines.append(f"        problem: {f['reason']}")
    others = [i for i in report["incidents"] if i["matched_fault"] is None]
    if others:
        lines += ["", 'other incidents ("also": the same fault seen again; none: a false incident):']
        for i in others:
            rel = f" (also {i['related_to_fault']})" if i["related_to_fault"] else " (FALSE INCIDENT)"
            lines.append(
                f"  #{i['id']} {_clock(i['t_s'])} {i['detected_by'] or '-'}: {i['root_cause']} -> {i['action']}{rel}"
            )
            if i["summary"]:
                lines.append(f"      {_clip(i['summary'], 72)}")
    runs = [d for d in report["supervisor"].get("diagnostics", []) if d.get("purpose") == "preflight"]
    if runs:
        failed = [d for d in runs if d.get("verdict") == "fail"]
        secs = sum(d.get("seconds") or 0.0 for d in runs)
        lines += ["", f"pre-flight diagnostics before each start: {len(runs)} runs, {secs:.1f}s in all"]
        for d in failed:
            lines += textwrap.wrap(
                f"attempt {d['attempt']}: {d['summary']}", 78, initial_indent="  ", subsequent_indent="    "
            )
    g = report["goodput"]
    lines += [""]
    if g and g.get("ettr") is None:  # no step was ever reported: nothing to measure ETTR by
        lines.append(f"ETTR n/a: no step reported ({g.get('attempts')} attempts)")
    elif g:
        lines.append(
            f"ETTR {g['ettr']:.1%}: {g['productive_s']:.1f}s productive of {g['wall_s']:.1f}s wall "
            f"({g['attempts']} attempts, {g['interruptions']} interruptions)"
        )
        parts = [
            (k, g[k]) for k in ("init_s", "restart_s", "lost_s", "detection_s", "downtime_s", "checkpoint_s")
        ]
        lost_to = ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in parts if v >= 0.05)
        lines += textwrap.wrap(lost_to, 78, initial_indent="  lost to: ", subsequent_indent=" " * 11)
        if report.get("ettr_predicted") is not None:
            lines.append(
                f"  predicted from start-up, checkpoints and the incidents' time lost: "
                f"{report['ettr_predicted']:.1%}"
            )
        if report.get("ettr_reference") is not None:
            lines += [
                f"  from the fault-free reference's {report['reference_train_s']:.1f}s of steps at this"
                f" run's pace: {report['ettr_reference']:.1%}",
                "    (context, not a check: scaled by median step times; docs/demo.md)",
            ]
    acc, ref = report["accuracy"], report["reference_accuracy"]
    acc_s = f"{acc:.1%}" if acc is not None else "n/a"
    ref_s = (
        f"{ref:.1%} fault-free reference"
        if ref is not None
        else "no accuracy from the reference run"
        if report.get("reference_ran")
        else "no reference run (--no-reference)"
    )
    lines.append(f"test accuracy {acc_s} under chaos vs {ref_s}")
    if ref is not None and report.get("reference_source"):
        lines.append(f"  (reference: {_clip(report['reference_source'], 64)})")
    if report.get("plot"):
        lines.append(f"timeline plot: {report['plot']}")
    if report.get("json"):
        lines.append(f"report JSON:   {report['json']}")
    lines.append(f"run dir:       {report.get('run_dir')}")
    lines.append(f"incident DB:   {report.get('db')}")
    lines.append(f"  read it with: trainguard report {report['job']} --db {report.get('db')}")
    lines.append("")
    if report["passed"]:
        lines.append(
            f"PASSED in {_clock(report['duration_s'])}: every injected fault matched its incident with the"
        )
        lines.append(f"expected root cause and action, no false incident, and training reached {acc_s}")
        lines.append("accuracy (within the reference's) and the ETTR its losses predict.")
    else:
        lines.append(f"FAILED after {_clock(report['duration_s'])}:")
        lines += [f"  - {p}" for p in report["problems"]]
    return "\n".join(lines)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"
