"""The text of `trainguard diagnose`: live progress on stderr, then a table of every test by GPU,
the measured figures, and each problem with its reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

from trainguard.diagnose.result import Report, TestResult, Verdict

_MARK = {Verdict.PASS: "pass", Verdict.WARN: "WARN", Verdict.FAIL: "FAIL", Verdict.SKIP: "-"}


def progress_printer(out: TextIO, target: Any, level: int) -> Callable[[Any], None]:
    """One line per finished step: ``[ 5/48] compute        GPU 3  0.7 s``."""
    kind = {"sim": "simulated GPU", "cuda": "GPU", "cpu": "CPU device"}[target.kind]
    n = len(target.devices)
    out.write(f"trainguard diagnose: level {level} on {n} {kind}{'s' if n != 1 else ''}\n")
    out.flush()

    def show(p: Any) -> None:
        if p.note == "running":
            return
        where = "all" if p.gpu is None else f"GPU {p.gpu}"
        out.write(f"[{p.done:>3}/{p.total}] {p.test:<16} {where:<6} {p.note}\n")
        out.flush()

    return show


def _value(t: TestResult) -> str:
    if t.value is None:
        return ""
    if isinstance(t.value, float):
        return f"{t.value:.4g}"
    return str(t.value)


def report_text(report: Report) -> str:
    lines = []
    head = f"level {report.level}, backend {report.backend}, {report.seconds:.1f} s"
    if report.extra.get("scenario"):
        head += f", scenario {report.extra['scenario']}: {report.extra.get('description', '')}"
    lines.append(head)
    if report.error:
        lines.append(f"could not run: {report.error}")
    if report.node:
        cells = [
            f"{t.name} {_MARK[t.verdict]}{' ' + _value(t) if t.value is not None else ''}"
            for t in report.node
        ]
        lines.append("node: " + " | ".join(cells))
    names = list(dict.fromkeys(t.name for g in report.gpus for t in g.tests))
    if names and report.gpus:
        width = max(len(n) for n in names) + 2
        cols = [f"GPU{g.index}" for g in report.gpus]
        lines.append("")
        lines.append("TEST".ljust(width) + "  ".join(c.rjust(5) for c in cols))
        for name in names:
            row = [g.test(name) for g in report.gpus]
            lines.append(name.ljust(width) + "  ".join((_MARK[t.verdict] if t else "").rjust(5) for t in row))
        figures = [
            n for n in names if any(isinstance(t.value, float) for g in report.gpus if (t := g.test(n)))
        ]
        if figures:
            lines.append("")
            lines.append("MEASURED".ljust(width) + "  ".join(c.rjust(9) for c in cols) + "  UNIT")
            for name in figures:
                row = [g.test(name) for g in report.gpus]
                unit = next((t.unit for t in row if t and t.unit), "")
                lines.append(
                    name.ljust(width)
                    + "  ".join((_value(t) if t else "").rjust(9) for t in row)
                    + f"  {unit}"
                )
    problems = report.failures()
    if problems:
        lines.append("")
        for gpu, t in problems:
            where = "node " if gpu is None else f"GPU {gpu}"
            figure = f" {_value(t)} {t.unit}".rstrip() if t.value is not None else ""
            expected = f" (expected {t.expected:.4g})" if isinstance(t.expected, float) else ""
            lines.append(f"{where}  {t.name} {t.verdict.value}:{figure}{expected}; {t.reason}")
    skipped = {(t.name, t.reason) for t in report.node if t.verdict is Verdict.SKIP}
    skipped |= {(t.name, t.reason) for g in report.gpus for t in g.tests if t.verdict is Verdict.SKIP}
    if skipped:
        lines.append("")
        lines.append("skipped: " + "; ".join(f"{n} ({why})" for n, why in sorted(skipped)))
    lines.append("")
    lines.append(f"verdict: {report.verdict.value.upper()} (exit {report.exit_code})")
    return "\n".join(lines)
