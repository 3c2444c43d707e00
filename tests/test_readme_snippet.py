"""The README's "In your training script" code runs as shown: twice, the second run resuming, and
once converting a tutorial-style snapshot (one process, gloo)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
PRELUDE = """
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

backend, device_ids = "gloo", None
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
x = torch.randn(64, 4)
train_set = TensorDataset(x, x.sum(1, keepdim=True))
loss_fn = torch.nn.functional.mse_loss
total_steps = int(os.environ["STEPS"])
"""


def snippets() -> list[str]:
    section = README.read_text().split("## In your training script", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.slow
def test_the_readme_training_loop_runs_resumes_and_converts_a_snapshot(tmp_path):
    loop, convert = snippets()
    main = PRELUDE + loop
    # The conversion replaces the plain resume line of the loop.
    converted = PRELUDE + loop.replace("start = ckpt.resume(state)", textwrap.dedent(convert).strip(), 1)
    (tmp_path / "train.py").write_text(main + "\nprint('done', start, step)\n")
    (tmp_path / "convert.py").write_text(converted + "\nprint('done', start, step)\n")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    env.pop("TRAINGUARD_RUN_DIR", None)

    def run(script: str, steps: int, cwd: Path) -> str:
        proc = subprocess.run(
            [sys.executable, script], cwd=cwd, env={**env, "STEPS": str(steps)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    assert run("train.py", 20, tmp_path).split()[-3:] == ["done", "0", "19"]
    assert run("train.py", 30, tmp_path).split()[-3:] == ["done", "20", "29"]  # resumed at 20
    # A tutorial-style snapshot: 3 epochs of 2 batches (64 samples, batch 32) already run.
    import torch

    snap_dir = tmp_path / "snap"
    snap_dir.mkdir()
    (snap_dir / "convert.py").write_text((tmp_path / "convert.py").read_text())
    torch.save({"MODEL_STATE": torch.nn.Linear(4, 1).state_dict(), "EPOCHS_RUN": 3}, snap_dir / "snapshot.pt")
    assert run("convert.py", 10, snap_dir).split()[-3:] == ["done", "6", "9"]
    assert run("convert.py", 12, snap_dir).split()[-3:] == ["done", "10", "11"]  # then its own checkpoint
