"""The demo's built-in fault plan: which faults hit the simulated 4-GPU node, when, and what
trainguard is expected to conclude about each (the demo is also a self-test).

Every fault is step-triggered, so it lands mid-run however fast the machine is. ``chaos_toml``
turns the plan into a `trainguard run --chaos` plan (docs/chaos.md), which the supervisor's
chaos executor carries out; examples/chaos/demo.toml is the same plan as a file.

    >>> plan = build_plan(quick=True)
    >>> [f.kind for f in plan.faults]
    ['nan', 'xid', 'crash', 'corrupt_checkpoint', 'hang', 'straggler', 'wrong_products']
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

# What an application bug looks like: a data-pipeline error, nothing hardware about it.
CRASH_EXC = "ValueError"
CRASH_MESSAGE = "malformed sample in shard 7: expected 64 pixels, got 63"


@dataclass(frozen=True, slots=True)
class DemoFault:
    """One injected fault and the conclusion expected of trainguard.

    ``expected_causes`` are `RootCause` values; ``expected_actions`` the supervisor's decisions
    (`actions.JobAction` values: a torn checkpoint's incident says "skip_torn_checkpoint", the
    resume went on from an older one), or "rollback" (`actions.StepAction`: the trainer's own NaN
    rollback).
    """

    id: str  # "F1".."F7": the key the report and the JSON use
    kind: str  # straggler | nan | xid | crash | corrupt_checkpoint | hang | wrong_products | kill
    label: str
    step: int
    rank: int | None = None
    expected_causes: tuple[str, ...] = ()
    expected_actions: tuple[str, ...] = ()
    # An expected "unknown" must be earned: the incident lists exactly these suspects (the
    # evidence ruled the others out), not the fallback's.
    expected_suspects: tuple[str, ...] = ()
    xid: int = 79
    delay_s: float = 0.5  # straggler: extra seconds per step ...
    slow_steps: int = 6  # ... for this many steps
    rate: float = 1.0  # wrong_products: the share of the results of the GPU's products that are wrong
    message: str = ""  # xid: the error the process raises (default: torch's for that Xid)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    steps: int
    checkpoint_every: int
    step_delay: float  # seconds of sleep per step, so the faults land while a human watches
    faults: tuple[DemoFault, ...] = field(default=())
    nproc: int = 4
    launcher: str = "torch"  # torch: DDP ranks, one per GPU; tf: one Keras process over the GPUs
    gpus: tuple[int, ...] = ()  # the GPUs the job starts on (default: one per rank)
    # Pre-imported spare workers: restarts in 2-8 s instead of 10-20 s, for ~12 extra interpreter
    # starts over the run; the short run spends more CPU on the pool than it saves on 2 cores.
    warm_standby: bool = True

    def fault(self, fault_id: str) -> DemoFault:
        return next(f for f in self.faults if f.id == fault_id)


# F7's defective GPU gets 1 in 10,000 elements of its products' results wrong, picked by position
# and value (the same operands, the same wrong elements: docs/demo.md). The pre-flight's SDC
# round on the simulated GPU (two 256 x 256 fp32 products: 131,072 results) gets 16 of them
# wrong, every time.
SDC_RATE = 1e-4


def build_plan(quick: bool = False, steps: int | None = None, speed: float = 1.0) -> DemoPlan:
    """The built-in plan. ``quick`` is the short run of the tests; ``steps`` stretches or shrinks
    the run (fault steps scale with it); ``speed`` > 1 shortens the per-step delay."""
    # The straggler comes last: its GPU stays degraded (clocks stuck low), and the supervisor
    # weighs a degraded GPU's findings into the root cause of any later crash (see docs/demo.md).
    # The torn checkpoint comes a few steps after a checkpoint (so that one is committed and is the
    # newest), a few heartbeats (~0.25 s each) before the hang, and the hang comes before the next
    # checkpoint: the restart after the hang must skip the torn one.
    # The wrong products (F7) start between the torn checkpoint and the hang: nothing shows them
    # until the pre-flight before the hang's restart runs its SDC round and excludes GPU 1. From
    # then on rank 1 runs on GPU 2, where the straggler (F6) strikes; diagnostics measure GPU 2 at
    # half its peers' speed, so it is excluded too, and the run ends on GPU 0.
    if quick:
        base = DemoPlan(steps=130, checkpoint_every=15, step_delay=0.06, warm_standby=False)
        at = {"nan": 20, "xid": 35, "crash": 55, "corrupt_checkpoint": 82, "hang": 89, "straggler": 105}
        at["wrong_products"] = 85
        slow_steps = 4
    else:
        base = DemoPlan(steps=220, checkpoint_every=20, step_delay=0.1)
        at = {"nan": 35, "xid": 60, "crash": 95, "corrupt_checkpoint": 148, "hang": 156, "straggler": 180}
        at["wrong_products"] = 151
        slow_steps = 6
    scale = 1.0
    if steps is not None:
        scale = steps / base.steps
        base = replace(base, steps=steps, checkpoint_every=max(2, round(base.checkpoint_every * scale)))
    base = replace(base, step_delay=round(base.step_delay / max(speed, 0.01), 4))

    def s(kind: str) -> int:
        return max(3, round(at[kind] * scale))

    faults = (
        DemoFault(
            "F1", "nan", "NaN in the loss (SDC suspect)", s("nan"), rank=0,
            expected_causes=("silent_data_corruption",), expected_actions=("rollback",),
        ),
        DemoFault(
            "F2", "xid", "Xid 79: GPU 3 fell off the bus", s("xid"), rank=3,
            expected_causes=("faulty_gpu",), expected_actions=("exclude_gpu",),
        ),
        DemoFault(
            "F3", "crash", f"software crash ({CRASH_EXC})", s("crash"), rank=1,
            expected_causes=("software_bug",), expected_actions=("restart",),
        ),
        DemoFault(
            "F4", "corrupt_checkpoint", "newest checkpoint corrupted on disk", s("corrupt_checkpoint"),
            # Bytes flipped, sizes intact: storage's (a save torn mid-way is another cause).
            expected_causes=("dependency",), expected_actions=("skip_torn_checkpoint",),
        ),
        DemoFault(
            "F5", "hang", "hang: rank 2 stops before a collective", s("hang"), rank=2,
            # The laggard sits outside any collective: not a network fault, and nothing tells its
            # code, its host and its GPU apart (the incident lists them as suspects; a hang with
            # no laggard, the fallback, suspects the network and the host instead).
            expected_causes=("unknown",), expected_actions=("restart",),
            expected_suspects=("software_bug", "host", "faulty_gpu"),
        ),
        DemoFault(
            "F6", "straggler", "straggler: GPU 2 clocks stuck low", s("straggler"), rank=1,
            expected_causes=("faulty_gpu",), expected_actions=("exclude_gpu",), slow_steps=slow_steps,
        ),
        DemoFault(
            "F7", "wrong_products", "GPU 1 returns wrong matrix products", s("wrong_products"), rank=1,
            # No telemetry symptom: only the pre-flight's SDC round before the next restart sees it.
            # A defective unit errs on a small share of its operations, reproducibly (SDC_RATE).
            expected_causes=("silent_data_corruption",), expected_actions=("exclude_gpu",),
            rate=SDC_RATE,
        ),
    )  # fmt: skip
    return replace(base, faults=faults)


# What TensorFlow's stream executor reports when the GPU under a running kernel falls off the bus
# (it then aborts the process): the CUDA error, in the driver API's words.
TF_XID_79 = "Error polling for event status: failed to query event: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"


def build_keras_plan(quick: bool = False, steps: int | None = None, speed: float = 1.0) -> DemoPlan:
    """The Keras tour (``trainguard demo --framework keras``): one Keras process trains over the
    simulated node's four GPUs (``MirroredStrategy``) under ``--framework tf``, and five faults
    hit it: a NaN, Xid 79 on its GPU, a kill, a torn checkpoint and a hang. A start costs a
    TensorFlow import, so the tour is shorter than the torch demo's and has one restart fewer.
    The torn checkpoint comes a step after a checkpoint, a few heartbeats before the hang, and
    the hang before the next checkpoint: the restart after the hang must skip the torn one."""
    if quick:
        base = DemoPlan(steps=100, checkpoint_every=10, step_delay=0.05, nproc=1, launcher="tf")
        at = {"nan": 15, "xid": 28, "kill": 45, "corrupt_checkpoint": 71, "hang": 79}
    else:
        base = DemoPlan(steps=160, checkpoint_every=10, step_delay=0.1, nproc=1, launcher="tf")
        at = {"nan": 25, "xid": 48, "kill": 75, "corrupt_checkpoint": 111, "hang": 119}
    scale = 1.0
    if steps is not None:
        scale = steps / base.steps
        base = replace(base, steps=steps, checkpoint_every=max(2, round(base.checkpoint_every * scale)))
    base = replace(
        base, step_delay=round(base.step_delay / max(speed, 0.01), 4), warm_standby=False, gpus=(0, 1, 2, 3)
    )

    def s(kind: str) -> int:
        return max(3, round(at[kind] * scale))

    faults = (
        DemoFault(
            "F1", "nan", "NaN in the loss", s("nan"), rank=0,
            # Keras applies a step before any callback sees its loss, and fit's data moves on:
            # the step is rolled back, never replayed, so machine and data stay suspects.
            expected_causes=("unknown",), expected_actions=("rollback",),
            expected_suspects=("silent_data_corruption", "software_bug"),
        ),
        DemoFault(
            "F2", "xid", "Xid 79: GPU 0 fell off the bus", s("xid"), rank=0,
            expected_causes=("faulty_gpu",), expected_actions=("exclude_gpu",), message=TF_XID_79,
        ),
        DemoFault(
            "F3", "kill", "SIGKILL from outside", s("kill"), rank=0,
            # No OOM killer fired and nothing else says who sent it: the host or whoever killed it.
            expected_causes=("unknown",), expected_actions=("restart",), expected_suspects=("host", "dependency"),
        ),
        DemoFault(
            "F4", "corrupt_checkpoint", "newest checkpoint corrupted on disk", s("corrupt_checkpoint"),
            expected_causes=("dependency",), expected_actions=("skip_torn_checkpoint",),
        ),
        DemoFault(
            "F5", "hang", "hang: the process stops between steps", s("hang"), rank=0,
            expected_causes=("unknown",), expected_actions=("restart",),
            expected_suspects=("software_bug", "host", "faulty_gpu"),
        ),
    )  # fmt: skip
    return replace(base, faults=faults)


def chaos_toml(plan: DemoPlan) -> str:
    """The plan as a `trainguard run --chaos` TOML plan (what the supervisor executes)."""
    out = ["# trainguard demo: built-in chaos plan (generated by trainguard.demo.plan)"]
    for f in plan.faults:
        out += ["", "[[fault]]", f'name = "{f.id} {f.label}"']
        if f.kind == "straggler":
            out += ['kind = "slow"', f"rank = {f.rank}", f"delay_s = {f.delay_s}", f"steps = {f.slow_steps}"]
        elif f.kind == "nan":
            out += ['kind = "nan"', f"rank = {f.rank}"]
        elif f.kind == "xid":
            out += ['kind = "xid"', f"rank = {f.rank}", f"xid = {f.xid}"]
            out += [f"message = {json.dumps(f.message)}"] if f.message else []
        elif f.kind == "kill":
            out += ['kind = "kill"', f"rank = {f.rank}"]
        elif f.kind == "crash":
            out += [
                'kind = "raise"',
                f"rank = {f.rank}",
                f'exc = "{CRASH_EXC}"',
                f'message = "{CRASH_MESSAGE}"',
            ]
        elif f.kind == "corrupt_checkpoint":
            out += ['kind = "corrupt_checkpoint"']
        elif f.kind == "hang":
            out += ['kind = "hang"', f"rank = {f.rank}"]
        elif f.kind == "wrong_products":
            out += ['kind = "wrong_products"', f"rank = {f.rank}", f"rate = {f.rate}"]
        out.append(f"step = {f.step}")
    return "\n".join(out) + "\n"
