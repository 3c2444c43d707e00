"""One prepared check of every GPU-only path, for the few minutes a real NVIDIA GPU is at hand.

    make gpu-check                      # OUT=DIR (default gpu-check-out/); GPU_CHECK_DRY=1 forces dry
    python tools/gpu_check.py --out DIR [--dry] [--stages pytest,diagnose] [--budget-s 480]

It reaches no network: it runs with the interpreter at hand (`PYTHONPATH=src` is enough; the
`trainguard` package need not be installed). What the GPU machine's image lacks (pytest, aiohttp,
isal: see `NEEDED`) travels as wheels: `make gpu-check-wheels` downloads them here into
``build/gpu-wheels`` (CPython 3.12, manylinux x86_64), which is carried to the GPU machine with the
checkout; this script unpacks them into its temporary folder and puts that first on the
``PYTHONPATH`` of everything it runs (nothing is installed into the interpreter). A stage whose
module is still missing fails, naming the module and that command. Each stage runs one thing a user
would run, with its own time limit, writes its log to ``OUT/logs/<stage>.log`` and gets a verdict
in ``OUT/report.json``:

    env        torch, CUDA, driver, GPUs (nvidia-smi -q -x parsed by trainguard's smi_xml)
    pytest     `pytest -m gpu` over every test file that carries the marker
    check      `trainguard check --backend nvml --json`
    monitor    `trainguard monitor --backend nvml --json` for a few intervals
    diagnose   `trainguard diagnose --backend cuda --level 2 --json`, figures against the datasheet
    train      `trainguard run` of examples/train_digits.py: a fault-free reference, then a chaos NaN
               (rollback), a kill (exact resume: 0 differing weights against the reference) and a
               hang (stacks dumped, the rank named; flight-recorder dumps and their judgement kept)
    agent      `trainguard agent --backend nvml` scraped once: every DCGM_FI_* series has a value
    bench      bench_checkpoint and bench_guard_overhead on the GPU (--device cuda)

Without an NVIDIA GPU (or with ``--dry``) the same stages run on the CPU and the simulated node
(`--backend sim`, gloo) at smaller sizes, so the script cannot rot between runs on a GPU: ``make
test-all`` runs it that way, ``make test`` its ``--quick`` cut (the reference run and the kill
drill, no bench). A GPU is here when its device files (``/dev/nvidia0``...), the driver's
``/proc/driver/nvidia/gpus`` or ``nvidia-smi -L`` say so; then the check runs in GPU mode even when
CUDA torch or NVML cannot use the GPU, and fails at ``env`` naming why (never a quiet dry run).

Result (``report.json`` ``result``, and the exit code): ``pass`` (0) when every stage passed;
``partial`` (2) in GPU mode when every stage that ran passed but the machine lacked hardware for
some paths (one GPU: the 2-GPU runs and the NCCL pair test; GPM before Hopper), each listed;
``fail`` (1) otherwise. In GPU mode the benchmarks' targets are judged (a miss fails ``bench``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
if str(SRC) not in sys.path:  # runs from a checkout, installed or not
    sys.path.insert(0, str(SRC))


WHEELS = ROOT / "build" / "gpu-wheels"  # `make gpu-check-wheels`

# import name -> (pip requirement, the stages that cannot run without it). The GPU machine's image
# has torch, nvidia-ml-py, prometheus-client, rich, matplotlib, scikit-learn (and numpy); the rest
# comes from the wheelhouse. Keep the requirements in step with the Makefile's gpu-check-wheels.
NEEDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("torch>=2.4", ("env", "pytest", "diagnose", "train", "bench")),
    "pynvml": ("nvidia-ml-py>=12.535", ("check", "monitor", "agent")),
    "numpy": ("numpy>=1.24", ("train", "bench")),
    "sklearn": ("scikit-learn>=1.3", ("train",)),
    "prometheus_client": ("prometheus-client>=0.19", ("agent",)),
    "rich": ("rich>=13", ()),
    "pytest": ("pytest>=8", ("pytest",)),
    "pytest_timeout": ("pytest-timeout>=2.2", ()),  # pyproject's `timeout`; without it a warning only
    "aiohttp": ("aiohttp>=3.10", ("agent",)),
    "isal": ("isal>=1.6", ()),  # faster checkpoint checksums; zlib's otherwise
}
WHEELHOUSE = {"pytest", "pytest_timeout", "aiohttp", "isal"}  # what `make gpu-check-wheels` brings


@dataclass
class Stage:
    name: str
    verdict: str = "skip"  # pass | fail | skip | partial (passed; some paths lacked hardware)
    reason: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


class Check:
    """The run: where logs go, which mode, how long each command may take."""

    def __init__(self, out: Path, dry: bool, budget_s: float, quick: bool = False) -> None:
        self.out, self.dry, self.budget_s, self.quick = out, dry, budget_s, quick
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="tg-gpu-check-"))
        self.started = time.monotonic()
        self.env = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1"}
        self.env.pop("TRAINGUARD_RUN_DIR", None)
        self.backend = "sim" if dry else "nvml"
        self.gpus = 0
        self.missing = _missing_modules(self.env)  # import name -> why
        self.unpacked: list[str] = []
        if self.missing:  # only then: the wheels never shadow what the interpreter has
            site = self.work / "site"
            self.unpacked = _unpack_wheels(WHEELS, site)
            if self.unpacked:
                self.env["PYTHONPATH"] = f"{site}{os.pathsep}{self.env['PYTHONPATH']}"
                sys.path.insert(0, str(site))  # for what this script imports itself
                self.missing = _missing_modules(self.env)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def run(
        self,
        stage: Stage,
        argv: list[str],
        timeout: float,
        env: dict[str, str] | None = None,
        log: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (a list, no shell) into the stage's log; a timeout is a result, not a crash."""
        timeout = max(5.0, min(timeout, self.left_s()))
        path = self.logs / f"{log or stage.name}.log"
        with open(path, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n")
            fh.flush()
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=fh,
                text=True,
                cwd=ROOT,
                env=env or self.env,
                start_new_session=True,
            )
            try:
                stdout, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                stdout, _ = proc.communicate()
                fh.write(f"\n[gpu_check] killed after {timeout:.0f} s\n")
                return subprocess.CompletedProcess(argv, 124, stdout, "")
            except BaseException:  # the check was stopped (SIGTERM, Ctrl-C): so is what it started
                _kill_group(proc)
                proc.wait()
                raise
            fh.write(stdout[-20000:])
            fh.write(f"\n[gpu_check] exit {proc.returncode}\n")
        return subprocess.CompletedProcess(argv, proc.returncode, stdout, "")

    def trainguard(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "trainguard.cli", *args]


