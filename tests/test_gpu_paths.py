"""Every CUDA-only branch of trainguard, run on a real NVIDIA GPU and checked against its result.

Skipped where torch sees no CUDA GPU; `make gpu-check` (tools/gpu_check.py) runs them on one.
Each test compares the CUDA path with what it must equal (the CPU path, the weights at the step a
snapshot claims, the RNG stream before a restore, nvidia-smi's own readings), so a wrong result
fails, not only a crash.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")


def _nvml():
    from trainguard.errors import BackendUnavailable
    from trainguard.telemetry.nvml import NvmlBackend

    try:
        return NvmlBackend()
    except BackendUnavailable as exc:
        if torch.cuda.is_available():  # a GPU without NVML is a broken machine, not a skip
            pytest.fail(f"torch sees a GPU but NVML does not open: {exc}")
        pytest.skip(f"no NVML here: {exc}")


def _smi() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        if torch.cuda.is_available():
            pytest.fail("torch sees a GPU but there is no nvidia-smi to compare NVML's readings with")
        pytest.skip("no nvidia-smi here")
    return smi


# -- the Guard's windows: packed on the GPU, read through pinned host buffers --------------------


@needs_cuda
def test_windows_read_through_reused_pinned_buffers_equal_the_cpu_path():
    from trainguard.torch.agreement import Agreement

    gpu, cpu = Agreement(world=1), Agreement(world=1)
    values = [0.5 * k for k in range(40)]
    values[13] = math.nan  # a non-finite loss must come back as one, with its source
    values[29] = math.inf
    got, want = [], []
    for start in range(0, 40, 8):  # launch, collect, launch, ...: the Guard's order
        span = range(start, min(start + 8, 40))
        gpu_entries = [(s, torch.tensor(values[s], device="cuda"), 0.01, 0.0, None) for s in span]
        cpu_entries = [(s, torch.tensor(values[s]), 0.01, 0.0, None) for s in span]
        job = gpu.launch(gpu_entries, preempt=False)
        assert job.event is not None  # the host copy is ordered by an event, not a sync
        got.append(gpu.collect(job))
        want.append(cpu.collect(cpu.launch(cpu_entries, preempt=False)))
    assert gpu.device is not None and gpu.device.type == "cuda"
    assert len(gpu._host) == 1  # one pinned buffer, reused by every window
    assert all(b.is_pinned() for b in gpu._host.values())
    for g, w in zip(got, want, strict=True):
        assert g.steps == w.steps
        assert [str(x) for x in g.losses] == [str(x) for x in w.losses]  # nan == nan as text
        assert g.sources == w.sources


@needs_cuda
def test_windows_agreed_over_nccl_go_through_pinned_staging_and_come_back_exact():
    """The multi-rank path (``_to_device``: arrivals staged in pinned memory and copied with
    non_blocking; the all-reduce on NCCL; the stream ordered after it) on a one-member NCCL group,
    the Agreement told of a second rank that adds nothing: every value must come back unchanged."""
    import torch.distributed as dist

    from trainguard.torch.agreement import Agreement

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        agreement = Agreement(world=2, backend="nccl", rank=0)
        values = [1.0 + k for k in range(16)]
        values[5] = math.nan
        windows = []
        for start in (0, 8):
            t0 = time.perf_counter()
            entries = [
                (s, torch.tensor(values[s], device="cuda"), 0.01, t0 + 0.001 * s, None)
                for s in range(start, start + 8)
            ]
            job = agreement.launch(entries, preempt=start == 8)
            assert job.event is not None and job.works == ()  # ordered on the stream, not the host
            windows.append(agreement.collect(job))
        assert agreement.device is not None and agreement.device.type == "cuda"
        assert set(agreement._host) >= {(8, "arrivals"), (8, "arrivals-host")}  # both staging buffers
        assert all(b.is_pinned() for b in agreement._host.values())
    finally:
        dist.destroy_process_group()
    got = [x for w in windows for x in w.losses]
    assert [str(x) for x in got] == [str(x) for x in values]
    assert [w.sources[5 - w.steps[0]] for w in windows if 5 in w.steps] == [(0,)]
    assert (windows[0].preempt, windows[1].preempt) == (False, True)
    for w in windows:  # the arrivals made the round trip: waits from the rank's own stamps
        assert w.waits is not None and all(0.0 <= x < 1.0 for x in w.waits)
        assert w.step_s is not None and w.step_s == pytest.approx(0.001, abs=1e-4)


@needs_cuda
def test_under_the_supervisor_a_cuda_finding_names_the_physical_gpu(tmp_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES=0,3: the rank on CUDA device 1 uses GPU 3, which the finding names."""
    from trainguard.rundir import read_findings
    from trainguard.torch.guard import Guard

    monkeypatch.setenv("TRAINGUARD_GPU", "3")
    model = torch.nn.Linear(8, 1).cuda()
    with Guard(None, None, run_dir=tmp_path, watchdog=False, on_nan="skip") as guard:
        for step in range(4):
            loss = model(torch.randn(4, 8, device="cuda")).pow(2).mean()
            guard.step(step, loss * math.nan if step == 2 else loss)
    [nan] = [f for _, s, f in read_findings(tmp_path) if f.rule == "numerics.nonfinite_loss"]
    assert nan.gpu == 3


