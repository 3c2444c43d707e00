"""A failed job's logs -> ``JobFinding``s: every finding, with the rank, host and GPU it belongs to.

What `trainguard logs explain` reads before ``incidents.correlate.explain_job`` judges. Accepts the
layouts jobs leave behind:

- torchrun ``--log-dir``: ``<dir>/<run_id>/attempt_<n>/<local_rank>/stdout.log|stderr.log``;
- Slurm per-task files (``--output=job-%j-%t.out``): the task id is the last number of the name;
- trainguard's own ``rank<R>.stdout|.stderr``, and any ``rank<R>``/``task<R>`` file name;
- one interleaved file whose lines carry torch's ``[rank<R>]:`` prefix;
- kernel logs (dmesg, syslog) given alongside: their Xids carry the GPU's PCI address.

A line's own ``[rankN]:`` tag beats the file's rank. Host and GPU come from NCCL's init line
``<host>:<pid>:<tid> [<dev>] NCCL INFO comm 0x... rank R nranks N cudaDev D busId 3b000``.
A finding without a time takes the time of the finding before it in the same rank's stream (a
Python traceback is unstamped; torch's watchdog lines around it are).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.detect.scan import EventMerger, scan_file
from trainguard.detect.training_log import line_node, line_rank
from trainguard.incidents.correlate import JobFinding
from trainguard.records import EventKind, normalize_pci

if TYPE_CHECKING:
    from trainguard.incidents.nodes import NodeLine

__all__ = [
    "attempts_of",
    "final_exception",
    "job_files",
    "job_findings",
    "job_hosts",
    "last_step",
    "nccl_identities",
    "node_lines",
    "rank_of_path",
    "tail_lines",
]

_SUFFIXES = {".log", ".out", ".err", ".txt", ".stdout", ".stderr"}
_HEAD_BYTES = 1 << 20  # NCCL's init lines come first
_COMM = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(?P<host>[^\s:\[\]]+):\d+:\d+ \[\d+\] NCCL INFO comm 0x[0-9a-f]+ rank (?P<rank>\d+) "
    r"nranks (?P<nranks>\d+) cudaDev \d+(?: nvmlDev \d+)? busId (?P<bus>[0-9a-fA-F]+)",
    re.M,
)
_RANK_WORD = re.compile(r"(?:rank|task|proc)[-_]?(\d+)", re.I)
_NUMBER = re.compile(r"\d+")


def rank_of_path(path: Path) -> int | None:
    """The rank a log file belongs to, from its name or torchrun's ``attempt_<n>/<rank>/`` folder."""
    stem = path.name.split(".")[0]
    if m := _RANK_WORD.search(stem):
        return int(m.group(1))
    if path.parent.name.isdigit() and path.parent.parent.name.startswith("attempt_"):
        return int(path.parent.name)
    numbers = _NUMBER.findall(stem)
    return int(numbers[-1]) if len(numbers) >= 2 else None  # job-%j-%t: the last; slurm-%j alone: a job id


def job_files(paths: Iterable[Path]) -> list[Path]:
    """The log files under ``paths`` (directories are walked), in a stable order."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
        else:
            out.append(path)
    return out


def _bus_id(value: str) -> str | None:
    """NCCL's int64 bus id ("3b000") -> "0000:3b:00"."""
    try:
        n = int(value, 16)
    except ValueError:
        return None
    return normalize_pci(f"{n >> 20:04x}:{(n & 0xFF000) >> 12:02x}:{(n & 0xFF0) >> 4:02x}")


def nccl_identities(head: str) -> dict[int, tuple[str, str | None]]:
    """rank -> (host, GPU PCI) from the NCCL init lines of the default (largest) communicator."""
    best: dict[int, tuple[int, str, str | None]] = {}
    for m in _COMM.finditer(head):
        rank, nranks = int(m["rank"]), int(m["nranks"])
        if rank not in best or nranks > best[rank][0]:
            best[rank] = (nranks, m["host"], _bus_id(m["bus"]))
    return {rank: (host, pci) for rank, (_, host, pci) in best.items()}


