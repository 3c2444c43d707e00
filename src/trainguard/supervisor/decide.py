"""The decide step of the monitor loop: the policy's decision on a trouble, with the active
diagnostics that can settle it first, and the pre-flight before each start.

`decide` (`supervisor.policy`) is pure; what it may ask for is not: a DIAGNOSE decision runs the
compute and SDC tests on the suspect GPU (`supervisor.diagnostics`), and the policy then decides
again on the trouble with the diagnosis filled in. Before each start, `Decider.preflight` tests the
GPUs the start will use; a GPU that fails is an incident, decided like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainguard.actions import JobAction
from trainguard.records import Health
from trainguard.supervisor.attempt import Attempt, History
from trainguard.supervisor.bookkeeping import Bookkeeper
from trainguard.supervisor.config import ExitCode, SupervisorConfig
from trainguard.supervisor.diagnostics import Diagnostics, measured, preflight_off, preflight_troubles
from trainguard.supervisor.health import Diagnose, GpuMap, NodeHealth
from trainguard.supervisor.policy import JobDecision, Trouble, decide, with_diagnosis

if TYPE_CHECKING:
    from trainguard.diagnose import Report

log = logging.getLogger(__name__)

STOP_CODES = {
    JobAction.STOP_CRASH_LOOP: ExitCode.CRASH_LOOP,
    JobAction.STOP_NO_CAPACITY: ExitCode.NO_CAPACITY,
}


def stop_code(verb: JobAction) -> int:
    """The exit code of a run the policy stops with ``verb``."""
    return int(STOP_CODES.get(verb, ExitCode.FAILED))


class Decider:
    """Decides on troubles for one job: the policy, and the diagnostics it asks for."""

    def __init__(
        self,
        config: SupervisorConfig,
        history: History,
        health: NodeHealth,
        book: Bookkeeper,
        emit: Callable[..., None],
        clock: Callable[[], float],
        diagnose: Diagnose | None = None,
    ) -> None:
        self.config, self.history, self.health, self.book = config, history, health, book
        self.emit, self.clock, self.hook = emit, clock, diagnose
        # Active diagnostics need GPUs to test: the simulated fleet's or NVML's.
        self.diagnostics: Diagnostics | None = None
        backend = config.health.backend
        if backend in ("sim", "nvml") and health.active:
            self.diagnostics = Diagnostics(backend, health.sim, book.recorder.run_dir)
        self.preflight_on = preflight_off(config, health.active) is None

    def decide(self, trouble: Trouble, gpus: GpuMap, attempt: int) -> tuple[Trouble, JobDecision]:
        """The decision on ``trouble``, after diagnostics on its GPU when the policy asks."""
        state = self.history.policy_state(self.config, len(gpus.gpus), trouble.fatal)
        decision = decide(trouble, state)
        if decision.verb is JobAction.DIAGNOSE and decision.gpu is not None:
            health, lines, report = self._diagnose(decision.gpu, gpus, attempt)
            summary = report.summary() if report is not None else None
            self.emit(
                "diagnosis", gpu=decision.gpu, health=health.value, summary=summary, measured=list(lines)
            )
            trouble = with_diagnosis(trouble, health)
            extra = (
                {**trouble.extra, "diagnostics": summary, "report": report.to_dict()}
                if report
                else trouble.extra
            )
            trouble = replace(trouble, evidence=(*trouble.evidence, *lines), extra=extra)
            decision = decide(trouble, state)
        return trouble, decision

    def _diagnose(
        self, gpu: int, gpus: GpuMap, attempt: int
    ) -> tuple[Health, tuple[str, ...], Report | None]:
        """The GPU's health after diagnostics, the figures measured and the report: the caller's
        hook, else the compute and SDC tests against the job's other GPUs, else (no GPU backend)
        a fresh look at the node's telemetry."""
        try:
            if self.hook is None and self.diagnostics is not None:
                report = self.diagnostics.after_incident(gpu, gpus.gpus, attempt)
                return report.gpu_health(gpu), measured(report, gpu), report
            return (self.hook or self.health.diagnose_builtin)(gpu), (), None
        except Exception as exc:
            log.warning("diagnostics on GPU %s failed: %s", gpu, exc)
            return Health.UNKNOWN, (f"diagnostics on GPU {gpu} could not run: {exc}",), None

    def preflight(self, gpus: GpuMap, attempt: int, ending: Attempt | None) -> GpuMap | None:
        """Diagnostics on the GPUs the next start uses; each GPU that fails them is an incident,
        and excluded (the policy's call). The GPUs to start on; None when the policy stops the job."""
        if not self.preflight_on or self.diagnostics is None:
            return gpus
        try:
            report = self.diagnostics.preflight(gpus.gpus, attempt)
        except Exception as exc:  # a broken test must not keep training from starting
            log.warning("pre-flight diagnostics could not run: %s", exc)
            return gpus
        self.emit(
            "preflight",
            attempt=attempt,
            gpus=list(gpus.gpus),
            verdict=report.verdict.value,
            summary=report.summary(),
            seconds=round(report.seconds, 3),
        )
        rank_of_gpu: Callable[[int | None], int | None] = (
            ending.rank_of_gpu if ending is not None else (lambda g: None)
        )
        for trouble in preflight_troubles(report, gpus.gpus, self.clock(), rank_of_gpu):
            decision = decide(trouble, self.history.policy_state(self.config, len(gpus.gpus), True))
            incident = self.book.incident(trouble, decision, attempt)
            if decision.verb.stops:
                self.history.stop(stop_code(decision.verb), decision.reason)
                return None
            if decision.verb is JobAction.EXCLUDE_GPU and decision.gpu is not None:
                gpus = gpus.without(decision.gpu)
                resolution = f"GPU {decision.gpu} excluded before attempt {attempt} started"
                self.book.recorder.update(incident, resolved=True, resolution=resolution)
        return gpus

    @property
    def reports(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.diagnostics.reports) if self.diagnostics is not None else ()
