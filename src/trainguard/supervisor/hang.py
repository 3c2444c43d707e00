"""Hang forensics: gather stacks and flight-recorder dumps from every rank, then name the rank(s)
that never entered the collective the others are waiting in.

Gathering: workers run with ``PYTHONFAULTHANDLER=1`` (set by the supervisor), so SIGABRT makes
each rank print every thread's Python stack from a C-level handler, even while it is blocked
inside a gloo/NCCL call where no Python signal handler could run. A stopped rank is sent SIGCONT
after it so it dumps too. The stacks land in the rank's stderr log and are copied to
``dumps/rank<R>-<t>.txt``; dumps the Guard's own watchdog wrote (``.txt``, ``.fr.json`` flight
recorder) are used as well. The ranks die of it: the supervisor restarts them anyway.

Signals go through the workers' own process handles (``Popen``), never to a bare pid: a handle
refuses to signal once its process was reaped, and until then the pid cannot be reused, so a
dump request can only reach a worker of the hung attempt (pids wrap at 32768 on a busy host).

Before the stacks, every rank is asked for torch's flight-recorder dump through its debug-info
pipe (`flight_recorder_env` points torch's dump files and pipe into the run's dumps folder; NCCL
answers by itself, gloo through ``trainguard.torch.flight_recorder.serve_dump_requests``). The
dumps are judged by ``incidents.flight`` and the judgement is kept beside them as
``dumps/flight-<t>.json``, listed with the incident's evidence.

Evidence, strongest first:
1. the process was stopped (``T`` in /proc: SIGSTOP, a debugger);
2. flight-recorder dumps: per process group, the ranks the others wait on (no dump, never issued
   the collective, mismatched sizes), followed across groups to the ranks that started the stall
   (``incidents.flight``; a rank it names only for entering late joined in the end, so it is kept
   in the judgement but is no laggard); the Guard's own ``.fr.json``: a rank whose last collective sequence
   number is behind the others';
3. Python stacks: ranks inside a collective (torch.distributed, backward's all-reduce) vs ranks
   elsewhere;
4. heartbeats: a rank whose last completed step is behind the others'.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trainguard.rundir import Heartbeat, dumps_dir

if TYPE_CHECKING:
    from trainguard.incidents.flight import FlightVerdict  # judged only when a hang is

FR_PREFIX = "fr_rank_"  # torch's flight-recorder dumps of a run: <run>/dumps/fr_rank_<rank>
_FR_FRESH_S = 600.0  # a dump older than this at the hang belongs to an earlier attempt

_COLLECTIVE = re.compile(
    r"torch/distributed/|all_reduce|allreduce|all_gather|reduce_scatter|broadcast|barrier|"
    r"all_to_all|backward|_sync_params|"
    r"trainguard/torch/agreement\.py",  # the Guard's own all-reduce of its loss window
    re.I,
)
# The Guard's watchdog thread (which may write the dump itself) and faulthandler's "Extension
# modules" list name no frame of the training loop, so they say nothing about the collective.
_WATCHDOG_FRAME = "trainguard/torch/watchdog.py"
_STACK_START = re.compile(r"^(?:Fatal Python error|Thread 0x|Current thread 0x)", re.M)


@dataclass(frozen=True, slots=True)
class HangReport:
    laggards: tuple[int, ...]  # ranks that never entered the collective the others wait in
    reasons: dict[int, str] = field(default_factory=dict)
    dumps: tuple[str, ...] = ()
    method: str = "none"  # proc_state | flight_recorder | stacks | heartbeat | none
    flight: FlightVerdict | None = None  # torch's flight-recorder dumps, judged


def proc_state(pid: int) -> str | None:
    """The one-letter Linux process state (R, S, D, T, Z...), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else None


class Worker(Protocol):
    """A worker process handle (``subprocess.Popen`` is one)."""

    pid: int

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def collect(
    run_dir: Path,
    procs: dict[int, Worker],
    stderr_paths: dict[int, Path],
    beats: dict[int, Heartbeat | None],
    wait_s: float = 3.0,
) -> HangReport:
    """Dump every live rank (see the module docstring), then `analyze`. Ranks end up dead."""
    alive = {r: w for r, w in procs.items() if w.poll() is None}  # unreaped: the pid is still ours
    states = {r: proc_state(w.pid) for r, w in alive.items()}
    flight, flight_file = flight_dumps(run_dir, sorted(alive), sorted(procs), wait_s)
    offsets = {r: _size(p) for r, p in stderr_paths.items()}
    asked = time.time()
    for r, w in alive.items():
        w.send_signal(signal.SIGABRT)
        if states.get(r) == "T":
            w.send_signal(signal.SIGCONT)
    deadline = time.time() + wait_s
    while time.time() < deadline and any(w.poll() is None for w in alive.values()):
        time.sleep(0.05)
    dumps: dict[int, list[Path]] = {}
    directory = dumps_dir(run_dir)
    for r, path in stderr_paths.items():
        text = _read_from(path, offsets[r])
        m = _STACK_START.search(text)
        if m:
            directory.mkdir(parents=True, exist_ok=True)
            out = directory / f"rank{r}-{int(asked)}.txt"
            out.write_text(text[m.start() :])
            dumps.setdefault(r, []).append(out)
    for r, paths in _dumps_since(directory, asked - 60).items():
        for p in paths:
            if p not in dumps.get(r, []):
                dumps.setdefault(r, []).append(p)
    if flight_file is not None:
        dumps.setdefault(-1, []).append(flight_file)
    return analyze(sorted(procs), states, dumps, beats, flight)


