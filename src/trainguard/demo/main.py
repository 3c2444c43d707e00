"""The demo from start to end: reference run, chaos run, ground truth, matching, report, exit code."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.demo import find_example
from trainguard.demo import reference as recorded_reference
from trainguard.demo.live import DemoState, make_display
from trainguard.demo.match import match
from trainguard.demo.measure import median_step_time, train_span
from trainguard.demo.plan import build_keras_plan, build_plan
from trainguard.demo.report import build_report, render
from trainguard.demo.runner import quiet_logs, run_chaos, run_reference, worker_cmd
from trainguard.demo.truth import ground_truth, read_accuracy, rollback_steps
from trainguard.incidents import IncidentStore, IntervalKind

SHORT = {"xid": "xid 79", "corrupt_checkpoint": "bad ckpt"}  # fault names on the live view
EXIT_FAILED = 1  # the self-test failed: a fault unexplained, a false incident, accuracy or ETTR off
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def main(args: argparse.Namespace) -> int:
    t0 = time.time()
    keras = getattr(args, "framework", "torch") == "keras"
    script = find_example(getattr(args, "script", None), "keras" if keras else "torch")
    if script is None:
        print(
            f"trainguard demo: training script {getattr(args, 'script', None) or 'train_digits.py'} not found; "
            "pass --script PATH to an existing file (the digits example ships in trainguard/demo/)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.steps is not None and args.steps < 40:  # six faults, each with room to be detected
        print("trainguard demo: --steps must be at least 40 (six faults need room)", file=sys.stderr)
        return EXIT_USAGE
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="trainguard-demo-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    plan = (build_keras_plan if keras else build_plan)(
        quick=args.quick, steps=args.steps, speed=getattr(args, "speed", None) or 1.0
    )
    job = time.strftime("demo-%Y%m%d-%H%M%S")
    quiet_logs(getattr(args, "verbose", 0))

    state = DemoState(total_steps=plan.steps, nproc=plan.nproc, started=t0)
    state.faults = {f.id: "pending" for f in plan.faults}
    state.fault_labels = {f.id: SHORT.get(f.kind, f.kind) for f in plan.faults}
    display = make_display(state, force_plain=args.plain)
    display.start()
    reference = None
    # The reference's result depends only on what is trained: recorded once, reused after.
    what = recorded_reference.training(
        script, list(worker_cmd(script, plan, Path("CKPT"), 0.0)[2:]), plan.nproc
    )
    key = recorded_reference.key_of(what)
    recorded = recorded_reference.load(key)
    try:
        display.line(f"work dir {workdir}")
        if recorded is not None:
            display.line(
                f"reference: recorded run {recorded.job} (accuracy {recorded.accuracy:.1%}) of the same "
                "training, not run again"
            )
        elif not args.no_reference:
            reference = run_reference(plan, script, workdir, f"{job}-reference", display)
            if int(reference.exit_code) == EXIT_INTERRUPTED:  # Ctrl-C / SIGTERM reached the supervisor
                raise KeyboardInterrupt
            acc = read_accuracy(reference.run_dir)
            display.line(
                f"reference run done: accuracy {acc:.1%}" if acc is not None else "reference run: no accuracy"
            )
            if acc is not None and int(reference.exit_code) == 0:
                recorded = recorded_reference.record(key, acc, f"{job}-reference", reference.run_dir, what)
                path = recorded_reference.save(recorded)
                display.line(f"reference recorded in {path}")
        chaos = run_chaos(plan, script, workdir, job, display, getattr(args, "verbose", 0))
        if int(chaos.result.exit_code) == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        display.phase("report", "training done: matching faults to incidents")
    except KeyboardInterrupt:
        display.stop()
        print("trainguard demo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        display.stop()
    report = assemble(plan, chaos, reference, recorded, workdir, job, t0, args.json)
    print(render(report), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    if not report["passed"]:  # one line for CI logs, where the report may scroll away
        print(f"trainguard demo: self-test FAILED: {'; '.join(report['problems'])}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def assemble(
    plan: Any,
    chaos: Any,
    reference: Any,
    recorded: Any,
    workdir: Path,
    job: str,
    t0: float,
    json_path: Path | None,
) -> dict[str, Any]:
    result = chaos.result
    run_dir = Path(result.run_dir)
    db = workdir / "trainguard.db"
    with IncidentStore(db) as store:
        incidents = store.incidents(job=job)
        goodput = store.goodput(job).to_dict()
        plot = _plot(store, job, workdir / "timeline.png")
        info = store.get_job(job)
        inits = [iv for iv in store.intervals(job) if iv.kind is IntervalKind.INIT]
    # Start-up before the first step (the first attempt's init: the launcher's, then its workers'):
    # the job's own cost, no fault's.
    first_attempt = min((iv.attempt for iv in inits), default=None)
    first = max((iv.end for iv in inits if iv.attempt == first_attempt), default=None)
    startup_s = first - info.started if first is not None and info is not None and info.started else None
    injected = ground_truth(plan, run_dir, [i.to_dict() for i in result.injected], chaos.gpus_by_attempt)
    outcomes = match(list(plan.faults), injected, incidents)
    supervisor = {
        "exit_code": int(result.exit_code),
        "status": result.exit_code.name.lower(),
        "reason": result.reason,
        "attempts": result.attempts,
        "final_step": result.final_step,
        "recoveries": list(result.recoveries),
        "diagnostics": list(result.diagnostics),
    }
    return build_report(
        plan,
        injected,
        outcomes,
        incidents,
        job=job,
        started=chaos.started,
        goodput=goodput,
        accuracy=read_accuracy(run_dir),
        reference_accuracy=(
            recorded.accuracy
            if recorded is not None
            else read_accuracy(Path(reference.run_dir))
            if reference is not None
            else None
        ),
        reference_ran=reference is not None or recorded is not None,
        reference_train_s=_reference_timing(recorded, reference)[0],
        reference_step_s=_reference_timing(recorded, reference)[1],
        reference_source=(
            None
            if recorded is None
            else f"run {recorded.job}, recorded {time.strftime('%Y-%m-%d %H:%M', time.localtime(recorded.recorded))}"
        ),
        startup_s=startup_s,
        run_dir=run_dir,
        supervisor=supervisor,
        step_time=median_step_time(run_dir),
        rollback_steps=_nan_rollback(run_dir, injected),
        paths={
            "workdir": str(workdir),
            "run_dir": str(run_dir),
            "db": str(db),
            "plot": plot,
            "json": str(json_path.resolve()) if json_path is not None else None,
        },
        duration_s=time.time() - t0,
    )


def _reference_timing(recorded: Any, reference: Any) -> tuple[float | None, float | None]:
    """(first step to last, median step) of the fault-free reference: recorded, or just run."""
    if recorded is not None:
        return recorded.train_s, recorded.step_s
    if reference is not None:
        return train_span(Path(reference.run_dir)), median_step_time(Path(reference.run_dir))
    return None, None


def _nan_rollback(run_dir: Path, injected: list[Any]) -> int | None:
    nan = next((i for i in injected if i.kind == "nan" and i.time is not None), None)
    return rollback_steps(run_dir, nan.time) if nan is not None else None


def _plot(store: IncidentStore, job: str, path: Path) -> str | None:
    try:
        from trainguard.incidents.plot import plot_timeline
        from trainguard.incidents.report import job_report

        plot_timeline(job_report(store, job), path)
    except Exception as exc:  # matplotlib missing or a drawing bug: the report stands without it
        print(f"trainguard demo: no timeline plot ({exc})", file=sys.stderr)
        return None
    return str(path)
