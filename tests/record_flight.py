"""Record torch flight-recorder dumps of gloo jobs with faults (`tests/flight_worker.py`).

    .venv/bin/python tests/record_flight.py tests/data/flight            # every scenario
    .venv/bin/python tests/record_flight.py tests/data/flight gil8       # one

Each scenario starts its ranks as plain processes (env:// rendezvous on a free loopback port),
waits until every rank reached the fault step and the job has settled, asks every rank for a dump
through torch's debug-info pipe, the way the supervisor does on a hang, collects what came, and
kills the job. ``expected.json`` beside the dumps holds the ranks the faults were put on
(``culprits``; ``late``: those only made late, which join in the end), for the tests (never for
the analysis).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard.supervisor.hang import request_flight_dumps

HERE = Path(__file__).resolve().parent
# name -> (world, tp, faults, culprits, format)
SCENARIOS: dict[str, tuple[int, int, str, list[int], str]] = {
    "stall4": (4, 2, "stall:2", [2], "json"),
    "gil8": (8, 4, "gil:5", [5], "pickle"),
    "kill4": (4, 2, "kill:1,slow:3", [1, 3], "pickle"),
    "size4": (4, 2, "size:3", [3], "pickle"),
    "multi16": (16, 4, "gil:5,kill:10,slow:14", [5, 10, 14], "pickle"),
    "late8": (8, 4, "slow:6", [6], "pickle"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(name: str, out: Path, settle_s: float = 8.0, ceiling_s: float = 240.0) -> Path:
    world, tp, faults, culprits, fmt = SCENARIOS[name]
    late = sorted(int(f.split(":")[1]) for f in faults.split(",") if f.startswith("slow:"))
    work = Path(tempfile.mkdtemp(prefix=f"fr-{name}-"))
    marks, dumps = work / "marks", work / "dumps"
    marks.mkdir()
    dumps.mkdir()
    prefix = str(dumps / "nccl_trace_rank_")
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "TORCH_FR_BUFFER_SIZE": "64", "FR_PREFIX": prefix, "FR_FORMAT": fmt,
               "TP": str(tp), "FAULT_STEP": "2", "FAULTS": faults, "FR_MARKS": str(marks),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent / "src")}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "flight_worker.py")], env=env, start_new_session=True
            )
        )
    try:
        deadline = time.time() + ceiling_s
        while time.time() < deadline and len(list(marks.glob("at*"))) < world:
            if any(p.poll() not in (None, -signal.SIGKILL) for p in procs):
                raise RuntimeError(f"{name}: a rank exited early")
            time.sleep(0.2)
        if len(list(marks.glob("at*"))) < world:
            raise RuntimeError(f"{name}: not every rank reached the fault step")
        time.sleep(settle_s)  # the kill fires, the slow rank arrives, errors are raised and dumped
        request_flight_dumps(prefix, list(range(world)), wait_s=15.0)
        snapshot = {
            f.name: f.read_bytes() for f in sorted(dumps.iterdir()) if not f.name.endswith((".pipe", ".tmp"))
        }
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
        json.dumps({"world": world, "faults": faults, "culprits": culprits, "late": late}) + "\n"
    )
    shutil.rmtree(work, ignore_errors=True)
    return target


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or list(SCENARIOS):
        print(name, record(name, out), flush=True)
