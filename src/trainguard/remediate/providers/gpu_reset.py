"""GPU reset: ``nvidia-smi -r -i N``, only on a GPU no process uses, with persistence mode handled.

    1. any compute process on the GPU?  -> refuse (failed, not retried: the job must stop first)
    2. persistence mode on?             -> nvidia-smi -pm 0 -i N (the driver holds the GPU open)
    3. nvidia-smi -r -i N
    4. persistence mode back on, and the GPU must answer again; a GPU still lost failed to reset

A failed reset is the executor's cue to request a node reboot. Two ``GpuControl``s: ``NvidiaSmi``
(a real node) and ``SimGpuControl`` (the simulated node: a reset clears what a real one clears;
a GPU that fell off the bus stays lost, as a hardware fault does).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any, Protocol

from trainguard.errors import ConfigError
from trainguard.records import GpuProcess
from trainguard.remediate.providers import Outcome, Status, Target

__all__ = ["GpuControl", "GpuResetProvider", "NvidiaSmi", "SimGpuControl"]


class GpuControl(Protocol):
    def processes(self, gpu: int) -> list[GpuProcess]: ...

    def persistence(self, gpu: int) -> bool | None: ...

    def set_persistence(self, gpu: int, on: bool) -> None: ...

    def reset(self, gpu: int) -> tuple[bool, str]: ...

    def answers(self, gpu: int) -> bool: ...


class GpuResetProvider:
    name = "gpu_reset"

    def __init__(self, control: GpuControl) -> None:
        self.control = control

    def apply(self, remedy: str, target: Target) -> Outcome:
        if remedy != "reset_gpu" or target.gpu is None:
            return Outcome(Status.FAILED, f"gpu_reset cannot {remedy} (gpu={target.gpu})")
        gpu, c = target.gpu, self.control
        try:
            busy = c.processes(gpu)
        except Exception as exc:  # cannot tell whether it is in use: never reset blind
            return Outcome(Status.FAILED, f"cannot list processes on GPU {gpu}: {exc}")
        if busy:
            pids = ", ".join(f"{p.pid} ({p.command or '?'})" for p in busy[:4])
            return Outcome(Status.FAILED, f"GPU {gpu} is in use by pid {pids}: not reset")
        persistent = c.persistence(gpu)
        if persistent:
            c.set_persistence(gpu, False)
        try:
            ok, detail = c.reset(gpu)
        finally:
            if persistent:
                c.set_persistence(gpu, True)
        if not ok:
            return Outcome(Status.FAILED, f"reset of GPU {gpu} failed: {detail}")
        if not c.answers(gpu):
            return Outcome(Status.FAILED, f"GPU {gpu} does not answer after its reset (hardware fault)")
        return Outcome(Status.DONE, f"GPU {gpu} reset ({detail})" if detail else f"GPU {gpu} reset")

    def verify(self, remedy: str, target: Target) -> bool | None:
        return None  # a reset leaves no state to read back: never repeated blindly


class SimGpuControl:
    """The simulated node's GPUs (a ``SimNode``)."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.persistent: dict[int, bool] = {}
        self.resets: list[int] = []

    def processes(self, gpu: int) -> list[GpuProcess]:
        return list(self.sim.processes(gpu))

    def persistence(self, gpu: int) -> bool | None:
        return self.persistent.get(gpu, bool(self.sim.modes(gpu).persistence))

    def set_persistence(self, gpu: int, on: bool) -> None:
        self.persistent[gpu] = on

    def reset(self, gpu: int) -> tuple[bool, str]:
        from trainguard.telemetry.sim.faults import GpuReset

        if self.persistence(gpu):  # as the driver: a GPU held open by persistence mode is busy
            return False, "In use by another client (persistence mode)"
        self.resets.append(gpu)
        self.sim.inject_now(GpuReset(gpu))
        return True, "simulated"

    def answers(self, gpu: int) -> bool:
        return not self.sim.sample()[gpu].lost


class NvidiaSmi:
    """A real node's GPUs through ``nvidia-smi`` (root)."""

    def __init__(self, exe: str = "nvidia-smi", timeout_s: float = 120.0) -> None:
        path = shutil.which(exe)
        if path is None:
            raise ConfigError(f"{exe} not found: GPU reset needs the NVIDIA driver's nvidia-smi")
        self.exe, self.timeout_s = path, timeout_s

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.exe, *args], capture_output=True, text=True, timeout=self.timeout_s, check=False
        )

    def processes(self, gpu: int) -> list[GpuProcess]:
        from trainguard.telemetry.procinfo import describe_all

        r = self._run("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits", "-i", str(gpu))
        if r.returncode != 0:
            raise RuntimeError((r.stderr or r.stdout).strip())
        pids = []
        for line in r.stdout.splitlines():
            parts = [x.strip() for x in line.split(",")]
            if parts and parts[0].isdigit():
                used = float(parts[1]) if len(parts) > 1 and parts[1].replace(".", "").isdigit() else None
                pids.append((int(parts[0]), used))
        return describe_all(pids, gpu)

    def persistence(self, gpu: int) -> bool | None:
        r = self._run("--query-gpu=persistence_mode", "--format=csv,noheader", "-i", str(gpu))
        text = r.stdout.strip().lower()
        return None if r.returncode != 0 else text == "enabled"

    def set_persistence(self, gpu: int, on: bool) -> None:
        self._run("-pm", "1" if on else "0", "-i", str(gpu))

    def reset(self, gpu: int) -> tuple[bool, str]:
        try:
            r = self._run("-r", "-i", str(gpu))
        except subprocess.TimeoutExpired:
            return False, f"nvidia-smi -r timed out after {self.timeout_s:g}s"
        lines = [x.strip() for x in f"{r.stdout}\n{r.stderr}".splitlines() if x.strip()]
        if r.returncode == 0:
            return True, lines[-1] if lines else ""
        # A refusal leads with what went wrong ("The following GPUs could not be reset:" and the
        # GPU's line "GPU 00000000:1A:00.0: In use by another client"); advice follows it.
        return False, f"nvidia-smi -r exit {r.returncode}: {' '.join(lines[:2]) or 'no output'}"

    def answers(self, gpu: int) -> bool:
        return self._run("--query-gpu=index", "--format=csv,noheader", "-i", str(gpu)).returncode == 0