@needs_cuda
def test_the_default_gpu_guard_rolls_back_a_nan_without_syncing_between_windows(tmp_path):
    from trainguard.rundir import read_findings
    from trainguard.torch.guard import Guard

    class Memory:
        def __init__(self) -> None:
            self.saved: dict[int, dict[str, torch.Tensor]] = {}

        def save(self, step, state) -> None:
            self.saved[step] = {k: v.clone() for k, v in state.model.state_dict().items()}

        def wait(self) -> None:
            pass

        def resume(self, state) -> int:
            step = max(self.saved)
            state.model.load_state_dict(self.saved[step])
            return step

    class State:
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(64, 1).cuda()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    state, ckpt = State(), Memory()
    fired = []
    # Between windows (the first, 0-7, read at step 8) and away from the checkpoint at 16 and the
    # NaN at 21, the Guard's step may not synchronise: CUDA's sync debug mode raises on any call
    # that would (.item(), a blocking copy, torch.cuda.synchronize).
    quiet = {*range(9, 15), *range(17, 21)}
    checked = []
    with Guard(ckpt, state, run_dir=tmp_path, checkpoint_every=16, watchdog=False) as guard:
        for step in guard.range(0, 48):
            loss = state.model(torch.randn(32, 64, device="cuda")).pow(2).mean()
            if step == 21 and not fired:
                fired.append(step)
                loss = loss * math.nan
            loss.backward()
            mute = step in quiet and not fired
            if mute:
                torch.cuda.set_sync_debug_mode("error")
            try:
                action = guard.step(step, loss)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            checked += [step] if mute else []
            if action == "proceed":
                state.optimizer.step()
            state.optimizer.zero_grad()
        assert checked == sorted(quiet)  # every step between windows ran under the sync check
        assert (guard.check_every, guard.check_lag) == (8, 1)  # the GPU default
    found = read_findings(tmp_path)
    rules = [(s, f.rule) for _, s, f in found]
    assert (21, "numerics.nonfinite_loss") in rules  # the step and rank of the NaN, from the GPU
    nan = next(f for _, s, f in found if f.rule == "numerics.nonfinite_loss")
    assert nan.gpu == torch.cuda.current_device()  # the finding names the GPU the loss was on
    assert any(r == "numerics.rollback" for _, r in rules)
    assert all(torch.isfinite(p).all() for p in state.model.parameters())
    assert sorted(ckpt.saved)[:2] == [16, 32]  # no checkpoint holds the NaN update


# -- checkpoints: side-stream snapshots of GPU memory, page-locked staging --------------------


