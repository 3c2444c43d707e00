"""Worker output: per-rank log files, a console tee with rank prefixes, and classification.

Workers write straight into files (torch's own redirection, so a dying worker loses nothing);
the supervisor's monitor loop tails those files, copies new lines to the console as
``[rank R] ...`` and runs each line through the training-log classifier (NCCL, CUDA, OOM...).
The lines of one failure are one event (`detect.merge.EventMerger`): torch prints one NCCL
watchdog timeout as four to six lines, one CUDA error as the exception, the watchdog's copy and
``what():``; only the first line of each carries the event, so it is one piece of evidence.

    <run_dir>/logs/<node>/attempt<A>/rank<R>.stdout|.stderr|.error.json
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from trainguard.records import Event

if TYPE_CHECKING:  # detection loads with the first LogTail, after the workers' start
    from trainguard.detect.merge import EventMerger

log = logging.getLogger(__name__)

Classifier = Callable[[str], Event | None]


def default_classifier() -> Classifier:
    """The training-log classifier (`trainguard.detect.training_log`)."""
    from trainguard.detect.training_log import classify_training_line

    return classify_training_line


def _merger() -> EventMerger:
    from trainguard.detect.merge import EventMerger

    return EventMerger()


@dataclass(frozen=True, slots=True)
class LogLine:
    rank: int
    stream: str  # stdout | stderr
    text: str
    event: Event | None  # the classifier's finding, if the line starts one


class LogTail:
    """Follows a set of worker log files from where it last stopped; never raises on I/O."""

    def __init__(
        self,
        classify: Classifier | None = None,
        console: TextIO | None = None,
        tee: bool = True,
    ) -> None:
        self._files: dict[tuple[int, str], Path] = {}
        self._offsets: dict[tuple[int, str], int] = {}
        self._partial: dict[tuple[int, str], bytes] = {}
        self._line_no: dict[tuple[int, str], int] = {}
        self._merger = _merger()
        self._classify = classify or default_classifier()
        self._console = console
        self._tee = tee

    def follow(self, files: dict[tuple[int, str], Path]) -> None:
        """Start following a new set of files (a new attempt); the old set is flushed first."""
        self.poll(final=True)
        self._files = dict(files)
        self._offsets = dict.fromkeys(files, 0)
        self._partial = dict.fromkeys(files, b"")
        self._line_no = dict.fromkeys(files, 0)
        self._merger = _merger()

    def poll(self, final: bool = False) -> list[LogLine]:
        out: list[LogLine] = []
        for key, path in self._files.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[key])
                    data = f.read(1 << 20)
            except OSError:
                continue
            if not data and not (final and self._partial[key]):
                continue
            self._offsets[key] += len(data)
            chunk = self._partial[key] + data
            lines = chunk.split(b"\n")
            self._partial[key] = b"" if final else lines.pop()
            for raw in lines:
                if raw or not final:
                    out.append(self._line(key, raw.decode("utf-8", "replace").rstrip("\r")))
        return out

    def _line(self, key: tuple[int, str], text: str) -> LogLine:
        rank, stream = key
        if self._tee:
            console = self._console or (sys.stderr if stream == "stderr" else sys.stdout)
            try:
                console.write(f"[rank{rank}] {text}\n")
                console.flush()
            except (OSError, ValueError):
                pass
        try:
            event = self._classify(text)
        except Exception:  # a classifier bug must not take the supervisor down
            log.debug("classifier failed on %r", text, exc_info=True)
            event = None
        self._line_no[key] = self._line_no.get(key, 0) + 1
        if event is not None:
            path = self._files.get(key)
            event = replace(event, path=str(path) if path else None, line_no=self._line_no[key])
            if not self._merger.is_new(event):
                event = None  # a further line of the failure the event already stands for
        return LogLine(rank, stream, text, event)


def make_logs_specs(attempt_dir: Callable[[], Path]) -> object:
    """A torch `LogsSpecs` that writes rank R's output to ``<attempt_dir>/rank<R>.stdout|.stderr``.

    Built lazily (torch is imported here, not at module import)."""
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

    class RunLogsSpecs(LogsSpecs):
        def __init__(self) -> None:
            super().__init__(log_dir=None)

        @property
        def root_log_dir(self) -> str:
            return str(attempt_dir())

        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            directory = attempt_dir()
            directory.mkdir(parents=True, exist_ok=True)
            dest = LogsDest()
            for local_rank, env in envs.items():
                rank = int(env.get("RANK", local_rank))
                dest.stdouts[local_rank] = str(directory / f"rank{rank}.stdout")
                dest.stderrs[local_rank] = str(directory / f"rank{rank}.stderr")
                dest.error_files[local_rank] = str(directory / f"rank{rank}.error.json")
                env["TORCHELASTIC_ERROR_FILE"] = dest.error_files[local_rank]
            return dest

    return RunLogsSpecs()
