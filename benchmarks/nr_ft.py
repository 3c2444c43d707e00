"""examples/train_ft.py for bench_no_restart.py's replica arm, with the two SIGSTOPs placed where
the bench wants them: unchanged otherwise (the same file runs, through runpy).

    trainguard run --replica-groups 2 --nproc-per-node 1 -- python benchmarks/nr_ft.py \\
        --work DIR --stop-between 180 --stop-in-allreduce 225 -- --steps 300 ...

Every rank writes its pid to DIR/pid<group>.<rank> at its start (where the bench sends a kill).
In replica group 1, rank 0, once each: at step --stop-between (or its first step beside the peer
after it), before asking for the step's quorum (between steps: its last step is committed beside
the peer, the next not begun), and at step
--stop-in-allreduce, inside the cross-group all-reduce (the quorum is in with the peer, which
is waiting on this rank's gradients), the rank writes ``<time> <pid>`` to DIR/stop-<where> and
waits there; the bench SIGSTOPs it on seeing the file. So the in-collective stop lands inside the
collective every time, not when a timer happens to hit it.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import trainguard.torch.ft as ft

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_ft.py"


def hold(work: Path, where: str) -> None:
    """Say where this rank is, then wait there for the bench's SIGSTOP (once per job: the file
    stays, and a restarted rank never waits again)."""
    mark = work / f"stop-{where}"
    if mark.exists():
        return
    tmp = mark.with_suffix(".tmp")
    tmp.write_text(f"{time.time()} {os.getpid()}\n")
    os.replace(tmp, mark)
    while True:  # the bench stops this process here; the supervisor then ends it
        time.sleep(0.01)


def main() -> None:
    argv = sys.argv[1:]
    ours, theirs = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--stop-between", type=int, default=-1)
    p.add_argument("--stop-in-allreduce", type=int, default=-1)
    args = p.parse_args(ours)
    group, rank = ft.replica_group()[0], int(os.environ.get("RANK", "0"))
    (args.work / f"pid{group}.{rank}").write_text(f"{os.getpid()}\n")
    build = ft.manager

    def manager(*a: Any, **k: Any) -> Any:
        mgr = build(*a, **k)
        if group != 1 or rank != 0:
            return mgr
        start_quorum, allreduce = mgr.start_quorum, mgr.allreduce

        def quorum(*qa: Any, **qk: Any) -> Any:
            # >=: a group that healed past the step stops at its first step beside the peer
            if 0 <= args.stop_between <= mgr.current_step() and mgr.num_participants() > 1:
                hold(args.work, "between")
            return start_quorum(*qa, **qk)

        def reduce(*ra: Any, **rk: Any) -> Any:
            if 0 <= args.stop_in_allreduce <= mgr.current_step():
                mgr.wait_quorum()
                if mgr.num_participants() > 1:  # the peer is in this all-reduce with us
                    hold(args.work, "allreduce")
            return allreduce(*ra, **rk)

        mgr.start_quorum, mgr.allreduce = quorum, reduce
        return mgr

    ft.manager = manager  # train_ft.py imports it from the module when runpy runs it
    sys.argv = [str(EXAMPLE), *theirs]
    runpy.run_path(str(EXAMPLE), run_name="__main__")


if __name__ == "__main__":
    main()