@needs_cuda
def test_a_side_stream_snapshot_holds_the_weights_of_the_step_it_claims(tmp_path):
    from trainguard.torch import Checkpointer, TrainState

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = TrainState(model, opt)
    x = torch.randn(256, 1024, device="cuda")

    def train(n: int) -> None:
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    with Checkpointer(tmp_path / "ckpt") as ckpt:
        train(3)
        at_save = {k: v.detach().clone() for k, v in model.state_dict().items()}
        moments = [t.clone() for s in opt.state.values() for t in s.values() if t.numel() > 1]
        ckpt.save(3, state)
        train(5)  # the updates right after the save must wait for the side stream's copy
        ckpt.wait()
    assert not torch.equal(at_save["0.weight"], model.state_dict()["0.weight"])  # training went on

    fresh = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-3)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.resume(TrainState(fresh, fresh_opt)) == 3
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, at_save[k]), k
    restored = [t for s in fresh_opt.state.values() for t in s.values() if t.numel() > 1]
    assert len(restored) == len(moments)
    assert all(torch.equal(a, b) for a, b in zip(restored, moments, strict=True))


@needs_cuda
def test_staging_memory_is_page_locked_with_cuda_host_register():
    from trainguard.torch.staging import Staging

    src = [torch.randn(1 << 20, device="cuda"), torch.randn(4096, device="cuda")]
    staging = Staging(src)
    try:
        assert staging._pinned  # cudaHostRegister succeeded: device copies are asynchronous
        assert staging.copy_from(src) is None  # nothing deferred: copied (and synchronised) now
        assert all(torch.equal(v, s.cpu()) for v, s in zip(staging.views, src, strict=True))
        deferred = staging.copy_from(src, defer={src[0].data_ptr()})  # the overlapped copy's path
        assert deferred is not None
        deferred.join()
        assert torch.equal(staging.views[0], src[0].cpu())
    finally:
        staging.close()


@needs_cuda
def test_staging_close_unregisters_its_page_locked_memory():
    from trainguard.torch.staging import Staging, _address

    cudart = torch.cuda.cudart()
    staging = Staging([torch.randn(1 << 16, device="cuda")])
    view = staging._view  # kept alive past close: the address stays mapped
    address = _address(view)
    assert staging._pinned
    # registered: a second registration of the same range is refused (cudaErrorHostMemoryAlreadyRegistered)
    assert int(cudart.cudaHostRegister(address, staging.size, 0)) != 0
    staging.close()
    # unregistered by close: unregistering again is refused (cudaErrorHostMemoryNotRegistered)
    assert int(cudart.cudaHostUnregister(address)) != 0


# -- RNG: the CUDA generator restores bit-exactly ------------------------------------------------


@needs_cuda
def test_cuda_rng_state_restores_bit_exactly():
    from trainguard.torch.state import rng_state, set_rng_state

    torch.cuda.manual_seed_all(1234)
    torch.rand(10, device="cuda")
    saved = rng_state()
    assert "cuda" in saved and len(saved["cuda"]) == torch.cuda.device_count()
    first = torch.rand(1000, device="cuda")
    torch.rand(12345, device="cuda")  # move on
    set_rng_state(saved)
    assert torch.equal(torch.rand(1000, device="cuda"), first)


# -- NVML: readings in physical ranges, equal to nvidia-smi's --------------------------------------


NVML_SOURCES = [
    Path(__file__).resolve().parent.parent / "src" / "trainguard" / "telemetry" / name
    for name in ("nvml.py", "gpm.py")
]
# Calls made only in a case the GPU at hand may not have, each with the reading that tells.
NVML_CONDITIONAL = {
    "nvmlDeviceGetCurrentClocksThrottleReasons": "the fallback when the ClocksEvent call is unsupported",
    "nvmlDeviceGetNvLinkErrorCounter": "GPUs with NVLink (nvlink_total > 0)",
    "nvmlDeviceGetFieldValues": "NVLink totals, HBM temperature, recovery action",
    "nvmlGpmMetricsGet": "GPM (Hopper and newer)",
    "nvmlGpmSampleFree": "GPM (Hopper and newer)",
    "nvmlGpmSampleAlloc": "GPM (Hopper and newer)",
    "nvmlGpmSampleGet": "GPM (Hopper and newer)",
}
# Calls that must answer on any data-centre GPU (H100/H200): the rest may be unsupported there
# (fan, encoder, retired pages before Ampere...) and then read None, by design.
NVML_MUST_ANSWER = {
    "nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName",
    "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetTotalEnergyConsumption", "nvmlShutdown",
}  # fmt: skip


