"""`trainguard demo --replica-groups N`: recovery without stopping the job, as a self-test.

    trainguard demo --replica-groups 2          # ~1-2 minutes on 2 CPU cores
    trainguard demo --replica-groups 2 --json report.json --workdir /tmp/groups-demo

N replica groups of examples/train_ft.py (torchft over gloo, one rank each) train under
``trainguard run --replica-groups N`` on a simulated node with one spare GPU; at step 30 the last
group's GPU fails (Xid 79: the same kernel-log line a real one writes). Its loop records
the incident, the GPU is excluded, the group is started again on the spare and heals from a live
peer, while the other groups keep committing steps. The self-test (`check_groups`, pure: it can
fail both ways, tests/test_demo_groups.py) passes only when the incident names the injected rank
and GPU with a faulty-GPU root cause, no other group recorded anything or was restarted, every
healthy group committed steps while the failed one was out, the failed group healed, the report
shows the partial capacity and the heal, and every group ended with bitwise-identical weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2
STEPS = 400  # --quick: 250 (a restarted group takes ~15 s to start on a loaded 2-core machine)
STEP_DELAY_S = 0.05
FAULT_STEP = 30


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def find_ft_example(explicit: Path | None = None) -> Path | None:
    """The torchft example: ``explicit``, else examples/train_ft.py of the source tree."""
    if explicit is not None:
        return explicit if explicit.is_file() else None
    path = Path(__file__).resolve().parents[3] / "examples" / "train_ft.py"
    return path if path.is_file() else None


def plan_toml(groups: int, step: int) -> str:
    """One fault: the last group's rank 0 loses its GPU (Xid 79) at ``step``."""
    return (
        "# trainguard demo --replica-groups: one GPU fails in one group\n\n[[fault]]\n"
        f'name = "Xid 79 under group {groups - 1}"\nkind = "xid"\nxid = 79\ngroup = {groups - 1}\n'
        f"rank = 0\nstep = {step}\n"
    )


def check_groups(
    result: dict[str, Any], report: dict[str, Any] | None, same_weights: bool | None
) -> list[Check]:
    """The demo's verdict on one run (pure). ``result``: the replica loop's result; ``report``:
    `trainguard report`'s dict of the job; ``same_weights``: whether the groups' final weights are
    bitwise identical (None: not compared)."""
    groups = result.get("groups", [])
    fired = [
        (g["group"], inj) for g in groups for run in g.get("runs", []) for inj in run.get("injected", [])
    ]
    checks = [Check("fault injected", len(fired) == 1, f"{len(fired)} fault(s) fired")]
    if len(fired) != 1:
        return checks
    failing, inj = fired[0]
    bad = next(g for g in groups if g["group"] == failing)
    healthy = [g for g in groups if g["group"] != failing]
    incidents = [i for run in bad.get("runs", []) for i in run.get("incidents", [])]
    named = [(i.get("rank"), i.get("gpu"), i.get("root_cause")) for i in incidents]
    want = (inj.get("rank"), inj.get("gpu"), "faulty_gpu")
    checks.append(
        Check(
            "culprit",
            named == [want],
            f"group {failing} recorded {named or 'nothing'}; injected rank {want[0]} GPU {want[1]}",
        )
    )
    for g in healthy:
        runs = g.get("runs", [])
        noise = [i.get("summary") for run in runs for i in run.get("incidents", [])]
        attempts = [run.get("attempts") for run in runs]
        checks.append(
            Check(
                f"group {g['group']} never stopped",
                g.get("starts") == 1 and attempts == [1] and not noise,
                f"starts {g.get('starts')}, attempts {attempts}, incidents {noise or 'none'}",
            )
        )
        # Out from the fault until the failed group's workers are seen again: its first step seen
        # after the loop started it again. (A result without start times: a step below the one
        # it had reached, which a group that joined late and was first seen after the fault,
        # at step 0, also shows.)
        out_from = inj.get("time", 0.0)
        restarted = (bad.get("started_at") or [])[1:2]
        if restarted:
            back = [t for t, _ in bad.get("steps", []) if t > max(out_from, restarted[0])]
        else:
            seen = [s for t, s in bad.get("steps", []) if t <= out_from]
            reached = max([inj.get("step") or 0, *seen])
            back = [t for t, s in bad.get("steps", []) if t > out_from and s < reached]
        during = sorted({s for t, s in g.get("steps", []) if back and out_from < t < back[0]})
        checks.append(
            Check(
                f"group {g['group']} kept stepping",
                bool(back) and len(during) >= 2,
                f"{len(during)} new step(s) while group {failing} was out"
                + ("" if back else f" (group {failing} never came back)"),
            )
        )
    checks.append(
        Check(
            f"group {failing} healed",
            bad.get("state") == "succeeded" and bool(bad.get("heals_s")),
            f"state {bad.get('state')}, heals {bad.get('heals_s')}, GPUs {bad.get('gpus')}",
        )
    )
    section = (report or {}).get("groups") or {}
    partial = sum(v for k, v in section.get("k_of_n_s", {}).items() if not k.startswith(f"{len(groups)}_"))
    checks.append(
        Check(
            "report: partial capacity and the heal",
            bool(section)
            and (section.get("capacity") or 1.0) < 1.0  # None: not measured, no partial figure
            and partial > 0
            and bool(section.get("heals_s")),
            f"capacity {section.get('capacity')}, k of N {section.get('k_of_n_s')}, heals {section.get('heals_s')}"
            if section
            else "the report has no replica groups",
        )
    )
    if same_weights is not None:
        checks.append(Check("same weights", same_weights, "bitwise identical" if same_weights else "differ"))
    return checks


