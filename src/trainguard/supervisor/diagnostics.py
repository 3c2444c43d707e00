"""Active diagnostics in the supervisor: a pre-flight before each (re)start, level 2 after an
ambiguous incident (`trainguard.diagnose`).

Telemetry cannot see a GPU that computes wrong answers; a short SDC round can. Before the
workers start (and before each restart) the GPUs about to be used run level 1 and a few SDC
rounds; a GPU that fails is excluded like a GPU the node agent failed, as an incident of its
own. After an incident the policy cannot settle from evidence (a degraded GPU, a NaN from one
rank), its GPU runs the compute and SDC tests against its peers, and their measured figures
become the incident's evidence.

`Diagnostics` runs the tests and keeps the run's SDC reference (the first clean pre-flight's
checksums, so a GPU tested alone is still checked); `preflight_troubles` and `measured` are the
pure judgement and wording.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.incidents import RootCause
from trainguard.records import Health
from trainguard.rundir import atomic_write_bytes
from trainguard.supervisor.policy import Trouble, TroubleKind

if TYPE_CHECKING:
    from trainguard.diagnose import Report
    from trainguard.supervisor.config import SupervisorConfig

log = logging.getLogger(__name__)

PREFLIGHT_SDC_ROUNDS = 2  # seconds on the simulator; a wrong-product GPU fails every round
AFTER_INCIDENT_TESTS = ("compute", "sdc")

# The failed test that names the cause of a pre-flight exclusion.
_TEST_CAUSE = {
    "sdc": RootCause.SILENT_DATA_CORRUPTION,
    "memory_pattern": RootCause.GPU_HBM_MEMORY,
    "memory_errors": RootCause.GPU_HBM_MEMORY,
}


def preflight_off(config: SupervisorConfig, backend_open: bool = True) -> str | None:
    """Why the pre-flight does not run for this job (None: it runs). It needs GPUs it can test:
    the simulated node's or the ones NVML sees, never worker slots of a CPU-only job."""
    if not config.health.preflight:
        return "--no-preflight"
    if config.health.backend not in ("sim", "nvml"):
        return "no GPU backend (--backend none)"
    if not backend_open:
        return f"the {config.health.backend} backend did not open"
    return None


class Diagnostics:
    """Runs the tests for one job; every report is also written to ``run_dir/diagnostics/``."""

    def __init__(self, backend: str, sim: Any, run_dir: Path) -> None:
        self.backend = "sim" if backend == "sim" else "auto"
        self.sim = sim
        self.folder = run_dir / "diagnostics"
        self.golden: dict[str, str] | None = None  # the first clean pre-flight's SDC checksums
        self.reports: list[dict[str, Any]] = []  # one line per run, for the job's result

    def preflight(self, gpus: Sequence[int], attempt: int) -> Report:
        from trainguard.diagnose import preflight

        report = preflight(
            list(gpus),
            backend=self.backend,
            sim=self.sim,
            golden=self.golden,
            sdc_rounds=PREFLIGHT_SDC_ROUNDS,
        )
        if self.golden is None and report.health is Health.OK:
            self.golden = report.extra.get("sdc_golden") or None
        self._keep(report, f"preflight-attempt{attempt}", "preflight", attempt, None)
        return report

    def after_incident(self, gpu: int, peers: Sequence[int], attempt: int) -> Report:
        from trainguard.diagnose import after_incident

        report = after_incident(
            gpu,
            gpus=list(peers),
            backend=self.backend,
            sim=self.sim,
            tests=AFTER_INCIDENT_TESTS,
            golden=self.golden,
        )
        self._keep(report, f"gpu{gpu}-attempt{attempt}-{len(self.reports)}", "after_incident", attempt, gpu)
        return report

    def _keep(self, report: Report, name: str, purpose: str, attempt: int, gpu: int | None) -> None:
        path = self.folder / f"{name}.json"
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(report.to_dict(), indent=1, default=str).encode())
        self.reports.append(
            {
                "purpose": purpose,
                "attempt": attempt,
                "gpu": gpu,
                "gpus": [g.index for g in report.gpus],
                "verdict": report.verdict.value,
                "summary": report.summary(),
                "seconds": round(report.seconds, 3),
                "path": str(path),
            }
        )
        log.info("diagnostics (%s, attempt %s): %s", purpose, attempt, report.summary())


def preflight_troubles(
    report: Report, gpus: Sequence[int], now: float, rank_of_gpu: Callable[[int | None], int | None]
) -> list[Trouble]:
    """One trouble per GPU the pre-flight failed: the policy excludes it (pure).

    A failure of the node checks (driver, torch) fails every GPU alike; excluding them all would
    stop the job for what a restart cannot change, so only GPUs that fail on their own count."""
    from trainguard.diagnose import Verdict

    out = []
    for g in gpus:
        gr = report.gpu(g)
        if gr is None or report.gpu_health(g) is not Health.FAILED or gr.verdict.health is not Health.FAILED:
            continue
        failed = [t for t in gr.tests if t.verdict is Verdict.FAIL]
        cause = next((_TEST_CAUSE[t.name] for t in failed if t.name in _TEST_CAUSE), RootCause.FAULTY_GPU)
        first = failed[0] if failed else None
        what = f"{first.name} {first.verdict.value}: {first.reason}" if first else "failed"
        out.append(
            Trouble(
                kind=TroubleKind.GPU_FAILED,
                category="preflight",
                gpu=g,
                gpu_health=Health.FAILED,
                detected_by="preflight",
                time=now,
                started=now,
                summary=f"pre-flight: GPU {g} {what}"[:300],
                root_cause=cause,
                rank=rank_of_gpu(g),
                evidence=measured(report, g),
                extra={"diagnostics": report.summary(), "report": report.to_dict()},
            )
        )
    return out


def measured(report: Report, gpu: int) -> tuple[str, ...]:
    """The figures the tests measured on ``gpu``, one evidence line each (compute, SDC, failures):
    ``diagnostics on GPU 2: compute fail, 50% of peers (0.1113 TFLOPS); 384x384 fp32``."""
    from trainguard.diagnose import Verdict

    gr = report.gpu(gpu)
    if gr is None:
        return (f"diagnostics on GPU {gpu}: {report.summary()}",)
    lines = [
        f"diagnostics on GPU {gpu}: {t.name} {t.verdict.value}, {t.reason}"
        for t in gr.tests
        if t.verdict is not Verdict.SKIP
        and (t.name.startswith(("compute", "sdc")) or t.verdict is Verdict.FAIL)
    ]
    return tuple(lines) or (f"diagnostics on GPU {gpu}: {report.summary()}",)