def _pythonpath() -> str:
    rest = os.environ.get("PYTHONPATH", "")
    return f"{SRC}{os.pathsep}{rest}" if rest else str(SRC)


def _unpack_wheels(wheels: Path, site: Path) -> list[str]:
    """Unpack every wheel of ``wheels`` into ``site`` (a wheel is a zip of its import tree; the
    scripts it would install are not needed: everything runs as ``python -m``)."""
    import zipfile

    names = []
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for wheel in sorted(wheels.glob("*.whl")) if wheels.is_dir() else []:
        python_tag = wheel.name.split("-")[-3]  # name-version-python-abi-platform.whl
        if not (python_tag.startswith("py3") or here in python_tag.split(".")):
            continue  # built for another Python (the wheelhouse is for the GPU image's 3.12)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
        names.append(wheel.name)
    return names


def _missing_modules(env: dict[str, str]) -> dict[str, str]:
    """The modules of `NEEDED` the check's commands cannot import (as they will run: same
    interpreter, same PYTHONPATH), each with the import error."""
    probe = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        out[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *NEEDED], capture_output=True, text=True, env=env, cwd=ROOT
    )
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {name: f"the import probe failed: {done.stderr[-300:]}" for name in NEEDED}


def missing_for(stage: str, missing: dict[str, str]) -> str | None:
    """Why ``stage`` cannot run (a module it needs is missing), or None."""
    lacking = [m for m in missing if stage in NEEDED[m][1]]
    if not lacking:
        return None
    wanted = " ".join(repr(NEEDED[m][0]) for m in lacking)
    fix = (
        "run `make gpu-check-wheels` on a machine with network and carry build/gpu-wheels with the checkout"
        if all(m in WHEELHOUSE for m in lacking)
        else "the GPU image should have it"
    )
    return f"missing module(s) {', '.join(lacking)} ({missing[lacking[0]]}): {fix}, or pip install {wanted}"


