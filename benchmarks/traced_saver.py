"""The saver that power_loss.py records under strace: ``traced_saver.py ROOT N`` saves steps 1..N
into ROOT/ck (synchronous saves, keep_last=2), copying ROOT/ck to ROOT/before-<step> and
ROOT/after-<step> around each save, with marker calls that cut the trace into saves."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from bench_crash_consistency import fill, make_state
from trainguard.torch import Checkpointer


def main() -> None:
    root, saves = Path(sys.argv[1]), int(sys.argv[2])
    state = make_state(small=True)
    ck = Checkpointer(root / "ck", keep_last=2, async_save=False)
    for step in range(1, saves + 1):
        fill(state, step)
        os.sync()  # what is on disk now is the durable starting state
        if (root / "ck").exists():
            shutil.copytree(root / "ck", root / f"before-{step}")
        else:
            (root / f"before-{step}").mkdir()
        os.access(f"/tg-mark-begin-{step}", os.F_OK)
        ck.save(step, state)
        os.access(f"/tg-mark-end-{step}", os.F_OK)
        shutil.copytree(root / "ck", root / f"after-{step}")
    ck.close()


if __name__ == "__main__":
    main()