def main(args: argparse.Namespace) -> int:
    from trainguard.incidents import IncidentStore
    from trainguard.incidents.report import job_report, render_report
    from trainguard.supervisor.config import (
        HealthConfig,
        LaunchConfig,
        RecordConfig,
        RecoveryConfig,
        SupervisorConfig,
        WatchConfig,
    )
    from trainguard.supervisor.replicas import ReplicaConfig, ReplicaSupervisor, program

    n = args.replica_groups
    script = find_ft_example(getattr(args, "script", None))
    if script is None:
        print(
            "trainguard demo --replica-groups: examples/train_ft.py not found (it is in the source "
            "tree, not the wheel); pass --script PATH to it",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if n < 2:
        print(f"trainguard demo: --replica-groups {n}: give 2 or more", file=sys.stderr)
        return EXIT_USAGE
    steps = args.steps or (250 if args.quick else STEPS)
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="trainguard-demo-groups-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    plan = workdir / "plan.toml"
    plan.write_text(plan_toml(n, FAULT_STEP))
    delay = STEP_DELAY_S / (getattr(args, "speed", None) or 1.0)
    cmd: tuple[str, ...] = (sys.executable, str(script), "--steps", str(steps), "--step-delay", f"{delay:g}")
    cmd += ("--all-groups-at-end", "--out", str(workdir / "weights.g{group}.pt"))
    db = workdir / "trainguard.db"
    config = SupervisorConfig(
        LaunchConfig(cmd=cmd, standalone=True, gpus=tuple(range(n + 1))),  # one spare GPU
        RecordConfig(job_id=time.strftime("demo-groups-%Y%m%d-%H%M%S"), runs_root=workdir / "runs", db=db),
        WatchConfig(hang_timeout_floor=10.0, tee=False),
        HealthConfig(backend="sim", preflight=False),
        RecoveryConfig(backoff_base_s=0.1),
        chaos=plan,
    )
    t0 = time.time()
    print(f"work dir {workdir}: {n} replica groups, {steps} steps, GPU {n} spare; Xid 79 in group {n - 1}")

    def say(ev: Any) -> None:
        what = {
            "group_started": "group {group} started on GPUs {gpus} (start {start})",
            "group_healed": "group {group} healed at step {step} in {heal_s}s",
            "state": "job {state}: {running} of {groups} groups stepping",
            "finished": "finished: {reason}",
        }.get(ev.kind)
        if what is not None:
            print(f"  {ev.time - t0:6.1f}s  {what.format(**ev.data)}", flush=True)

    try:
        program()  # torchft missing: the install hint now, before anything starts
    except ImportError as exc:
        print(f"trainguard demo --replica-groups: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = ReplicaSupervisor(config, ReplicaConfig(groups=n), on_event=say).run().to_dict()
    with IncidentStore(db) as store:
        try:
            report: dict[str, Any] | None = job_report(store, result["job_id"])
        except ValueError:
            report = None
    checks = check_groups(result, report, _same_weights(workdir, n))
    if report is not None:
        print("\n" + render_report(report))
    print("\nself-test")
    for c in checks:
        print(f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    passed = all(c.ok for c in checks) and result["exit_code"] == 0
    print(f"\n{'passed' if passed else 'FAILED'} in {time.time() - t0:.0f}s (exit {result['exit_code']})")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"passed": passed, "checks": [asdict(c) for c in checks], "result": result, "report": report}
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return 0 if passed else EXIT_FAILED


def _same_weights(workdir: Path, n: int) -> bool | None:
    paths = [workdir / f"weights.g{i}.pt" for i in range(n)]
    if not all(p.exists() for p in paths):
        return False
    import torch

    first, *rest = (torch.load(p) for p in paths)
    return all(w.keys() == first.keys() and all(torch.equal(w[k], first[k]) for k in first) for w in rest)