def flight_dumps(
    run_dir: Path, alive: list[int], ranks: list[int], wait_s: float
) -> tuple[FlightVerdict | None, Path | None]:
    """Ask the live ranks for torch flight-recorder dumps, judge every dump in the run's dumps
    folder, keep the judgement as ``dumps/flight-<t>.json``. (None, None) without dumps or torch."""
    import json as _json
    import logging

    from trainguard.incidents.flight import dump_files, judge
    from trainguard.rundir import atomic_write_bytes

    directory = dumps_dir(run_dir)
    since = time.time() - _FR_FRESH_S  # NCCL's own dump-on-timeout may precede the request
    request_flight_dumps(str(directory / FR_PREFIX), alive, wait_s)
    if not directory.is_dir() or not dump_files(directory, FR_PREFIX):
        return None, None
    try:
        from trainguard.torch.flight_recorder import load_dumps, torch_matcher
    except ImportError:
        logging.getLogger(__name__).warning(
            "flight-recorder dumps found but torch is not installed to read them"
        )
        return None, None
    dumps = load_dumps(directory, FR_PREFIX, since)
    if not dumps:
        return None, None
    verdict = judge(dumps, torch_matcher(), world=ranks, here=ranks)  # other nodes dump on their hosts
    out = directory / f"flight-{int(time.time())}.json"
    atomic_write_bytes(out, (_json.dumps(verdict.as_json(), indent=1) + "\n").encode())
    return verdict, out


def analyze(
    ranks: list[int],
    states: dict[int, str | None],
    dumps: dict[int, list[Path]],
    beats: dict[int, Heartbeat | None],
    flight: FlightVerdict | None = None,
) -> HangReport:
    """Pure analysis of what was gathered (see the module docstring for the evidence order)."""
    files = tuple(str(p) for ps in dumps.values() for p in ps)
    dumps = {r: ps for r, ps in dumps.items() if r >= 0}
    stopped = {r: "process stopped (state T)" for r in ranks if states.get(r) == "T"}
    if stopped:
        return HangReport(tuple(sorted(stopped)), stopped, files, "proc_state", flight)
    if flight is not None and flight.causes:  # a rank that only came late is not what the hang waits on
        reasons = {
            r: "; ".join(f"{e.group} {e.op}: {e.text}" for e in flight.evidence[r]) for r in flight.causes
        }
        return HangReport(flight.causes, reasons, files, "flight_recorder", flight)
    if len(ranks) == 1:  # no peer to compare with: the job's only rank is where it hangs
        (r,) = ranks
        where = "inside a collective" if _in_collective(dumps.get(r, [])) else "not inside a collective"
        reason = f"the job's only rank; stack is {where}" if r in dumps else "the job's only rank"
        return HangReport((r,), {r: reason}, files, "stacks" if r in dumps else "proc_state", flight)
    silent = [r for r in ranks if r not in dumps]
    if dumps and silent and len(silent) < len(ranks):
        reasons = {r: "did not answer the dump request while the others did" for r in silent}
        return HangReport(tuple(silent), reasons, files, "proc_state")
    seqs = {r: s for r in ranks if (s := _fr_last_seq(dumps.get(r, []))) is not None}
    if len(seqs) >= 2 and len(set(seqs.values())) > 1:
        top = max(seqs.values())
        lag = {r: f"last collective #{s} while others reached #{top}" for r, s in seqs.items() if s < top}
        return HangReport(tuple(sorted(lag)), lag, files, "flight_recorder")
    inside = {r: _in_collective(dumps.get(r, [])) for r in ranks if r in dumps}
    if any(inside.values()) and not all(inside.values()):
        lag = {r: "stack is not inside a collective" for r, v in inside.items() if not v}
        return HangReport(tuple(sorted(lag)), lag, files, "stacks")
    steps = {r: b.step for r, b in beats.items() if b is not None}
    if steps and len(set(steps.values())) > 1:
        top = max(steps.values())
        lag = {r: f"last step {s} while others reached {top}" for r, s in steps.items() if s < top}
        return HangReport(tuple(sorted(lag)), lag, files, "heartbeat")
    return HangReport((), {}, files, "none")