def stop_on_sigterm() -> None:
    """SIGTERM (a CI job's timeout, ``kill``) ends the check as Ctrl-C does: through its ``finally``
    clauses, which stop the commands its stages started in their own sessions."""

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _json(text: str) -> Any:
    """The last JSON document a command printed (commands may log lines before it)."""
    text = text.strip()
    for start in [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]:
        try:
            return json.loads(text[start:])
        except ValueError:
            continue
    return None


# -- stages ------------------------------------------------------------------------------------


def stage_env(c: Check, s: Stage) -> None:
    import torch

    s.figures = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "mode": "dry (CPU and the simulated node)" if c.dry else "gpu",
        "interpreter": sys.executable,
        "wheels_unpacked": c.unpacked,
        "missing_modules": c.missing,
    }
    c.gpus = len(s.figures["gpus"])
    if c.dry:
        s.verdict = "pass"
        return
    s.figures["gpu_present"] = gpu_present()
    smi = shutil.which("nvidia-smi")
    if smi:
        done = c.run(s, [smi, "-q", "-x"], 60, log="nvidia-smi")
        from trainguard.telemetry.smi_xml import parse_smi_xml

        samples = parse_smi_xml(done.stdout, source="nvidia-smi -q -x")
        s.figures["smi_gpus"] = [{"name": x.gpu.name, "uuid": x.gpu.uuid, "pci": x.gpu.pci} for x in samples]
        driver = c.run(s, [smi, "--query-gpu=driver_version", "--format=csv,noheader"], 30, log="nvidia-smi")
        s.figures["driver"] = driver.stdout.strip().splitlines()[0] if driver.stdout.strip() else None
    s.figures["nvml"] = nvml_status()
    problems = unusable(s.figures)
    s.verdict = "fail" if problems else "pass"
    s.reason = "; ".join(problems) or f"{c.gpus} GPU(s): {', '.join(s.figures['gpus'])}"


def unusable(env: dict[str, Any]) -> list[str]:
    """Why a GPU that is here cannot be checked: torch built without CUDA or seeing no GPU, NVML
    not opening (``env`` holds stage_env's figures)."""
    here = ", ".join(env.get("gpu_present") or []) or "a GPU"
    problems = []
    if env.get("cuda") is None:
        problems.append(
            f"torch {env.get('torch')} is a CPU-only build while {here} is here: install a CUDA build of torch"
        )
    elif not env.get("gpus"):
        problems.append(
            f"torch {env.get('torch')} (CUDA {env.get('cuda')}) sees no GPU while {here} is here: "
            "a driver older than torch's CUDA, or CUDA_VISIBLE_DEVICES hides them"
        )
    if env.get("nvml") != "ok":
        problems.append(f"NVML cannot open the GPUs: {env.get('nvml')}")
    if problems:
        problems.append("give --dry to check without a GPU")
    return problems


def nvml_status() -> str:
    """``ok`` when trainguard's NVML backend opens every GPU, else why not."""
    try:
        from trainguard.errors import BackendUnavailable
        from trainguard.telemetry.nvml import NvmlBackend
    except ImportError as exc:  # no nvidia-ml-py
        return f"{type(exc).__name__}: {exc}"
    try:
        backend = NvmlBackend()
    except BackendUnavailable as exc:
        return str(exc)
    try:
        return "ok" if backend.gpus() else "NVML lists no GPU"
    finally:
        backend.close()


def stage_pytest(c: Check, s: Stage) -> None:
    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").glob("test_*.py")
        if "mark.gpu" in p.read_text(encoding="utf-8")
    )
    xml = c.logs / "pytest-gpu.xml"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        "-rs",
        f"--junitxml={xml}",
        *files,
    ]
    done = c.run(s, argv, 300)
    counts, skips = _junit_counts(xml), _junit_skips(xml)
    s.figures = {"files": files, **counts, "skips": skips}
    s.verdict, s.reason = pytest_verdict(done.returncode, counts, skips, c.dry)