def nvml_calls_in_source() -> set[str]:
    """Every NVML name the backend uses (functions, and constants such as ``nvmlMemory_v2``) (``"nvmlX"`` strings, ``pynvml.nvmlX``, ``nv.nvmlX``)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in NVML_SOURCES)
    return set(re.findall(r"""["'](nvml[A-Z]\w+)["']""", text)) | set(
        re.findall(r"\b(?:pynvml|nv)\.(nvml[A-Z]\w+)\(", text)
    )


class RecordingNvml:
    """pynvml, with every ``nvml*`` call recorded with its outcome ("ok" or the error class)."""

    def __init__(self, real):
        self._real, self.calls = real, []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not (name.startswith("nvml") and callable(attr)):
            return attr

        def call(*args, **kwargs):
            try:
                out = attr(*args, **kwargs)
            except Exception as exc:
                self.calls.append((name, type(exc).__name__))
                raise
            self.calls.append((name, "ok"))
            return out

        return call


def test_nvml_calls_from_source_are_found():
    """The source scan the next test relies on sees the backend's calls (CPU-runnable)."""
    found = nvml_calls_in_source()
    assert found >= NVML_MUST_ANSWER and set(NVML_CONDITIONAL) <= found, (
        NVML_MUST_ANSWER | set(NVML_CONDITIONAL)
    ) - found


def audit_nvml_calls(monkeypatch, load=lambda: None) -> list[str]:
    """Open the NVML backend with every pynvml call recorded, read twice (``load`` runs between
    the reads), ask modes, processes and the driver; the problems found (none: all is well).
    ``tests/test_gpu_paths_selftest.py`` feeds it the hand-written NVML fake, right and wrong."""
    import trainguard.telemetry.nvml as nvml_module
    from trainguard.errors import BackendError
    from trainguard.telemetry.nvml import NVML_ERROR_MAP

    if nvml_module.pynvml is None:
        if torch.cuda.is_available():
            pytest.fail("nvidia-ml-py is not importable here (the GPU image has it)")
        pytest.skip("nvidia-ml-py is not installed")
    real = nvml_module.pynvml
    recorder = RecordingNvml(real)
    monkeypatch.setattr(nvml_module, "pynvml", recorder)
    with _nvml() as backend:
        first = backend.sample()
        load()
        second = backend.sample()
        for k in range(len(backend.gpus())):
            backend.modes(k)
            try:
                backend.processes(k)
            except Exception as exc:  # a problem, named below
                recorder.calls.append(("processes", f"processes of GPU {k}: {exc}"))
        try:
            backend.driver_info()
        except Exception as exc:
            recorder.calls.append(("processes", f"driver_info: {exc}"))
        field_errors = backend.field_errors
    problems = []
    made = {name for name, _ in recorder.calls}
    # An older nvidia-ml-py may lack a newer call (the backend then reads None): only the calls
    # every GPU answers must exist; the rest are checked where the library has them.
    absent = sorted(n for n in nvml_calls_in_source() if not hasattr(real, n))
    if set(absent) & NVML_MUST_ANSWER:
        problems.append(f"this nvidia-ml-py lacks {absent}")
    wanted = {n for n in nvml_calls_in_source() if callable(getattr(real, n, None))}  # not nvmlMemory_v2
    unmade = sorted(wanted - made - set(NVML_CONDITIONAL))
    if unmade:
        problems.append(f"NVML calls of telemetry/nvml.py never made: {unmade}")
    silent = sorted(NVML_MUST_ANSWER - {n for n, o in recorder.calls if o == "ok"})
    if silent:
        problems.append(f"calls every data-centre GPU answers never succeeded: {silent}")
    # A failure other than "not supported" (or NvLink link probing past the last link) is a bug
    # in how we call NVML: the backend counts them in field_errors.
    if field_errors:
        problems.append(f"{field_errors} field errors: {sorted({c for c in recorder.calls if c[1] != 'ok'})}")
    problems += [
        f"GPU {s.gpu.index}: lost or failed: {s.error}" for s in (*first, *second) if s.lost or s.error
    ]
    if (
        any(s.nvlink_total for s in second)
        and not {"nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetFieldValues"} & made
    ):
        problems.append("NVLink links but no NVLink error counter read")
    for name, outcome in sorted(set(recorder.calls)):  # every error one NVML_ERROR_MAP names
        if outcome == "ok":
            continue
        mapped = NVML_ERROR_MAP.get(outcome)
        if name == "processes":
            problems.append(outcome)
        elif mapped is None:  # not an NVML error (a TypeError...): a wrong call of ours
            problems.append(f"{name} raised {outcome}")
        elif mapped is BackendError and name != "nvmlDeviceGetNvLinkState":
            problems.append(f"{name} failed: {outcome}")
    return problems


