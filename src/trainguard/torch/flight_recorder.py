"""torch's flight recorder, from both ends: write a rank's dump, and read a job's dumps with
torch's own parser (``torch.distributed.flight_recorder``, what ``torchfrtrace`` runs).

Writing. NCCL process groups dump by themselves (``TORCH_NCCL_DUMP_ON_TIMEOUT``, the debug-info
pipe). gloo records its collectives in the same recorder (``TORCH_FR_BUFFER_SIZE``) but never
dumps, leaves ``pg_config`` empty and records no send/recv. `dump` writes what
``torch._C._distributed_c10d._dump_fr_trace`` returns to ``<prefix><rank>`` (torch's file
name), completing ``pg_config`` from the live process groups; `serve_dump_requests` answers the
same pipe NCCL's monitor thread answers (``<prefix><rank>.pipe``: write a byte, get a dump). A
rank that holds the GIL cannot answer: that silence is itself evidence.

Reading. `load_dumps` finds the ``<prefix><rank>`` files of a directory (pickled as torch writes
them, or the JSON of ``_dump_fr_trace_json``) and returns trainguard's plain `FlightDump`s;
`torch_matcher` is torch's own entry matcher (sizes, dtypes, op types, p2p pairing) for
``incidents.flight.judge``.

>>> from trainguard.torch.flight_recorder import load_dumps  # doctest: +SKIP
>>> dumps = load_dumps(Path("/tmp"), prefix="nccl_trace_rank_")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.incidents.flight import FlightDump, dump_files

__all__ = ["DumpServer", "dump", "load_dumps", "read_dump", "serve_dump_requests", "torch_matcher"]

log = logging.getLogger(__name__)


def _pg_config() -> dict[str, dict[str, str]]:
    """This rank's process groups in torch's ``pg_config`` shape (what NCCL records itself)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    out: dict[str, dict[str, str]] = {}
    for pg, name in c10d._world.pg_names.items():
        try:
            ranks = dist.get_process_group_ranks(pg)
        except (RuntimeError, ValueError):  # a group this rank is not in
            continue
        desc = getattr(pg, "group_desc", "") or ("default_pg" if name == "0" else "undefined")
        out[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
    return out


def dump(prefix: str, rank: int | None = None, fmt: str = "pickle") -> Path:
    """Write this rank's flight-recorder buffer to ``<prefix><rank>`` atomically (torch's pickle,
    or ``fmt="json"``); returns the path."""
    import torch._C._distributed_c10d as c10d_c
    import torch.distributed as dist

    rank = dist.get_rank() if rank is None else rank
    raw = c10d_c._dump_fr_trace_json() if fmt == "json" else c10d_c._dump_fr_trace()  # type: ignore[attr-defined]
    data: dict[str, Any] = json.loads(raw) if fmt == "json" else pickle.loads(raw)
    config = {k: v for k, v in (data.get("pg_config") or {}).items() if isinstance(v, dict)}
    named = {str(e["process_group"][0]) for e in data.get("entries") or [] if "process_group" in e}
    if named - {k for k, v in config.items() if v.get("ranks", "[]") != "[]"}:
        # gloo lists none of its groups, or one nameless group ("": the default group's ranks)
        data["pg_config"] = {**{k: v for k, v in config.items() if k}, **_pg_config()}
    body = json.dumps(data).encode() if fmt == "json" else pickle.dumps(data)
    path = Path(f"{prefix}{rank}")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # two dumpers may race
    with open(tmp, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


class DumpServer:
    """The thread `serve_dump_requests` starts; `stop` ends it and removes the pipe."""

    def __init__(self, pipe: Path, thread: threading.Thread, stopping: threading.Event) -> None:
        self.pipe, self.thread, self._stopping = pipe, thread, stopping

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        try:  # wake the reader blocked in open(); no reader left (ENXIO): nothing to wake
            fd = os.open(self.pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        self.thread.join(timeout)
        self.pipe.unlink(missing_ok=True)


def serve_dump_requests(prefix: str, rank: int | None = None, fmt: str = "pickle") -> DumpServer:
    """A daemon thread that dumps to ``<prefix><rank>`` each time a byte is written to the FIFO
    ``<prefix><rank>.pipe`` (torch's ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` protocol) until stopped."""
    import torch.distributed as dist

    rank = dist.get_rank() if rank is None else rank
    pipe = Path(f"{prefix}{rank}.pipe")
    pipe.parent.mkdir(parents=True, exist_ok=True)  # the run's dumps folder, before any hang
    pipe.unlink(missing_ok=True)
    os.mkfifo(pipe)
    stopping = threading.Event()

    def serve() -> None:
        while not stopping.is_set():
            try:
                with open(pipe, "rb") as fh:  # blocks, without the GIL, until a writer comes
                    if not fh.read(1) or stopping.is_set():
                        continue
                dump(prefix, rank, fmt)
            except Exception:  # a dump that fails must not kill the training process
                log.exception("flight-recorder dump to %s%s failed", prefix, rank)
                return

    thread = threading.Thread(target=serve, name="trainguard-fr-dump", daemon=True)
    thread.start()
    return DumpServer(pipe, thread, stopping)


def read_dump(path: Path) -> dict[str, Any] | None:
    """One dump file as torch's reader returns it (``rank``, ``entries``, ``pg_config``,
    ``version``), pickled or JSON."""
    from torch.distributed.flight_recorder.components.loader import read_dump as torch_read_dump

    rank = int(path.name[len(path.name.rstrip("0123456789")) :])
    with path.open("rb") as fh:
        head = fh.read(1)
    if head == b"{":
        data: dict[str, Any] = json.loads(path.read_text())
        for e in data.get("entries", []):  # the JSON writer spells tuples as lists, None as 0
            if isinstance(e.get("process_group"), list):
                e["process_group"] = tuple(e["process_group"])
        return {**data, "rank": rank}
    return torch_read_dump(path.name[: -len(str(rank))], str(path))


def load_dumps(directory: Path, prefix: str | None = None, since: float | None = None) -> list[FlightDump]:
    """Every flight-recorder dump under ``directory`` (see `incidents.flight.dump_files`), those
    written at ``since`` or later when given (an earlier attempt's are stale); a torn or foreign
    file is skipped with a warning, never fatal."""
    out = []
    for rank, path in dump_files(directory, prefix).items():
        try:
            if since is not None and path.stat().st_mtime < since:
                continue
            data = read_dump(path)
        except (OSError, ValueError, EOFError, pickle.UnpicklingError, KeyError) as err:
            log.warning("%s: not a readable flight-recorder dump (%s)", path, err)
            continue
        if data is not None:
            out.append(FlightDump.from_torch(rank, str(path), data))
    return out


def torch_matcher() -> Callable[[dict[str, Any], dict[str, Any], set[int]], str | None]:
    """torch's matcher of two ranks' entries of one collective: None when they agree, else the
    mismatch torch names (COLLECTIVE_TYPE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH...)."""
    from torch.distributed.flight_recorder.components.types import MatchState, Op

    def match(a: dict[str, Any], b: dict[str, Any], members: set[int]) -> str | None:
        memberships = {"g": members}
        try:
            info = Op(a, memberships, "g").match(Op(b, memberships, "g"))
        except (KeyError, ValueError, TypeError, AssertionError) as err:
            return f"unreadable entry ({err})"
        if info.state in (MatchState.FULLY_MATCHED, MatchState.UNDECIDED):
            return None
        return str(info)

    return match
