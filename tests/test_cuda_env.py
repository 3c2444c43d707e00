"""Wherever trainguard sets CUDA_VISIBLE_DEVICES it also sets CUDA_DEVICE_ORDER=PCI_BUS_ID.

The GPU indices trainguard excludes are NVML's (nvidia-smi's), which count by PCI bus; CUDA counts
fastest-first unless told otherwise, so on a node of mixed GPUs ``CUDA_VISIBLE_DEVICES=0,3`` alone
may hand a rank the GPU that was excluded. A scan of the code that ships (src, examples, tools,
benchmarks, deploy) finds every place that sets the variable; each must set the order beside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainguard.supervisor.health import GpuMap

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("src", "examples", "tools", "benchmarks", "deploy")

# Setting a variable, as Python, shell and Kubernetes manifests spell it: a dict key or item
# assignment ("NAME": / ["NAME"] =), os.environ.setdefault/putenv("NAME", ...), NAME=value in a
# shell line or as a keyword argument (env.update(NAME=...)), and `name: NAME` in an env list.
_SETS = (
    r"""["']{name}["']\s*:""",
    r"""\[\s*["']{name}["']\s*\]\s*=(?!=)""",
    r"""(?:setdefault|putenv)\(\s*["']{name}["']""",
    r"""(?:^|[\s;(,])(?:export\s+)?{name}=\S""",  # a shell line, or a keyword argument
    r"""name:\s*["']?{name}\b""",
)


def sets(name: str, text: str) -> bool:
    return any(re.search(p.format(name=name), text, re.MULTILINE) for p in _SETS)


def unordered(text: str) -> bool:
    """The text sets CUDA_VISIBLE_DEVICES without setting CUDA_DEVICE_ORDER to PCI_BUS_ID."""
    return sets("CUDA_VISIBLE_DEVICES", text) and not (
        sets("CUDA_DEVICE_ORDER", text) and "PCI_BUS_ID" in text
    )


def _shipped_files() -> list[Path]:
    out = []
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".yml", ".toml", ".j2", ""):
                out.append(path)
    return out


def test_every_place_that_sets_cuda_visible_devices_sets_the_pci_bus_order():
    setting = []
    bad = []
    for path in _shipped_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if sets("CUDA_VISIBLE_DEVICES", text):
            setting.append(path.relative_to(ROOT))
            if unordered(text):
                bad.append(path.relative_to(ROOT))
    assert not bad, f"CUDA_VISIBLE_DEVICES set without CUDA_DEVICE_ORDER=PCI_BUS_ID in {bad}"
    # the scan must see the one place that does set it (else it proves nothing)
    assert Path("src/trainguard/supervisor/health.py") in setting, setting


@pytest.mark.parametrize(
    "text",
    [
        'env = {"CUDA_VISIBLE_DEVICES": "0,1"}',
        "env['CUDA_VISIBLE_DEVICES'] = gpus",
        'os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")',
        "CUDA_VISIBLE_DEVICES=0,3 python train.py",
        "export CUDA_VISIBLE_DEVICES=1",
        "        - name: CUDA_VISIBLE_DEVICES\n          value: '0'",
        # the order set, but not to the bus order
        'env = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}',
    ],
)
def test_the_scan_flags_a_visible_devices_setting_without_the_bus_order(text):
    assert unordered(text)


@pytest.mark.parametrize(
    "text",
    [
        'return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpus}',
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,3 python train.py",
        'reason = "torch sees 2 of 4 GPUs (CUDA_VISIBLE_DEVICES?)"',  # a message, not a setting
        'if os.environ.get("CUDA_VISIBLE_DEVICES") == "0": pass',  # a read, not a setting
    ],
)
def test_the_scan_passes_reads_messages_and_ordered_settings(text):
    assert not unordered(text)


def test_the_workers_gpu_environment_sets_both():
    env = GpuMap((0, 2, 3)).without(2).cuda_env()
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,3"}
