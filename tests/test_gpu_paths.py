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
import shutil
import subprocess
import sys

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
        pytest.skip(f"no NVML here: {exc}")


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
    with Guard(ckpt, state, run_dir=tmp_path, checkpoint_every=16, watchdog=False) as guard:
        for step in guard.range(0, 48):
            loss = state.model(torch.randn(32, 64, device="cuda")).pow(2).mean()
            if step == 21 and not fired:
                fired.append(step)
                loss = loss * math.nan
            loss.backward()
            if guard.step(step, loss) == "proceed":
                state.optimizer.step()
            state.optimizer.zero_grad()
        assert (guard.check_every, guard.check_lag) == (8, 1)  # the GPU default
    rules = [(s, f.rule) for _, s, f in read_findings(tmp_path)]
    assert (21, "numerics.nonfinite_loss") in rules  # the step and rank of the NaN, from the GPU
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


def test_nvml_readings_are_physical_and_agree_with_nvidia_smi():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("no nvidia-smi here")
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


def test_nvml_modes_and_driver_agree_with_nvidia_smi():
    import xml.etree.ElementTree as ET

    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("no nvidia-smi here")
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


# -- exclusion: a GPU left out is really not used -------------------------------------------------


def test_an_excluded_gpu_is_not_used_by_the_restarted_ranks():
    """The supervisor's worker environment, applied to a real process: the UUIDs torch sees are
    exactly NVML's for the GPUs kept, in NVML's order (CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    from trainguard.supervisor.health import GpuMap

    with _nvml() as backend:
        uuids = [g.uuid for g in backend.gpus()]
    if len(uuids) < 2:
        pytest.skip(f"needs two GPUs to exclude one (this machine has {len(uuids)})")
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


def test_the_worker_gpu_environment_orders_cuda_as_nvml_does():
    from trainguard.supervisor.health import GpuMap

    env = GpuMap((0, 2, 3)).without(2).cuda_env()
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,3"}


# -- diagnostics on the GPU: figures against the datasheet, the NCCL pair test ------------------


@needs_cuda
def test_diagnostics_on_a_cuda_gpu_measure_the_datasheets_figures():
    from trainguard.diagnose import budget_for, open_target, run_diagnostics
    from trainguard.diagnose.expected import spec_for

    target = open_target("cuda")
    budget = budget_for(2, "cuda", compute_s=2.0, stress_s=5.0, pattern_max_bytes=2**30)
    try:
        report = run_diagnostics(target, 2, budget=budget)
    finally:
        target.close()
    assert report.verdict.value == "pass", report.summary()
    for g in report.gpus:
        compute, memory = g.test("compute"), g.test("memory_bandwidth")
        assert compute is not None and memory is not None
        spec = spec_for(g.name)
        if spec is not None:  # a known model: compared with its datasheet, within physics
            assert compute.expected and 0 < compute.value <= 1.05 * max(spec.tflops.values())
            assert spec.hbm_gbps and 0 < memory.value <= 1.05 * spec.hbm_gbps


@needs_cuda
def test_the_nccl_pair_test_measures_a_bus_bandwidth():
    if torch.cuda.device_count() < 2:
        pytest.skip("the NCCL pair test needs two GPUs")
    from trainguard.diagnose import open_target
    from trainguard.diagnose.interconnect import measure_interconnect

    target = open_target("cuda", gpus=[0, 1])
    try:
        best, ring = measure_interconnect(target.devices, 64 << 20, 5, 60.0)
    finally:
        target.close()
    assert all(bw > 1.0 for bw in best.values()) and ring > 1.0  # GB/s: any real link does this