def _busy() -> None:
    if torch.cuda.is_available():
        x = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    time.sleep(0.3)


def test_every_nvml_call_of_the_backend_is_made_and_answers(monkeypatch):
    assert audit_nvml_calls(monkeypatch, _busy) == []


def test_nvml_readings_are_physical_and_agree_with_nvidia_smi():
    smi = _smi()
    from trainguard.telemetry.smi_xml import parse_smi_xml

    with _nvml() as backend:
        ours = {s.gpu.uuid: s for s in backend.sample()}
    theirs = {
        s.gpu.uuid: s
        for s in parse_smi_xml(
            subprocess.run([smi, "-q", "-x"], capture_output=True, text=True, check=True).stdout
        )
    }
    assert ours and set(ours) == set(theirs)
    for uuid, s in ours.items():
        t = theirs[uuid]
        assert s.gpu.pci == t.gpu.pci and s.gpu.index == t.gpu.index, uuid
        assert not s.lost and s.error is None
        assert 5 <= s.temperature_c <= 100 and abs(s.temperature_c - t.temperature_c) <= 5
        assert 10 <= s.power_w <= 1500 and 50 <= s.power_limit_w <= 1500
        assert s.mem_total_mib == t.mem_total_mib and 0 <= s.mem_used_mib <= s.mem_total_mib
        assert 0 < s.sm_clock_mhz <= s.sm_clock_max_mhz <= 4000
        assert 0 <= s.util_gpu_pct <= 100
        assert s.ecc_dbe_volatile is None or s.ecc_dbe_volatile >= 0
        assert s.pcie_gen is None or 1 <= s.pcie_gen <= (s.pcie_gen_max or 6)
        # settings and cumulative counters do not move between the two reads: equal
        assert s.gpu.name == t.gpu.name, uuid
        for field in (
            "temp_slowdown_c", "temp_shutdown_c", "sm_clock_max_mhz", "mem_clock_max_mhz",
            "ecc_sbe_aggregate", "ecc_dbe_aggregate", "remap_correctable", "remap_uncorrectable",
            "remap_pending", "remap_failure",
        ):  # fmt: skip
            ours_value, smi_value = getattr(s, field), getattr(t, field)
            assert ours_value is not None, f"NVML gave no {field} on {s.gpu.name}"
            assert smi_value is None or ours_value == smi_value, (field, ours_value, smi_value)
        assert t.power_limit_w is None or abs(s.power_limit_w - t.power_limit_w) <= 1.0
        assert s.temp_slowdown_c < s.temp_shutdown_c <= 150
        assert s.mem_free_mib is not None and 0 < s.mem_free_mib <= s.mem_total_mib
        assert s.energy_mj is not None and s.energy_mj > 0
        assert s.throttle is not None  # a set (maybe empty), never unknown on a supported GPU


@needs_cuda
def test_gpm_activity_is_read_on_hopper_and_shows_a_busy_gpu():
    with _nvml() as backend:
        names = [g.name or "" for g in backend.gpus()]
        if not any(re.search(r"H100|H200|H800|H20|GH200|B100|B200|GB200", n) for n in names):
            pytest.skip(f"hardware: GPM needs Hopper or newer: {names}")
        backend.sample()  # the first GPM read only takes a sample
        x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            for _ in range(10):
                x = (x @ x).clamp_(-1, 1)
            torch.cuda.synchronize()
        here = f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"
        [busy] = [x for x in backend.sample() if x.gpu.uuid == here]  # CUDA's order may not be NVML's
    assert busy.gr_engine_active is not None, "GPM unsupported on a Hopper GPU"
    assert 0.2 <= busy.gr_engine_active <= 1.0, busy.gr_engine_active
    assert busy.tensor_active is not None and 0.0 < busy.tensor_active <= 1.0
    assert busy.dram_active is not None and 0.0 <= busy.dram_active <= 1.0


