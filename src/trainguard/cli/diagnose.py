"""`trainguard diagnose`: active diagnostics, DCGM-style, on CUDA GPUs, the CPU or the simulated node.

    trainguard diagnose                                   # level 1: software and settings (seconds)
    trainguard diagnose --level 2 --gpu-ids 0,3             # + compute, SDC, memory, interconnect, thermal
    trainguard diagnose --backend sim --scenario sdc --level 2 --json
    trainguard diagnose --list-tests | --list-scenarios

Exit code: 0 pass, 1 warn, 2 fail, 3 could not run (also for a bad flag, and with no usable GPU
unless --backend cpu or sim says to test the CPU or the simulated node).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from trainguard.cli.options import add_sim_node_options, usage_errors_exit
from trainguard.errors import BackendError, ConfigError, InputError, TrainguardError
from trainguard.rundir import atomic_write_bytes

COULD_NOT_RUN = 3


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="active GPU diagnostics: compute, SDC, memory, interconnect, thermal (exit 0/1/2, 3 could not run)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--level", type=int, choices=(1, 2, 3), default=1, help="1 seconds, 2 ~1 min/GPU, 3 ~10 min"
    )
    add_sim_node_options(p, ("auto", "cuda", "cpu", "sim"), "auto")
    p.add_argument("--gpu-ids", metavar="LIST", help="GPU indices as nvidia-smi numbers them: 0,3")
    p.add_argument("--tests", metavar="LIST", help="only these tests (see --list-tests)")
    p.add_argument("--expect-gpus", type=int, metavar="N", help="fail gpu_count with fewer GPUs")
    p.add_argument(
        "--golden",
        type=Path,
        metavar="FILE",
        help="SDC golden checksums: compared with when FILE exists, recorded there by a clean run when not",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--list-tests", action="store_true", help="name the tests and exit")
    p.add_argument("--list-scenarios", action="store_true", help="the simulated scenarios and exit")

    usage_errors_exit(p, COULD_NOT_RUN)
    p.set_defaults(func=run)


def _indices(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated GPU indices like 0,3, not {text!r}") from None


def run(args: argparse.Namespace) -> int:
    if args.list_tests:
        return list_tests(args.json)
    if args.list_scenarios:
        return list_scenarios(args.json)
    try:
        report = _diagnose(args)
    except (BackendError, ConfigError) as exc:
        print(f"trainguard diagnose: could not run: {exc}", file=sys.stderr)
        return COULD_NOT_RUN
    except (TrainguardError, OSError, ImportError) as exc:
        print(f"trainguard diagnose: could not run: {exc}", file=sys.stderr)
        return COULD_NOT_RUN
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        from trainguard.cli.diagnose_render import report_text

        print(report_text(report))
    code = report.exit_code
    if report.extra.get("wedged"):
        # A thread stuck in the driver cannot be joined; leave without waiting for it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _diagnose(args: argparse.Namespace) -> Any:
    from trainguard.diagnose import open_target, run_diagnostics

    backend = args.backend or ("sim" if args.scenario else "auto")
    if args.scenario and backend != "sim":
        raise ConfigError("--scenario runs on the simulated node: use --backend sim")
    tests = [t.strip() for t in args.tests.split(",") if t.strip()] if args.tests else None
    sim, extra = None, {}
    if backend == "sim":
        from trainguard.telemetry.sim import DIAGNOSE_SCENARIOS, SimNode

        name = args.scenario or "healthy"
        scenario = DIAGNOSE_SCENARIOS.get(name)
        if scenario is None:
            raise ConfigError(f"unknown scenario {name!r}: choose one of {', '.join(DIAGNOSE_SCENARIOS)}")
        sim = SimNode(n_gpus=args.gpus, seed=args.seed, load=0.0)
        scenario.script(sim)
        extra = {"scenario": name, "description": scenario.description}
    target = open_target(backend, _indices(args.gpu_ids, "--gpu-ids"), sim=sim, cpu_fallback=False)
    progress = None
    if not args.quiet and (not args.json or sys.stderr.isatty()):
        from trainguard.cli.diagnose_render import progress_printer

        progress = progress_printer(sys.stderr, target, args.level)
    golden = _read_golden(args.golden)
    try:
        report = run_diagnostics(
            target,
            args.level,
            tests=tests,
            expect_gpus=args.expect_gpus,
            on_progress=progress,
            extra=extra,
            golden=golden,
        )
    finally:
        target.close()
    if args.golden is not None and golden is None and report.extra.get("sdc_golden") and _sdc_clean(report):
        atomic_write_bytes(args.golden, json.dumps(report.extra["sdc_golden"], indent=1).encode())
        print(f"trainguard diagnose: SDC golden checksums recorded in {args.golden}", file=sys.stderr)
    return report


def _read_golden(path: Path | None) -> dict[str, str] | None:
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--golden {path}: not a golden-checksum file ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise InputError(f"--golden {path}: expected a JSON object of checksums")
    return data


def _sdc_clean(report: Any) -> bool:
    """Only a run whose every SDC test passed may become the reference."""
    tests = [t for g in report.gpus for t in g.tests if t.name == "sdc"]
    return bool(tests) and all(t.verdict.value == "pass" for t in tests)


def list_tests(as_json: bool) -> int:
    from trainguard.diagnose import TESTS

    if as_json:
        print(json.dumps([{"name": n, "level": lv, "what": w} for n, (lv, w) in TESTS.items()]))
        return 0
    width = max(map(len, TESTS))
    print(f"{'TEST'.ljust(width)}  LEVEL  WHAT")
    for name, (level, what) in TESTS.items():
        print(f"{name.ljust(width)}  {level:>5}  {what}")
    print("\nlevel 3 runs the level-2 tests longer: more SDC rounds, most of the memory, a longer stress")
    return 0


def list_scenarios(as_json: bool) -> int:
    from trainguard.telemetry.sim import DIAGNOSE_SCENARIOS

    rows = [
        (s.name, ", ".join(f"{t} on GPU {g}" for t, g in s.fails) or "nothing", s.description)
        for s in DIAGNOSE_SCENARIOS.values()
    ]
    if as_json:
        print(json.dumps([{"name": n, "fails": f, "description": d} for n, f, d in rows]))
        return 0
    width = max(len(r[0]) for r in rows)
    print(f"{'SCENARIO'.ljust(width)}  {'FAILS'.ljust(26)}  DESCRIPTION")
    for name, fails, description in rows:
        print(f"{name.ljust(width)}  {fails.ljust(26)}  {description}")
    print("\nrun one: trainguard diagnose --backend sim --scenario NAME --level 2 [--json]")
    return 0
