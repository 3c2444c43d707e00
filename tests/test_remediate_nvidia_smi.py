"""The real GPU-reset path: `GpuResetProvider` over `NvidiaSmi`, driving a stand-in `nvidia-smi`
(tests/fake_nvidia_smi.py) that answers with the real tool's texts and exit codes and records every
call: a reset that succeeds, one refused because the GPU is in use, one the board does not support,
and a GPU that stays lost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainguard.remediate.providers import Status, Target
from trainguard.remediate.providers.gpu_reset import GpuResetProvider, NvidiaSmi

FAKE = Path(__file__).parent / "fake_nvidia_smi.py"


class Smi:
    """A fake nvidia-smi on disk: its state, and the argument lists it was called with."""

    def __init__(self, tmp_path: Path, **gpu: object) -> None:
        self.state, self.log = tmp_path / "state.json", tmp_path / "calls.jsonl"
        self.exe = tmp_path / "nvidia-smi"
        self.exe.write_text(
            f'#!/bin/sh\nFAKE_SMI_STATE={self.state} FAKE_SMI_LOG={self.log} exec {sys.executable} {FAKE} "$@"\n'
        )
        self.exe.chmod(0o755)
        base = {"bus": "00000000:1A:00.0", "persistence": True, "processes": [], "reset": "ok"}
        self.state.write_text(json.dumps({"1": {**base, **gpu}}))

    def calls(self) -> list[list[str]]:
        return [json.loads(x) for x in self.log.read_text().splitlines()] if self.log.exists() else []

    def gpu(self) -> dict[str, object]:
        return dict(json.loads(self.state.read_text())["1"])

    def reset(self) -> Status:
        out = GpuResetProvider(NvidiaSmi(str(self.exe))).apply("reset_gpu", Target("n1", 1))
        self.outcome = out
        return out.status


def test_a_reset_turns_persistence_off_resets_the_gpu_and_turns_it_back_on(tmp_path: Path) -> None:
    smi = Smi(tmp_path)
    assert smi.reset() is Status.DONE, smi.outcome
    assert "GPU 00000000:1A:00.0 was successfully reset." in smi.outcome.detail
    assert [c[:2] for c in smi.calls()] == [
        ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        ["--query-gpu=persistence_mode", "--format=csv,noheader"],
        ["-pm", "0"],
        ["-r", "-i"],
        ["-pm", "1"],
        ["--query-gpu=index", "--format=csv,noheader"],
    ]
    assert all(c[-2:] == ["-i", "1"] for c in smi.calls())  # the one GPU, never the whole node
    assert smi.gpu()["resets"] == 1 and smi.gpu()["persistence"] is True


def test_a_gpu_with_a_compute_process_is_never_reset(tmp_path: Path) -> None:
    smi = Smi(tmp_path, processes=[[4242, 1024]])
    assert smi.reset() is Status.FAILED
    assert "in use by pid 4242" in smi.outcome.detail and not smi.outcome.retry
    assert not any(c[0] in ("-r", "-pm") for c in smi.calls())


def test_a_reset_refused_because_another_client_holds_the_gpu_says_so(tmp_path: Path) -> None:
    """Fabric Manager or a monitoring agent holds the GPU: nvidia-smi refuses with exit 255; the
    outcome names the refusal (not the advice paragraph after it) and persistence comes back on."""
    smi = Smi(tmp_path, reset="busy")
    assert smi.reset() is Status.FAILED
    assert "In use by another client" in smi.outcome.detail, smi.outcome.detail
    assert "exit 255" in smi.outcome.detail
    assert smi.calls()[-1][:2] == ["-pm", "1"] and smi.gpu()["persistence"] is True
    assert "resets" not in smi.gpu()


def test_a_board_that_cannot_be_reset_fails_the_reset_naming_why(tmp_path: Path) -> None:
    smi = Smi(tmp_path, reset="unsupported", persistence=False)
    assert smi.reset() is Status.FAILED
    assert "is not supported" in smi.outcome.detail and "exit 3" in smi.outcome.detail
    assert not any(c[0] == "-pm" for c in smi.calls())  # persistence was off: left alone


def test_a_lost_gpu_cannot_even_be_listed_and_is_not_reset(tmp_path: Path) -> None:
    smi = Smi(tmp_path, lost=True)
    assert smi.reset() is Status.FAILED
    assert "GPU is lost" in smi.outcome.detail
    assert not any(c[0] == "-r" for c in smi.calls())


def test_a_missing_nvidia_smi_is_a_config_error_naming_it(tmp_path: Path) -> None:
    from trainguard.errors import ConfigError

    with pytest.raises(ConfigError, match="nvidia-smi"):
        NvidiaSmi(str(tmp_path / "nvidia-smi"))