@needs_cuda
def test_nvml_lists_a_cuda_process_with_the_memory_it_holds():
    code = (
        "import torch, time; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda');"
        " torch.cuda.synchronize(); print('GPU-' + str(torch.cuda.get_device_properties(0).uuid), flush=True);"
        " time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        uuid = child.stdout.readline().strip()
        assert uuid.startswith("GPU-"), uuid
        with _nvml() as backend:
            gpus = backend.gpus()
            procs = [p for g in gpus for p in backend.processes(g.index)]
    finally:
        child.kill()
        child.wait()
    ours = [p for p in procs if p.pid == child.pid]
    # In a container without the host's pid namespace NVML reports host pids: then the process
    # holding our 1 GiB is found by its memory (no other process of this check holds that much).
    holding = ours or [p for p in procs if p.used_mib is not None and p.used_mib >= 1024]
    assert holding, f"NVML lists no process holding the child's 1 GiB: {procs}"
    assert holding[0].used_mib is None or holding[0].used_mib >= 1024
    assert next(g.uuid for g in gpus if g.index == holding[0].gpu) == uuid  # listed on its own GPU


def test_nvml_modes_and_driver_agree_with_nvidia_smi():
    import xml.etree.ElementTree as ET

    smi = _smi()
    root = ET.fromstring(subprocess.run([smi, "-q", "-x"], capture_output=True, text=True, check=True).stdout)
    with _nvml() as backend:
        driver = backend.driver_info()
        modes = [backend.modes(k) for k in range(len(backend.gpus()))]
    assert driver.driver == root.findtext("driver_version")
    assert driver.cuda == root.findtext("cuda_version")
    assert driver.nvml and driver.nvml.split(".")[0].isdigit()

    def flag(text: str | None) -> bool | None:
        return {"Enabled": True, "Disabled": False}.get((text or "").strip())

    gpus = root.findall("gpu")
    assert len(gpus) == len(modes)
    for g, m in zip(gpus, modes, strict=True):
        assert m.persistence == flag(g.findtext("persistence_mode"))
        assert m.ecc == flag(g.findtext("ecc_mode/current_ecc"))
        assert m.ecc_pending == flag(g.findtext("ecc_mode/pending_ecc"))
        assert m.mig in (flag(g.findtext("mig_mode/current_mig")), None)


# -- hangs on NCCL: torch's flight recorder, asked through its pipe, read with torch's reader -----

_NCCL_RANK = """
import os, sys, time, torch, torch.distributed as dist
from trainguard.supervisor.hang import flight_recorder_env
from trainguard.torch.guard import Guard
from pathlib import Path
os.environ.update(flight_recorder_env(Path(sys.argv[1])))  # what the supervisor gives a rank
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
from trainguard.torch.watchdog import flight_recorder_trace
trace = flight_recorder_trace()
with Guard(None, None, run_dir=sys.argv[1], watchdog=False) as guard:
    print("serving" if guard._dumps is not None else "nccl-serves", len(trace or b""), flush=True)
    time.sleep(60)  # "hung": the parent asks for a dump meanwhile
"""


@needs_cuda
def test_an_nccl_rank_answers_a_flight_recorder_dump_request_readable_by_torchs_loader(tmp_path):
    from trainguard.rundir import dumps_dir
    from trainguard.supervisor.hang import FR_PREFIX, request_flight_dumps
    from trainguard.torch.flight_recorder import load_dumps

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dumps_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _NCCL_RANK, str(tmp_path), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert line and line[0] == "nccl-serves", (line, child.stderr.read() if not line else "")
        assert int(line[1]) > 0  # the in-process trace (the Guard's watchdog writes it on a hang)
        pipe = dumps_dir(tmp_path) / f"{FR_PREFIX}0.pipe"
        until = time.monotonic() + 30  # NCCL's monitor thread makes the pipe when it starts
        while not pipe.exists() and time.monotonic() < until and child.poll() is None:
            time.sleep(0.1)
        assert pipe.exists(), f"NCCL made no debug-info pipe: {sorted(os.listdir(dumps_dir(tmp_path)))}"
        got = request_flight_dumps(str(dumps_dir(tmp_path) / FR_PREFIX), [0], wait_s=20.0)
    finally:
        child.kill()
        child.wait()
    assert 0 in got, f"NCCL wrote no dump into {sorted(p.name for p in dumps_dir(tmp_path).iterdir())}"
    [dump] = load_dumps(dumps_dir(tmp_path), prefix=FR_PREFIX)
    ops = [e.get("profiling_name", "") for e in dump.entries]
    assert sum(op.endswith(("all_reduce", "allreduce")) for op in ops) >= 5, (
        ops
    )  # the five all-reduces, in torch's own format


# -- exclusion: a GPU left out is really not used -------------------------------------------------


_WHICH_GPU = """
import json, os, sys, torch
json.dump({"uuid": "GPU-" + str(torch.cuda.get_device_properties(0).uuid), "count": torch.cuda.device_count(),
           **{k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TRAINGUARD_GPU")}},
          open(sys.argv[1], "w"))
"""


@needs_cuda
def test_a_supervised_rank_runs_on_the_gpu_nvml_names(tmp_path):
    """`trainguard run --gpu-ids G`: the rank's torch sees exactly NVML's GPU G (the last one, which
    CUDA's default fastest-first order may number otherwise)."""
    with _nvml() as backend:
        uuids = [g.uuid for g in backend.gpus()]
    last = len(uuids) - 1
    worker, out = tmp_path / "which_gpu.py", tmp_path / "which.json"
    worker.write_text(_WHICH_GPU)
    argv = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "1"]
    argv += ["--gpu-ids", str(last), "--job-id", "which-gpu", "--runs-dir", str(tmp_path / "runs")]
    argv += ["--db", str(tmp_path / "incidents.db"), "--backend", "nvml", "--no-tee", "--no-warm-standby"]
    done = subprocess.run(
        [*argv, "--", sys.executable, str(worker), str(out)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and seen["CUDA_VISIBLE_DEVICES"] == str(last)
    assert seen["TRAINGUARD_GPU"] == str(last) and seen["count"] == 1
    assert seen["uuid"] == uuids[last]


def test_an_excluded_gpu_is_not_used_by_the_restarted_ranks():
    """The supervisor's worker environment, applied to a real process: the UUIDs torch sees are
    exactly NVML's for the GPUs kept, in NVML's order (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    from trainguard.supervisor.health import GpuMap

    with _nvml() as backend:
        uuids = [g.uuid for g in backend.gpus()]
    if len(uuids) < 2:
        pytest.skip(f"hardware: needs two GPUs to exclude one (this machine has {len(uuids)})")
    gpus = GpuMap(tuple(range(len(uuids)))).without(0)
    probe = (
        "import json, torch; print(json.dumps(['GPU-' + str(torch.cuda.get_device_properties(i).uuid)"
        " for i in range(torch.cuda.device_count())]))"
    )
    env = {**os.environ, **gpus.cuda_env()}
    seen = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert seen == [uuids[g] for g in gpus.gpus]
    assert uuids[0] not in seen


# -- diagnostics on the GPU: figures against the datasheet, the NCCL pair test ------------------


@needs_cuda
def test_diagnostics_on_a_cuda_gpu_measure_the_datasheets_figures():
    from trainguard.diagnose import budget_for, open_target, run_diagnostics
    from trainguard.diagnose.expected import spec_for

    tf32_before = torch.backends.cuda.matmul.allow_tf32
    target = open_target("cuda")
    # _open_cuda maps NVML's indices to torch's by UUID: each device is the GPU its index names
    if target.telemetry is not None:
        uuids = [g.uuid for g in target.telemetry.gpus()]
        for dev in target.devices:
            t = int(dev.torch_device.split(":")[1])
            assert f"GPU-{torch.cuda.get_device_properties(t).uuid}" == uuids[dev.index], dev
    else:
        pytest.fail("no NVML telemetry for the diagnostics on a GPU machine")
    budget = budget_for(2, "cuda", compute_s=2.0, stress_s=5.0, pattern_max_bytes=2**30)
    try:
        report = run_diagnostics(target, 2, budget=budget)
    finally:
        target.close()
    assert report.verdict.value == "pass", report.summary()
    node = {t.name: t for t in report.node}
    assert node["nccl"].verdict.value == "pass" and node["nccl"].value  # torch's NCCL version
    assert torch.backends.cuda.matmul.allow_tf32 == tf32_before  # the TF32 switch restored
    for g in report.gpus:
        for name in ("sdc", "memory_pattern", "thermal_power"):  # ran on the GPU, not skipped
            t = g.test(name)
            assert t is not None and t.verdict.value == "pass", (g.index, name, t)
        compute, memory = g.test("compute"), g.test("memory_bandwidth")
        assert compute is not None and memory is not None
        spec = spec_for(g.name)
        if spec is not None:  # a known model: compared with its datasheet, within physics
            assert compute.expected and 0 < compute.value <= 1.05 * max(spec.tflops.values())
            assert spec.hbm_gbps and 0 < memory.value <= 1.05 * spec.hbm_gbps


def _pair_link_gbps(a: int, b: int) -> float:
    """GB/s per direction NVML says GPUs ``a`` and ``b`` (NVML indices) can move between them
    (`diagnose.expected.link_gbps`): the NVLinks of each that reach the other or an NVSwitch, else
    each one's PCIe link at its maximum generation and width; the slower side counts."""
    from trainguard.diagnose.expected import link_gbps

    nv = _nvml_module()
    nv.nvmlInit()
    try:
        handles = {k: nv.nvmlDeviceGetHandleByIndex(k) for k in (a, b)}
        bus = {k: _text(nv.nvmlDeviceGetPciInfo(h).busId).lower() for k, h in handles.items()}
        sides = []
        for me, peer in ((a, b), (b, a)):
            h, links, version = handles[me], 0, None
            for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if nv.nvmlDeviceGetNvLinkState(h, link) != 1:
                        continue
                    remote = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).lower()
                    kind = nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
                except nv.NVMLError:  # past the GPU's last link, or no NVLink at all
                    continue
                if remote == bus[peer] or kind == getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
                    links += 1
                    version = nv.nvmlDeviceGetNvLinkVersion(h, link)
            gen, width = nv.nvmlDeviceGetMaxPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h)
            got = link_gbps(gen, width, links, version)
            assert got is not None, (
                f"GPU {me}: NVML gives no link to judge by (PCIe gen {gen} x{width}, NVLink {version})"
            )
            sides.append(got)
        return min(sides)
    finally:
        nv.nvmlShutdown()


def _nvml_module():
    from trainguard.telemetry import nvml

    if nvml.pynvml is None:
        pytest.fail("torch sees a GPU but nvidia-ml-py is not installed")
    return nvml.pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@needs_cuda
def test_the_nccl_pair_test_reaches_a_share_of_the_link_nvml_reports():
    """The floor follows the hardware: LINK_FLOOR (a quarter) of the NVLink or PCIe bandwidth NVML
    reports for the pair, so a link down or P2P falling back through the host fails."""
    if torch.cuda.device_count() < 2:
        pytest.skip("hardware: the NCCL pair test needs two GPUs")
    from trainguard.diagnose import open_target
    from trainguard.diagnose.expected import LINK_FLOOR
    from trainguard.diagnose.interconnect import measure_interconnect

    link = _pair_link_gbps(0, 1)
    target = open_target("cuda", gpus=[0, 1])
    try:
        best, ring = measure_interconnect(target.devices, 64 << 20, 5, 60.0)
    finally:
        target.close()
    floor = LINK_FLOOR * link
    assert all(bw >= floor for bw in best.values()) and ring >= floor, (best, ring, link, floor)
