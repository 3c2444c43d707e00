"""bench_node_loss's replica-mode arms: a node of a replica group lost whole, time from its SIGKILL
to the healed group's first commit beside the other group.

2 groups x 2 nodes on one host, each node a ``trainguard run --replica-groups 2 --replica-group-id
g --nnodes 2`` with one rank (c10d rendezvous per group over 127.0.0.1, the same --rdzv-conf as
the other arms), torchft's Lighthouse started once for the job (as a user starts it), and
examples/train_ft.py in every node (torchft's Manager, trainguard's DDP: averaged within a group,
across groups through torchft). Once group 1 committed --kill-step, node b of group 1 and every
process below it get SIGKILL. Arms:

    groups_spare    a fifth node, group 1's command plus --spare (started with the others: it
                    waits in group 1's redundancy list); b is never started again
    groups_nospare  no spare: b's ``trainguard run`` is started again at once (a scheduler at its
                    fastest), and group 1 waits for it in its rendezvous

Figures per run: ``first_step_s`` (kill -> group 1's first commit with both groups after it, by a
process started after the kill), ``worker_start_s`` (-> that process's start line: detection,
rendezvous, process start, imports), ``group0_pause_s`` (the longest gap between group 0's commits
from the kill to group 1's first commit: what the healthy group paid), ``groups_after`` (the
groups in that commit's quorum: 2).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arm_procs import descendants, free_ports, stop

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_ft.py"
START_CAP_S = 300.0
RECOVER_CAP_S = 240.0


def metrics(work: Path, group: int) -> list[dict[str, Any]]:
    try:
        text = (work / f"m{group}.jsonl").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def committed(work: Path, group: int) -> list[dict[str, Any]]:
    return [x for x in metrics(work, group) if x.get("ok")]


def node(
    work: Path, rdzv_conf: str, lighthouse: str, port: int, group: int, name: str
) -> subprocess.Popen[bytes]:
    """Node ``name`` of ``group`` (a hosts the group's rendezvous; s: its spare)."""
    conf = f"{rdzv_conf},is_host={str(name == 'a').lower()}"
    argv = [
        sys.executable, "-m", "trainguard.cli", "run", "--replica-groups", "2", "--replica-group-id", str(group),
        "--lighthouse", lighthouse, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "nodeloss", "--rdzv-conf", conf,
        "--max-restarts", "3", "--backoff-base", "0.1", "--warm-standby-sets", "1", "--no-tee",
        "--db", str(work / "tg.db"), "--runs-dir", str(work / f"g{group}{name}"),
        *(["--spare"] if name == "s" else []),
        "--", sys.executable, str(EXAMPLE), "--steps", "100000", "--step-delay", "0.05",
        "--pg-timeout-s", "60", "--metrics", str(work / "m{group}.jsonl"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "TORCHELASTIC_"))}
    log = open(work / f"g{group}{name}.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        argv, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def wait_for(cond: Any, cap: float, what: str, work: Path) -> None:
    deadline = time.time() + cap
    while not cond():
        if time.time() > deadline:
            tail = (work / "g1a.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} not within {cap:.0f}s; g1a.log ends:\n{tail}")
        time.sleep(0.05)


def one_groups_run(arm: str, kill_step: int, rdzv_conf: str) -> dict[str, float]:
    from trainguard.supervisor.replicas.lighthouse import Lighthouse, LighthouseConfig

    work = Path(tempfile.mkdtemp(prefix=f"nodeloss-{arm}-"))
    ok = False
    lighthouse = Lighthouse(LighthouseConfig(), work / "lighthouse.log")
    lighthouse.start()
    ports = free_ports(2)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for g in (0, 1):
            for n in ("a", "b"):
                procs[f"{g}{n}"] = node(work, rdzv_conf, lighthouse.address, ports[g], g, n)
        if arm == "groups_spare":
            procs["1s"] = node(work, rdzv_conf, lighthouse.address, ports[1], 1, "s")
        wait_for(
            lambda: any(x["step"] >= kill_step and x["groups"] > 1 for x in committed(work, 1)),
            START_CAP_S,
            "group 1's kill step",
            work,
        )
        b = procs.pop("1b")
        pids = {b.pid, *descendants(b.pid)}
        killed = time.time()
        for pid in pids:  # the node dies whole
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        b.wait()
        if arm == "groups_nospare":
            procs["1b"] = node(work, rdzv_conf, lighthouse.address, ports[1], 1, "b")

        def healed() -> dict[str, Any] | None:
            lines = metrics(work, 1)
            starts = [x["t"] for x in lines if x.get("event") == "start" and x["t"] > killed]
            if not starts:
                return None
            return next((x for x in lines if x.get("ok") and x["t"] > starts[0] and x["groups"] > 1), None)

        wait_for(lambda: healed() is not None, RECOVER_CAP_S, "group 1's first commit after the kill", work)
        first = healed()
        assert first is not None
        started = min(x["t"] for x in metrics(work, 1) if x.get("event") == "start" and x["t"] > killed)
        g0 = [killed, *(x["t"] for x in committed(work, 0) if killed < x["t"] <= first["t"]), first["t"]]
        ok = True
        return {
            "first_step_s": first["t"] - killed,
            "worker_start_s": started - killed,
            "group0_pause_s": max(b - a for a, b in itertools.pairwise(g0)),
            "groups_after": float(first["groups"]),
        }
    finally:
        for p in procs.values():
            stop(p)
        lighthouse.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"{arm}: failed; its logs are in {work}", file=sys.stderr)
