"""One rank of a gloo job that records torch's flight recorder, for `tests/record_flight.py`.

Process groups: the default group, tensor-parallel groups of ``TP`` consecutive ranks and
data-parallel groups of the ranks ``TP`` apart; each step does a tp all-reduce, a dp all-reduce and
a default-group all-reduce. At step ``FAULT_STEP`` the ranks named in ``FAULTS`` misbehave:

- ``gil:R``     rank R enters C code holding the GIL before its dp all-reduce (no thread runs);
- ``stall:R``   rank R sleeps (GIL released) before its tp all-reduce: stuck outside communication;
- ``stalldp:R`` the same before its dp all-reduce (mid-step, after its tp all-reduce);
- ``kill:R``    rank R is SIGKILLed inside its dp all-reduce (a peer of R is ``slow`` so it is in it);
- ``killpre:R`` rank R is SIGKILLed before its tp all-reduce (it dies between collectives);
- ``exit:R``    rank R raises an application error before its dp all-reduce and exits 1, no dump;
- ``slow:R``    rank R enters the dp all-reduce 4 s late (healthy, just late);
- ``size:R``    rank R issues the default-group all-reduce with 8 elements instead of 4;
- ``dtype:R``   rank R issues the default-group all-reduce in float64;
- ``op:R``      rank R issues a broadcast from rank 0 where the others all-reduce (default group);
- ``skip:R``    rank R skips its tp all-reduce and goes on to the dp one (a different collective
  than its tp peers wait in);
- ``order:R``   rank R issues the default-group all-reduce before the dp one (its peers the other
  way round);
- ``extra:R``   rank R issues one default-group all-reduce more, before its tp all-reduce.

Dumps: every rank answers torch's debug-info pipe (``<prefix><rank>.pipe``) with a dump to
``<prefix><rank>`` (trainguard's gloo writer), and dumps once when a collective raises (what NCCL's
dump-on-timeout does on an error), then waits to be killed.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainguard.torch.flight_recorder import dump, serve_dump_requests


def main() -> None:
    prefix, fmt = os.environ["FR_PREFIX"], os.environ.get("FR_FORMAT", "pickle")
    tp_size, fault_step = int(os.environ["TP"]), int(os.environ["FAULT_STEP"])
    faults = [f.split(":") for f in os.environ.get("FAULTS", "").split(",") if f]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = dp = None
    for start in range(0, world, tp_size):
        g = dist.new_group(list(range(start, start + tp_size)), group_desc="tp")
        tp = g if start <= rank < start + tp_size else tp
    for off in range(tp_size):
        g = dist.new_group(list(range(off, world, tp_size)), group_desc="dp")
        dp = g if rank % tp_size == off else dp
    mine = {kind for kind, r in faults if int(r) == rank}
    serve_dump_requests(prefix, rank, fmt)
    marks = Path(os.environ["FR_MARKS"])
    x = torch.ones(4)
    try:
        for step in range(fault_step + 1):
            at = step == fault_step
            now = mine if at else set()
            if at:
                (marks / f"at{rank}").touch()
            if "stall" in now:
                time.sleep(600)
            if "killpre" in now:
                os.kill(os.getpid(), signal.SIGKILL)
            if "extra" in now:
                dist.all_reduce(torch.ones(4))
            if "skip" not in now:
                dist.all_reduce(x, group=tp)
            if "gil" in now:
                ctypes.PyDLL("libc.so.6").sleep(600)  # holds the GIL: no Python thread can dump
            if "stalldp" in now:
                time.sleep(600)
            if "slow" in now:
                time.sleep(4)
            if "kill" in now:
                threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
            if "exit" in now:
                raise ValueError(f"rank {rank}: a bad batch at step {step}")  # exits 1, no dump
            if "order" in now:
                _default(now)
            dist.all_reduce(x, group=dp)
            if "order" not in now:
                _default(now)
            x /= 8
    except RuntimeError:
        dump(prefix, rank, fmt)
        (marks / f"err{rank}").touch()
        time.sleep(600)
    (marks / f"done{rank}").touch()
    time.sleep(600)  # the recorder kills the job once it has the dumps


def _default(now: set[str]) -> None:
    """The step's default-group collective, as the faults of this step make it."""
    y = torch.ones(8 if "size" in now else 4, dtype=torch.float64 if "dtype" in now else torch.float32)
    if "op" in now:
        dist.broadcast(y, src=0)
    else:
        dist.all_reduce(y)


if __name__ == "__main__":
    main()