def flight_recorder_env(run_dir: Path, torch_version: str | None = None) -> dict[str, str]:
    """The environment that makes torch record and dump its flight recorder into the run's dumps
    folder (a user's own settings win: the supervisor applies these with ``setdefault``).

    ``torch_version``: the ranks' torch (default: the one installed beside trainguard). torch 2.8
    renamed the ring's size ``TORCH_NCCL_TRACE_BUFFER_SIZE`` to ``TORCH_FR_BUFFER_SIZE`` and warns
    in every rank where the old name is set, so the old name is set only for an older torch (or
    one whose version is unknown).

    >>> sorted(k for k in flight_recorder_env(Path("r"), "2.13.0") if "BUFFER" in k)
    ['TORCH_FR_BUFFER_SIZE']
    >>> sorted(k for k in flight_recorder_env(Path("r"), "2.4.1+cu121") if "BUFFER" in k)
    ['TORCH_FR_BUFFER_SIZE', 'TORCH_NCCL_TRACE_BUFFER_SIZE']
    """
    prefix = str(dumps_dir(run_dir) / FR_PREFIX)
    release = _release(installed_torch_version() if torch_version is None else torch_version)
    old_name = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"} if release is None or release < (2, 8) else {}
    return {
        "TORCH_FR_BUFFER_SIZE": "2000",
        **old_name,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": prefix,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


@functools.cache  # read once: every rank's environment asks, on the start path
def installed_torch_version() -> str:
    """The version of the torch installed beside trainguard, read without importing it; "" when
    there is none."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2])) if m else None


def request_flight_dumps(prefix: str, ranks: list[int], wait_s: float = 5.0) -> dict[int, Path]:
    """Ask every rank for a flight-recorder dump through torch's debug-info pipe
    (``<prefix><rank>.pipe``; trainguard's gloo writer answers it too) and wait for the
    ``<prefix><rank>`` files. Returns the dumps written since the request; a rank that holds the
    GIL or is dead writes none."""
    import os

    asked: dict[int, float] = {}
    for r in ranks:
        dump = Path(f"{prefix}{r}")
        try:
            before = dump.stat().st_mtime
        except OSError:
            before = 0.0
        fd, until = -1, time.time() + min(1.0, wait_s / 2)
        while fd < 0:
            try:
                fd = os.open(f"{prefix}{r}.pipe", os.O_WRONLY | os.O_NONBLOCK)
            except FileNotFoundError:  # no pipe: the rank does not serve dump requests
                break
            except OSError:  # ENXIO: its reader is between two requests, or gone
                if time.time() > until:
                    break
                time.sleep(0.02)
        if fd < 0:
            continue
        try:
            os.write(fd, b"1")
            asked[r] = before
        except OSError:
            pass
        finally:
            os.close(fd)
    got: dict[int, Path] = {}
    deadline = time.time() + wait_s
    while asked and time.time() < deadline:
        for r, before in list(asked.items()):
            path = Path(f"{prefix}{r}")
            try:
                if path.stat().st_mtime > before:
                    got[r] = path
                    del asked[r]
            except OSError:
                pass
        time.sleep(0.05)
    return got


def _dumps_since(directory: Path, since: float) -> dict[int, list[Path]]:
    found: dict[int, list[Path]] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return found
    for path in entries:
        m = re.match(r"rank(\d+)-", path.name)
        if not m:
            continue
        try:
            if path.stat().st_mtime + 1.0 < since:
                continue
        except OSError:
            continue
        found.setdefault(int(m.group(1)), []).append(path)
    return found


def _fr_last_seq(paths: list[Path]) -> int | None:
    """Highest collective sequence id a rank *issued*, from a flight-recorder JSON dump."""
    for path in paths:
        if not path.name.endswith(".fr.json"):
            continue
        try:
            data = json.loads(path.read_text())
            entries = data.get("entries", []) if isinstance(data, dict) else []
            seqs = [
                int(e["collective_seq_id"])
                for e in entries
                if isinstance(e, dict) and "collective_seq_id" in e
            ]
        except (OSError, ValueError, TypeError, KeyError):  # a torn or foreign dump is no evidence
            continue
        if seqs:
            return max(seqs)
    return None


def _in_collective(paths: list[Path]) -> bool:
    for path in paths:
        if path.suffix == ".txt":
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if any(_COLLECTIVE.search(stack) for stack in _training_stacks(text)):
                return True
    return False


def _training_stacks(dump: str) -> list[str]:
    """The dump's thread stacks, less the watchdog's and the list of extension modules."""
    dump = dump.split("\nExtension modules:")[0]
    starts = [m.start() for m in _STACK_START.finditer(dump)] or [0]
    stacks = [dump[a:b] for a, b in zip(starts, [*starts[1:], len(dump)], strict=True)]
    return [s for s in stacks if _WATCHDOG_FRAME not in s]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""