def _head(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(_HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def job_findings(
    paths: Iterable[Path], engine: str = "auto", ranks: set[int] | None = None
) -> Iterator[JobFinding]:
    """Every finding (one per failure event) of every file, with rank, host and GPU attached.

    ``ranks``, when given, receives every rank the logs show (from file names and NCCL's init
    lines), also those without a finding. Raises ``InputError`` when a file cannot be read.
    """
    files = job_files(paths)
    heads = {path: nccl_identities(_head(path)) for path in files}
    identities = {rank: who for found in heads.values() for rank, who in found.items()}
    if ranks is not None:
        ranks.update(identities, (r for p in files if (r := rank_of_path(p)) is not None))
    ranks_of_gpu: dict[str | None, list[int]] = {}
    for owner, (_host, gpu) in identities.items():
        ranks_of_gpu.setdefault(gpu, []).append(owner)
    for path in files:
        file_rank = rank_of_path(path)
        if file_rank is None and len(heads[path]) == 1:
            file_rank = next(iter(heads[path]))
        found = []
        for event in scan_file(path, engine=engine):
            if event.kind is EventKind.TRAINING:
                rank = line_rank(event.text)
                rank = file_rank if rank is None else rank
                host, pci = identities.get(rank, (None, None)) if rank is not None else (None, None)
                host = host or line_node(event.text)  # mpirun, srun: "rank 3 ... on node X"
            else:  # a kernel line names a GPU: it is the rank's whose GPU it is, when only one has it
                owners = ranks_of_gpu.get(event.pci, [])
                rank = owners[0] if len(owners) == 1 else None
                host, pci = (identities[rank][0] if rank is not None else None), event.pci
            found.append(JobFinding(event, rank, host, pci))
        merger = EventMerger()
        yield from (f for f in _timed(found) if merger.is_new(f.event))


def _timed(found: list[JobFinding]) -> list[JobFinding]:
    """The findings with each untimed one stamped by its rank's previous timed finding (else the
    next one): a Python traceback carries no time, torch's watchdog lines around it do."""
    out = list(found)
    for order in (range(len(out)), range(len(out) - 1, -1, -1)):
        last: dict[int | None, float] = {}
        for i in order:
            f = out[i]
            if f.event.time is not None:
                last[f.rank] = f.event.time
            elif f.rank in last:
                out[i] = replace(f, event=replace(f.event, time=last[f.rank]))
    return out


_ATTEMPT = re.compile(r"^attempt_(\d+)$")
_STEP = re.compile(r"\b(?:step|iter(?:ation)?)\b\s*[=:#]?\s*\[?(\d+)", re.I)
_FINAL = re.compile(
    r"^(?:\[rank\d+\]:\s*)?(?:(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b: |\S+: error: )"
)
_TAIL_BYTES = 256 << 10


def attempts_of(files: Iterable[Path]) -> dict[int, list[Path]]:
    """torchrun's ``attempt_<n>`` folders -> their files (everything else is attempt 0)."""
    out: dict[int, list[Path]] = {}
    for path in files:
        n = next((int(m.group(1)) for part in path.parts if (m := _ATTEMPT.match(part))), 0)
        out.setdefault(n, []).append(path)
    return dict(sorted(out.items()))


def tail_lines(path: Path, nbytes: int = _TAIL_BYTES) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, fh.seek(0, 2) - nbytes))
            return fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def last_step(files: Iterable[Path]) -> int | None:
    """The highest step any file's tail mentions (``step 120``, ``iter: 120``, ``[120/1000]``)."""
    steps = [int(m.group(1)) for p in files for line in tail_lines(p) for m in _STEP.finditer(line)]
    return max(steps) if steps else None


def final_exception(lines: Iterable[str], cascade: re.Pattern[str]) -> str | None:
    """The last Python exception line that is not a cascade of another failure."""
    found = None
    for line in lines:
        if _FINAL.match(line) and not cascade.search(line):
            found = line.strip()
    return found


def job_hosts(files: Iterable[Path]) -> tuple[dict[int, str], dict[str, str]]:
    """rank -> host and address -> host, from NCCL's init and bootstrap lines."""
    from trainguard.incidents.nodes import bootstrap_addresses

    hosts: dict[int, str] = {}
    addresses: dict[str, str] = {}
    for path in files:
        head = _head(path)
        hosts.update({rank: host for rank, (host, _pci) in nccl_identities(head).items()})
        addresses.update(bootstrap_addresses(head))
    return hosts, addresses


def node_lines(
    files: Iterable[Path], host_of_rank: dict[int, str]
) -> tuple[list[NodeLine], dict[int, float]]:
    """The tail lines that speak of a lost peer or a dead node, and each rank's last stamped time."""
    from trainguard.detect.training_log import training_time
    from trainguard.incidents.nodes import NodeLine

    lines: list[NodeLine] = []
    last: dict[int, float] = {}
    for path in files:
        file_rank = rank_of_path(path)
        for text in tail_lines(path):
            rank = line_rank(text)
            rank = file_rank if rank is None else rank
            t = training_time(text)
            if t is not None and rank is not None:
                last[rank] = max(t, last.get(rank, t))
            if _NODE_WORDS.search(text):
                lines.append(NodeLine(rank, host_of_rank.get(rank) if rank is not None else None, t, text))
    return lines, last


_NODE_WORDS = re.compile(
    r"Detected dead node|Connection (?:closed|reset)|Call to (?:recv|send)|recvValue failed|Broken pipe|"
    r"Watchdog caught|timed out|Remote daemon|Node failure on|NODE FAILURE|marked dead"
)
