"""Record torch flight-recorder dumps of gloo jobs with faults (`tests/flight_worker.py`).

    .venv/bin/python tests/record_flight.py tests/data/flight            # every scenario
    .venv/bin/python tests/record_flight.py tests/data/flight gil8       # one

Each scenario starts its ranks as plain processes (env:// rendezvous on a free loopback port),
waits until every rank reached the fault step and the job has settled, asks every rank for a dump
through torch's debug-info pipe, the way the supervisor does on a hang, collects what came, and
kills the job. ``expected.json`` beside the dumps holds the ranks the faults were put on
(``culprits``; ``late``: those only made late, which join in the end) and the set the job belongs
to (``set``, see `SPLIT`), for the tests and tools/flight_score.py (never for the analysis).

Two sets. ``design``: the jobs the analysis was written against (the first seven, and half of the
later ones). ``score``: jobs recorded and set aside before any rule changed after them; they only
measure it. The later jobs were split by `SPLIT` (a seeded shuffle of their names, drawn before any
of them was recorded); a rule is never changed because of a ``score`` job.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.supervisor.hang import request_flight_dumps

HERE = Path(__file__).resolve().parent
# name -> (world, tp, faults, culprits, format[, fault step, TORCH_FR_BUFFER_SIZE])
SCENARIOS: dict[str, tuple[Any, ...]] = {
    "stall4": (4, 2, "stall:2", [2], "json"),
    "gil8": (8, 4, "gil:5", [5], "pickle"),
    "kill4": (4, 2, "kill:1,slow:3", [1, 3], "pickle"),
    "size4": (4, 2, "size:3", [3], "pickle"),
    "multi16": (16, 4, "gil:5,kill:10,slow:14", [5, 10, 14], "pickle"),
    "late8": (8, 4, "slow:6", [6], "pickle"),
    # recorded later, split into design and score by SPLIT before any was recorded
    "skip4": (4, 2, "skip:1", [1], "pickle"),
    "skip8": (8, 4, "skip:6", [6], "pickle"),
    "skip16": (16, 4, "skip:13", [13], "pickle"),
    "order4": (4, 2, "order:2", [2], "pickle"),
    "order8": (8, 2, "order:5", [5], "pickle"),
    "op4": (4, 2, "op:3", [3], "pickle"),
    "op8": (8, 4, "op:4", [4], "pickle"),
    "dtype4": (4, 2, "dtype:1", [1], "pickle"),
    "dtype8": (8, 4, "dtype:7", [7], "json"),
    "exit4": (4, 2, "exit:2", [2], "pickle"),
    "exit8": (8, 4, "exit:3", [3], "pickle"),
    "killpre8": (8, 4, "killpre:4", [4], "pickle"),
    "extra4": (4, 2, "extra:3", [3], "pickle"),
    "extra8": (8, 4, "extra:2", [2], "pickle"),
    "stalldp8": (8, 4, "stalldp:1", [1], "pickle"),
    "two8": (8, 4, "stall:3,stalldp:6", [3, 6], "pickle"),
    "wrap8": (8, 4, "stall:5", [5], "pickle", 12, 16),
    "late4": (4, 2, "slow:0", [0], "pickle"),
}
FIRST = ("stall4", "gil8", "kill4", "size4", "multi16", "late8", "runhang2")  # written against
SEED = 41  # issue #41


def split() -> dict[str, str]:
    """name -> "design" | "score": the first jobs are design; the later ones, shuffled with SEED,
    half each (the odd one to score)."""
    later = sorted(n for n in SCENARIOS if n not in FIRST)
    random.Random(SEED).shuffle(later)
    half = len(later) // 2
    return {**dict.fromkeys(FIRST, "design"), **dict.fromkeys(later[:half], "design"),
            **dict.fromkeys(later[half:], "score")}  # fmt: skip


SPLIT = split()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(name: str, out: Path, settle_s: float = 8.0, ceiling_s: float = 240.0) -> Path:
    world, tp, faults, culprits, fmt, *more = SCENARIOS[name]
    fault_step, buffer = (more + [2, 64][len(more) :])[:2]
    late = sorted(int(f.split(":")[1]) for f in faults.split(",") if f.startswith("slow:"))
    exits = {int(f.split(":")[1]) for f in faults.split(",") if f.startswith("exit:")}
    work = Path(tempfile.mkdtemp(prefix=f"fr-{name}-"))
    marks, dumps = work / "marks", work / "dumps"
    marks.mkdir()
    dumps.mkdir()
    prefix = str(dumps / "nccl_trace_rank_")
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "TORCH_FR_BUFFER_SIZE": str(buffer), "FR_PREFIX": prefix, "FR_FORMAT": fmt,
               "TP": str(tp), "FAULT_STEP": str(fault_step), "FAULTS": faults, "FR_MARKS": str(marks),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent / "src")}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "flight_worker.py")], env=env, start_new_session=True
            )
        )
    try:
        deadline = time.time() + ceiling_s
        while time.time() < deadline and len(list(marks.glob("at*"))) < world:
            if any(p.poll() not in (None, -signal.SIGKILL) and not (r in exits and p.poll() == 1)
                   for r, p in enumerate(procs)):  # fmt: skip
                raise RuntimeError(f"{name}: a rank exited early")
            time.sleep(0.2)
        if len(list(marks.glob("at*"))) < world:
            raise RuntimeError(f"{name}: not every rank reached the fault step")
        time.sleep(settle_s)  # the kill fires, the slow rank arrives, errors are raised and dumped
        request_flight_dumps(prefix, list(range(world)), wait_s=60.0)  # 16 ranks on 2 busy cores
        snapshot = {
            f.name: f.read_bytes() for f in sorted(dumps.iterdir()) if not f.name.endswith((".pipe", ".tmp"))
        }
        if not snapshot:  # no job hangs with every rank silent: the request went unanswered
            raise RuntimeError(f"{name}: no rank answered the dump request")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    target = out / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for fname, body in snapshot.items():  # as they were when asked, before the teardown's errors
        (target / fname).write_bytes(body)
    (target / "expected.json").write_text(
        json.dumps({"world": world, "faults": faults, "culprits": culprits, "late": late, "set": SPLIT[name]})
        + "\n"
    )
    shutil.rmtree(work, ignore_errors=True)
    return target


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or list(SCENARIOS):
        print(name, record(name, out), flush=True)