def pytest_verdict(exit_code: int, counts: dict[str, int], skips: list[str], dry: bool) -> tuple[str, str]:
    """The pytest stage's verdict and reason from pytest's exit code and JUnit counts and skips."""
    if exit_code not in (0, 5) or counts["failures"] or counts["errors"]:
        return "fail", f"pytest exit {exit_code}: {counts}"
    if dry:  # without a GPU the gpu tests skip (those that need none run): they import and collect
        verdict = "pass" if counts["tests"] > 0 else "fail"
        return verdict, f"{counts['tests']} gpu tests collected, {counts['skipped']} skipped without a GPU"
    # On a GPU a skip is a path left unchecked: only the hardware this machine lacks (a second
    # GPU, GPM before Hopper) may skip, and the gpu tests say so ("hardware: ..."); the check is
    # then partial, not passed.
    unexpected = [m for m in skips if not m.startswith("hardware:")]
    ran = counts["tests"] - counts["skipped"]
    reason = f"{ran} passed, {counts['skipped']} skipped"
    if ran <= 0 or unexpected:
        return "fail", reason + (f"; skipped on a GPU machine: {unexpected}" if unexpected else "")
    if skips:
        return "partial", reason + f" for lack of hardware: {skips}"
    return "pass", reason


def _junit_counts(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    try:
        for suite in ET.parse(path).getroot().iter("testsuite"):
            for k in counts:
                counts[k] += int(suite.get(k, "0"))
    except (OSError, ET.ParseError):
        pass
    return counts


def _junit_skips(path: Path) -> list[str]:
    """The reason of every skipped test in pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return []
    return [(el.get("message") or "").strip() for el in root.iter("skipped")]


def stage_check(c: Check, s: Stage) -> None:
    done = c.run(s, c.trainguard("check", "--backend", c.backend, "--json"), 60)
    doc = _json(done.stdout)
    if not isinstance(doc, dict):
        s.verdict, s.reason = "fail", f"exit {done.returncode}, no JSON verdict"
        return
    s.figures = {
        "exit_code": done.returncode,
        "verdict": doc.get("verdict"),
        "gpus": len(doc.get("gpus", [])),
    }
    # A healthy node is ok (0); degraded (1) is reported, not failed: a lent GPU may run warm.
    s.verdict = "pass" if done.returncode in (0, 1) and s.figures["gpus"] > 0 else "fail"
    s.reason = f"verdict {doc.get('verdict')} over {s.figures['gpus']} GPU(s)"


def stage_monitor(c: Check, s: Stage) -> None:
    argv = c.trainguard("monitor", "--backend", c.backend, "--json", "--interval", "0.5")
    done = c.run(s, argv, 6)  # stopped by the time limit: it runs until interrupted
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    gpus = {x.get("index", x.get("gpu")) for x in lines}
    s.figures = {"lines": len(lines), "gpus": len(gpus)}
    s.verdict = "pass" if len(lines) >= 2 * max(1, len(gpus)) else "fail"
    s.reason = f"{len(lines)} readings of {len(gpus)} GPU(s) in a few seconds"


def stage_diagnose(c: Check, s: Stage) -> None:
    backend = "sim" if c.dry else "cuda"
    argv = c.trainguard("diagnose", "--backend", backend, "--level", "2", "--json")
    if c.dry:
        argv += ["--gpu-ids", "0,1"]
    done = c.run(s, argv, 240)
    doc = _json(done.stdout)
    if not isinstance(doc, dict):
        s.verdict, s.reason = "fail", f"exit {done.returncode}, no JSON report"
        return
    from trainguard.diagnose.expected import spec_for

    figures: dict[str, Any] = {"verdict": doc["verdict"], "summary": doc["summary"], "gpus": []}
    for g in doc.get("gpus", []):
        spec = spec_for(g["name"]) if not c.dry else None
        row: dict[str, Any] = {"index": g["index"], "name": g["name"], "verdict": g["verdict"]}
        for t in g["tests"]:
            if t["unit"] in ("TFLOPS", "GB/s") and isinstance(t["value"], int | float):
                row[t["name"]] = {"value": t["value"], "unit": t["unit"], "expected": t["expected"]}
        if spec is not None:
            row["datasheet"] = {"tflops": spec.tflops, "hbm_gbps": spec.hbm_gbps}
        figures["gpus"].append(row)
    s.figures = figures
    s.verdict = "pass" if doc["verdict"] == "pass" else "fail"
    s.reason = doc["summary"]


def stage_train(c: Check, s: Stage) -> None:
    """A fault-free reference, then NaN, kill and hang drills, each its own `trainguard run`."""
    # One rank per GPU (NCCL refuses two ranks on one device); dry mode runs one rank too, as on
    # a one-GPU machine, and small, since `make test` runs it on two cores.
    steps, every = (120, 20) if not c.dry else (40, 10)
    nproc = c.gpus if c.gpus >= 2 else 1
    runs: dict[str, Any] = {}
    reference = _train_run(c, s, "reference", None, steps, every, nproc)
    runs["reference"] = reference
    if reference.get("exit_code") != 0:
        s.verdict, s.reason, s.figures = "fail", "the fault-free run failed", runs
        return
    drills = {
        "nan": {"kind": "nan", "rank": 0, "step": steps // 2 + 3},
        "kill": {"kind": "kill", "rank": nproc - 1, "step": steps // 2 + 5},
        "hang": {"kind": "hang", "rank": nproc - 1, "step": steps // 3},
    }
    if c.quick:  # `make test`'s cut: the kill drill reaches every part of the stage's plumbing
        drills = {"kill": drills["kill"]}
        runs["quick"] = "the NaN and hang drills run in the full check (make test-all)"
    problems = []
    for name, fault in drills.items():
        got = runs[name] = _train_run(c, s, name, fault, steps, every, nproc)
        # On a GPU the ranks run NCCL, whose monitor thread answers the supervisor's dump
        # request by itself: a hang must leave its flight-recorder dump (gloo's is best effort).
        problems += [f"{name}: {p}" for p in _judge_drill(name, got, reference, nproc, flight=not c.dry)]
    one_gpu = c.gpus < 2 and not c.dry
    if one_gpu:
        runs["ddp"] = "hardware: one GPU (the 2-rank runs need two): not checked"
    s.figures = runs
    s.verdict = "fail" if problems else "partial" if one_gpu else "pass"
    done = {"nan": "NaN rolled back", "kill": "kill resumed", "hang": "hang named"}
    s.reason = "; ".join(problems) or (
        f"{nproc} rank(s): {', '.join(done[d] for d in drills)}; final weights bitwise the reference's"
    )


def _train_run(
    c: Check, s: Stage, name: str, fault: dict[str, Any] | None, steps: int, every: int, nproc: int
) -> dict[str, Any]:
    work = c.work / name
    work.mkdir(parents=True, exist_ok=True)
    argv = c.trainguard(
        "run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--job-id",
        name,
        "--runs-dir",
        str(work / "runs"),
        "--db",
        str(work / "incidents.db"),
        "--json",
        str(work / "result.json"),
        "--backend",
        c.backend,
        "--no-tee",
    )
    if c.dry:
        argv += ["--no-warm-standby"]  # spare interpreters cost a 2-core machine more than they save
    if fault is not None:
        plan = work / "plan.toml"
        plan.write_text("[[fault]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fault.items()))
        argv += ["--chaos", str(plan)]
    # The supervisor itself turns torch's flight recorder on, dumping into the run's dumps/ folder
    # (supervisor.hang.flight_recorder_env), and judges the dumps of a hang.
    env = {**c.env, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "1"}
    argv += [
        "--",
        sys.executable,
        "examples/train_digits.py",
        "--steps",
        str(steps),
        "--deterministic",
        "--step-delay",  # slow enough for the supervisor to see the step a kill waits for
        "0.1",
        "--checkpoint-dir",
        str(work / "ckpt"),
        "--checkpoint-every",
        str(every),
    ]
    done = c.run(s, argv, 240, env=env, log=f"train-{name}")
    try:
        result = json.loads((work / "result.json").read_text())
    except (OSError, ValueError):
        return {"exit_code": done.returncode, "error": "no run result"}
    out = {k: result.get(k) for k in ("exit_code", "status", "attempts", "final_step", "reason")}
    out["incidents"] = [
        {k: i.get(k) for k in ("rank", "gpu", "root_cause", "action", "detected_by", "summary")}
        for i in result.get("incidents", [])
    ]
    out["weights"] = _final_weights(work / "ckpt", steps)
    from trainguard.supervisor.hang import FR_PREFIX

    dumps = sorted(p.name for p in Path(result["run_dir"]).glob("dumps/*"))
    out["flight_recorder_dumps"] = [d for d in dumps if d.startswith(FR_PREFIX) or d.startswith("flight-")]
    out["stack_dumps"] = [d for d in dumps if d.endswith(".txt")]
    return out


def _final_weights(ckpt: Path, step: int) -> str | None:
    """A digest of the model weights in the checkpoint of ``step`` (None: none there)."""
    try:
        import hashlib

        import torch

        from trainguard.checkpoint.layout import step_dir_name
        from trainguard.checkpoint.verify import verify
        from trainguard.torch.writer import STATE_FILE

        step_dir = ckpt / step_dir_name(step)
        if not verify(step_dir).ok:
            return None
        model = torch.load(step_dir / STATE_FILE, map_location="cpu", weights_only=True)["model"]
        digest = hashlib.sha256()
        for key in sorted(model):
            digest.update(key.encode())
            digest.update(model[key].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()
    except Exception as exc:  # reported, the verdict then fails on the missing digest
        return f"unreadable: {type(exc).__name__}: {exc}"


def _judge_drill(
    name: str, got: dict[str, Any], reference: dict[str, Any], nproc: int, flight: bool = False
) -> list[str]:
    problems = []
    if got.get("exit_code") != 0:
        problems.append(f"exit {got.get('exit_code')} ({got.get('reason')})")
    # Every drill resumes (rollback, restart) from a checkpoint and replays: with deterministic
    # kernels its final weights are the fault-free run's, bit for bit.
    if got.get("weights") is None or got.get("weights") != reference.get("weights"):
        problems.append("the final weights differ from the fault-free run's")
    incidents = got.get("incidents") or []
    culprit = 0 if name == "nan" else nproc - 1
    if not incidents or incidents[0]["rank"] != culprit:
        problems.append(f"the first incident does not name rank {culprit}: {incidents[:1]}")
    if name == "nan" and not any(i["action"] == "rollback" for i in incidents):
        problems.append(f"no rollback incident: {incidents}")
    if name == "hang":
        if not any(i["detected_by"] == "heartbeat" for i in incidents[:1]):
            problems.append(f"the first incident is no hang: {incidents[:1]}")
        if not got.get("stack_dumps"):
            problems.append("no stack dump of the hung rank")
        if flight and not got.get("flight_recorder_dumps"):
            problems.append("no NCCL flight-recorder dump of the hang")
    return problems


def stage_agent(c: Check, s: Stage) -> None:
    port = _free_port()
    state = c.work / "agent-state"
    state.mkdir(mode=0o700, exist_ok=True)
    argv = c.trainguard(
        "agent",
        "--backend",
        c.backend,
        "--listen",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(state),
        "--db",
        str(c.work / "agent.db"),
        "--interval",
        "0.5",
    )
    log = open(c.logs / "agent.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=c.env, start_new_session=True
    )
    try:
        text = _scrape(f"http://127.0.0.1:{port}/metrics", state, proc, deadline=time.monotonic() + 60)
    finally:
        _kill_group(proc)
        proc.wait()
        log.close()
    if text is None:
        s.verdict, s.reason = "fail", "the agent never answered /metrics (see logs/agent.log)"
        return
    (c.logs / "metrics.txt").write_text(text)
    series: dict[str, int] = {}
    empty = []
    for line in text.splitlines():
        if line.startswith("DCGM_FI_"):
            name, _, value = line.rpartition(" ")
            metric = name.split("{")[0]
            series[metric] = series.get(metric, 0) + 1
            if value.lower() in ("nan", ""):
                empty.append(metric)
    s.figures = {"dcgm_series": series, "without_value": sorted(set(empty))}
    s.verdict = "pass" if series and not empty else "fail"
    s.reason = f"{len(series)} DCGM_FI_* metrics served" + (
        f"; no value: {sorted(set(empty))}" if empty else ""
    )


def _scrape(url: str, state: Path, proc: subprocess.Popen[Any], deadline: float) -> str | None:
    while time.monotonic() < deadline and proc.poll() is None:
        token = next((p.read_text().strip() for p in state.glob("*token*") if p.is_file()), "")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                text = response.read().decode()
            if "DCGM_FI_" in text:
                return text
        except OSError:
            pass
        time.sleep(0.5)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def benches(dry: bool) -> dict[str, list[str]]:
    """The benchmarks the bench stage runs: on the GPU at full size, dry at the smallest."""
    device = "cpu" if dry else "cuda"
    return {
        "checkpoint": [
            "benchmarks/bench_checkpoint.py",
            "--device",
            device,
            "--json",
            "--size-gb",
            "0.05" if dry else "2",
            "--rounds",
            "1" if dry else "3",
            "--loop-rounds",
            "0" if dry else "6",
        ],
        "guard": ["benchmarks/bench_guard_overhead.py", "--device", device, "--json", "--quick"],
    }


def stage_bench(c: Check, s: Stage) -> None:
    figures: dict[str, Any] = {}
    failed, missed = [], []
    for name, args in benches(c.dry).items():
        done = c.run(s, [sys.executable, *args], 180, log=f"bench-{name}")
        doc = _json(done.stdout)
        figures[name] = doc if isinstance(doc, dict) else {"exit_code": done.returncode}
        if not isinstance(doc, dict):
            failed.append(name)
        elif done.returncode != 0:  # benchmarks/targets.py: a target missed (its lines in the log)
            missed += [f"{name}: {line}" for line in _missed_targets(c.logs / f"bench-{name}.log")] or [
                f"{name}: exit {done.returncode}"
            ]
    s.figures = {**figures, "targets_missed": missed}
    s.verdict, s.reason = bench_verdict(failed, missed, c.dry)


def bench_verdict(failed: list[str], missed: list[str], dry: bool) -> tuple[str, str]:
    """No figures fail the stage; on a GPU so does a missed target. Dry, the figures come from tiny
    CPU runs that the targets (set for a GPU) do not apply to: reported, not judged."""
    if failed:
        return "fail", f"no figures from {failed}"
    if dry:
        note = f" ({len(missed)} target lines missed on the CPU, not judged)" if missed else ""
        return "pass", "figures measured on the CPU; targets are judged on a GPU only" + note
    if missed:
        return "fail", f"targets missed: {missed}"
    return "pass", "figures measured, every target met"


def _missed_targets(log: Path) -> list[str]:
    try:
        return [line.strip() for line in log.read_text().splitlines() if "MISSED" in line]
    except OSError:
        return []


STAGES: dict[str, Callable[[Check, Stage], None]] = {
    "env": stage_env,
    "pytest": stage_pytest,
    "check": stage_check,
    "monitor": stage_monitor,
    "diagnose": stage_diagnose,
    "train": stage_train,
    "agent": stage_agent,
    "bench": stage_bench,
}


DEV = Path("/dev")
PROC_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_present(dev: Path | None = None, proc_gpus: Path | None = None) -> list[str]:
    """What says an NVIDIA GPU is here, whatever torch and NVML make of it: its device files
    (``/dev/nvidia0``...), the driver's ``/proc/driver/nvidia/gpus/<bus id>``, or ``nvidia-smi
    -L`` listing a GPU or failing (a driver that does not answer). Empty: no GPU, a dry run."""
    dev, proc_gpus = dev or DEV, proc_gpus or PROC_GPUS
    signs = [str(p) for p in sorted(dev.glob("nvidia[0-9]*")) if p.name[len("nvidia") :].isdigit()]
    with contextlib.suppress(OSError):
        signs += [str(p) for p in sorted(proc_gpus.iterdir())]
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            signs.append(f"nvidia-smi -L: {type(exc).__name__}")
        else:
            listed = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
            if listed:
                signs.append(f"nvidia-smi -L: {len(listed)} GPU(s)")
            elif done.returncode != 0 and "No devices were found" not in done.stdout + done.stderr:
                signs.append(
                    f"nvidia-smi -L: exit {done.returncode} {(done.stdout + done.stderr).strip()[:120]}"
                )
    return signs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("gpu-check-out"))
    p.add_argument("--dry", action="store_true", help="CPU and the simulated node (automatic without a GPU)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="dry only: the train stage's reference and kill drill, no bench (make test)",
    )
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {','.join(STAGES)}")
    p.add_argument(
        "--budget-s", type=float, default=None, help="the whole check's time (default 480; dry: 900)"
    )
    args = p.parse_args(argv)
    stop_on_sigterm()
    unknown = [x for x in args.stages.split(",") if x not in STAGES]
    if unknown:
        p.error(f"unknown stage(s) {unknown}: choose from {', '.join(STAGES)}")
    dry = args.dry or os.environ.get("GPU_CHECK_DRY", "") not in ("", "0") or not gpu_present()
    if args.quick and not dry:
        p.error("--quick is the dry check's cut for `make test`: on a GPU every stage runs")
    check = Check(args.out, dry, args.budget_s or (900.0 if dry else 480.0), quick=args.quick)
    chosen = ["env", *[x for x in args.stages.split(",") if x != "env"]]
    if check.quick:
        chosen = [x for x in chosen if x != "bench"]
    left_out = [x for x in STAGES if x not in chosen]
    stages = []
    try:
        for name in chosen:
            stage = Stage(name)
            t0 = time.monotonic()
            lacking = missing_for(name, check.missing)
            if check.left_s() <= 5:  # a stage not run is a path not checked: not a pass
                stage.verdict = "fail"
                stage.reason = f"no time left in the {check.budget_s:.0f} s budget (--budget-s)"
            elif lacking is not None:  # loud: a GPU at hand must not pass with a stage left out
                stage.verdict, stage.reason = "fail", lacking
            else:
                try:
                    STAGES[name](check, stage)
                except Exception as exc:  # a broken stage is a failed stage, and the rest still run
                    stage.verdict, stage.reason = "fail", f"{type(exc).__name__}: {exc}"
            stage.seconds = round(time.monotonic() - t0, 1)
            stages.append(stage)
            print(f"{stage.name:9} {stage.verdict:5} {stage.seconds:6.1f} s  {stage.reason}", flush=True)
            if name == "env" and stage.verdict == "fail":
                break
    finally:
        shutil.rmtree(check.work, ignore_errors=True)
    result = overall([st.verdict for st in stages], dry, left_out)
    report = {
        "result": result,
        "ok": result == "pass",
        "mode": "dry" if dry else "gpu",
        "quick": check.quick,
        "not_run": left_out,
        "figures_from": "CPU and the simulated node: no GPU figure" if dry else "a real GPU",
        "interpreter": sys.executable,
        "wheels_unpacked": check.unpacked,
        "missing_modules": check.missing,
        "seconds": round(time.monotonic() - check.started, 1),
        "stages": [vars(st) for st in stages],
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    said = {"pass": "passed", "partial": "PARTIAL (paths unchecked for lack of hardware)", "fail": "FAILED"}
    left = f"; not run: {', '.join(left_out)}" if left_out else ""
    print(f"gpu check {said[result]} ({report['mode']} mode{left}): {args.out / 'report.json'}")
    return EXIT[result]


EXIT = {"pass": 0, "fail": 1, "partial": 2}


def overall(verdicts: list[str], dry: bool, left_out: list[str]) -> str:
    """pass | partial | fail. A failed stage fails the check. On a GPU, a stage that passed what
    the machine has (partial), one that did not apply (skip) or one not run leaves the check
    partial: a path left unchecked is not a pass. Dry, only failures count (no GPU path runs)."""
    if "fail" in verdicts or not verdicts:
        return "fail"
    if not dry and (left_out or any(v != "pass" for v in verdicts)):
        return "partial"
    return "pass"


if __name__ == "__main__":
    sys.exit(main())
