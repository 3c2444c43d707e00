"""A lost node: time from its SIGKILL to the job's first training step after it, trainguard run
with and without a hot spare node against torchrun with and without one.

    python benchmarks/bench_node_loss.py [--repeats 3] [--kill-step 30] [--json]

A 2-node job on one host (each node a launcher with one rank, c10d rendezvous over 127.0.0.1, the
same --rdzv-conf for every arm), the same plain DDP script in every arm
(benchmarks/node_loss_ddp.py: gloo, its own snapshot every 10 steps, never imports trainguard).
Once rank 0 reported --kill-step, node b's launcher and every process below it get SIGKILL
(torch starts its workers in sessions of their own: a kill of the launcher's process group alone
leaves torchrun's rank training). Arms:

    spare           trainguard run --nnodes 2:2 on a and b, a third node with --spare (started
                    with them: it waits in torch's redundancy list, its warm pool up)
    nospare         trainguard run --nnodes 1:2 on a and b: the survivor goes on alone (after
                    the rendezvous' last_call_timeout), b is not restarted
    torchrun_spare  torchrun --nnodes 2:2 on a and b, a third torchrun started once they train
                    (torch's own redundancy list: a node that arrives when the round is full)
    torchrun_1to2   torchrun --nnodes 1:2 on a and b: the survivor goes on alone
    groups_spare    replica mode, 2 groups x 2 nodes, a spare node for group 1; the time is to
    groups_nospare  group 1's first commit beside group 0 after the kill (node_loss_groups.py)

    python benchmarks/bench_node_loss.py --arms groups_spare,groups_nospare --repeats 1 --json

The torchrun arms run torchrun itself, none of our code. torchrun_spare sets torch's
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torch 2.13's default (the agent's TCP store shared
with the workers) a node that stays rank 0 across rounds never publishes MASTER_ADDR in the new
round's store (RendezvousStoreInfo.build runs on its first round only), so the spare waits for
it, and rank 0 for the spare's role_info, until both time out (seen here: 60 s, no recovery). ``node_loss_first_step_s_torchrun`` is
the better (lower mean) torchrun arm; ``ratio_vs_torchrun`` is the spare arm against it
(geometric mean of the per-round ratios, target <= 0.3). Where the seconds go, per arm (means):
``survivor_gone_s`` (kill -> the surviving node's old rank process gone: gloo's error and the
agent's stop), ``worker_start_s`` (kill -> the new rank 0's script starts: detection,
rendezvous, process start), ``pg_s`` (-> its process group is up: imports, gloo connect),
``load_s`` (-> its snapshot loaded), ``first_step_s`` (-> its first step). Rounds rotate the arms'
order (paired.rotate); the commit and the host's load are in the JSON. Exit 1 when the target is
missed.
"""

from __future__ import annotations

import argparse
import contextlib
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

from arm_procs import descendants, free_port, progress, stop
from node_loss_groups import one_groups_run
from paired import mean_ci, ratio_ci, rotate

SCRIPT = Path(__file__).with_name("node_loss_ddp.py")
ROOT = Path(__file__).resolve().parent.parent
# What tests/test_multinode.py uses on this loaded host: a 15 s keep-alive window, 10 s last call.
RDZV_CONF = "join_timeout=120,last_call_timeout=10,keep_alive_interval=1,keep_alive_max_attempt=15"
ARMS = ("spare", "nospare", "torchrun_spare", "torchrun_1to2", "groups_spare", "groups_nospare")
BREAKDOWN = ("survivor_gone_s", "worker_start_s", "pg_s", "load_s", "first_step_s", "world_size_after")
GROUPS_BREAKDOWN = ("worker_start_s", "group0_pause_s", "first_step_s", "groups_after")
START_CAP_S = 240.0
RECOVER_CAP_S = 180.0


def node_cmd(arm: str, name: str, port: int, work: Path, nnodes: str) -> list[str]:
    conf = f"{RDZV_CONF},is_host={str(name == 'a').lower()}"
    rdzv = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    rdzv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "nodeloss", "--max-restarts", "3"]
    rdzv += ["--rdzv-conf", conf]
    script = [str(SCRIPT), str(work)]
    if arm.startswith("torchrun"):
        return [sys.executable, "-m", "torch.distributed.run", *rdzv, *script]
    tg = [sys.executable, "-m", "trainguard.cli", "run", *rdzv, "--no-tee", "--runs-dir", str(work / name)]
    tg += ["--db", str(work / f"{name}.db"), *(["--spare"] if name == "s" else [])]
    return [*tg, "--", sys.executable, *script]


def start(arm: str, name: str, port: int, work: Path, nnodes: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "TORCHELASTIC_"))}
    if arm == "torchrun_spare":  # torch's own opt-out: without it a joining node never gets in
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        node_cmd(arm, name, port, work, nnodes),
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # the node's process group: what the kill takes down whole
    )


def phases(work: Path) -> list[tuple[int, int, str, float, int]]:
    try:
        lines = (work / "phases").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        p = line.split()
        if len(p) == 5:
            out.append((int(p[0]), int(p[1]), p[2], float(p[3]), int(p[4])))
    return out


def wait_for(cond: Any, cap: float, what: str, work: Path) -> None:
    deadline = time.time() + cap
    while not cond():
        if time.time() > deadline:
            tail = (work / "a.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{what} not within {cap:.0f}s; a.log ends:\n{tail}")
        time.sleep(0.05)


def one_run(arm: str, kill_step: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix=f"nodeloss-{arm}-"))
    ok = False
    port = free_port()
    nnodes = "2:2" if arm in ("spare", "torchrun_spare") else "1:2"
    procs = {n: start(arm, n, port, work, nnodes) for n in ("a", "b")}
    try:
        if arm == "spare":
            procs["s"] = start(arm, "s", port, work, nnodes)  # with the others: it waits as the spare
        wait_for(lambda: any(s >= 1 for _, s, _ in progress(work)), START_CAP_S, "the first step", work)
        if arm == "torchrun_spare":  # torchrun's spare: a node that arrives when the round is full
            procs["s"] = start(arm, "s", port, work, nnodes)
        wait_for(
            lambda: any(s >= kill_step for _, s, _ in progress(work)), START_CAP_S, "the kill step", work
        )
        b_pids = {procs["b"].pid, *descendants(procs["b"].pid)}
        old = {pid for pid, _, ph, _, _ in phases(work) if ph == "start"}
        survivors = old - b_pids
        killed = time.time()
        for pid in b_pids:  # the node dies whole: torch starts its workers in sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gone: float | None = None

        def recovered() -> bool:
            nonlocal gone
            if gone is None and not any(Path(f"/proc/{p}").exists() for p in survivors):
                gone = time.time()
            return any(t > killed and pid not in old for t, _, pid in progress(work))

        wait_for(recovered, RECOVER_CAP_S, "the first step after the kill", work)
        new = [x for x in phases(work) if x[0] not in old and x[1] == 0]
        at = {ph: t for _, _, ph, t, _ in new}
        first = min(t for t, _, pid in progress(work) if t > killed and pid not in old)
        ok = True
        return {
            "first_step_s": first - killed,
            "survivor_gone_s": (gone or first) - killed,
            "worker_start_s": at.get("start", first) - killed,
            "pg_s": at.get("pg", first) - killed,
            "load_s": at.get("loaded", first) - killed,
            "world_size_after": float(max((w for *_, w in new), default=0)),
        }
    finally:
        for p in procs.values():
            stop(p)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"{arm}: failed; its logs are in {work}", file=sys.stderr)


def commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kill-step", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--arms", default=",".join(ARMS), help=f"which arms, comma-separated (default: {','.join(ARMS)})"
    )
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    if unknown := [a for a in arms if a not in ARMS]:
        ap.error(f"--arms: unknown {', '.join(unknown)}; give some of {', '.join(ARMS)}")
    load_before = os.getloadavg()

    def arm(name: str) -> Any:
        def run(i: int) -> dict[str, float]:
            if name.startswith("groups"):
                r, size = one_groups_run(name, args.kill_step, RDZV_CONF), "groups_after"
            else:
                r, size = one_run(name, args.kill_step), "world_size_after"
            print(
                f"round {i + 1}/{args.repeats} {name}: first step {r['first_step_s']:.2f}s after the kill "
                f"({size} {r[size]:.0f})",
                file=sys.stderr,
                flush=True,
            )
            return r

        return run

    results = dict(zip(arms, rotate(args.repeats, *(arm(a) for a in arms)), strict=True))
    out: dict[str, Any] = {"commit": commit(), "repeats": args.repeats, "kill_step": args.kill_step}
    out["rdzv_conf"] = RDZV_CONF
    for a, rs in results.items():
        key = "first_commit" if a.startswith("groups") else "first_step"
        out.update(mean_ci([r["first_step_s"] for r in rs]).as_json(f"node_loss_{key}_s_{a}", 3))
        out[f"samples_{a}"] = rs
        keys = GROUPS_BREAKDOWN if a.startswith("groups") else BREAKDOWN
        out[f"breakdown_{a}"] = {k: round(sum(r[k] for r in rs) / len(rs), 3) for k in keys}
    met = True
    if {"spare", "torchrun_spare", "torchrun_1to2"} <= set(arms):
        best = min(("torchrun_spare", "torchrun_1to2"), key=lambda a: out[f"node_loss_first_step_s_{a}"])
        out["torchrun_baseline_arm"] = best
        out.update(
            mean_ci([r["first_step_s"] for r in results[best]]).as_json("node_loss_first_step_s_torchrun", 3)
        )
        spare = [r["first_step_s"] for r in results["spare"]]
        out.update(
            ratio_ci(spare, [r["first_step_s"] for r in results[best]]).as_json("ratio_vs_torchrun", 3)
        )
        out["target_ratio_vs_torchrun"] = 0.3
        met = out["ratio_vs_torchrun"] <= 0.3
    if {"groups_spare", "groups_nospare"} <= set(arms):  # the spare against a restart at once
        spare, nospare = ([r["first_step_s"] for r in results[a]] for a in ("groups_spare", "groups_nospare"))
        out.update(ratio_ci(spare, nospare).as_json("ratio_groups_spare_vs_nospare", 3))
    out["load_avg_before"] = [round(x, 2) for x in load_before]
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for a in arms:
            key = "first_commit" if a.startswith("groups") else "first_step"
            print(f"{a:15s} {out[f'node_loss_{key}_s_{a}']:7.2f}s  {out[f'breakdown_{a}']}")
        if "ratio_vs_torchrun" in out:
            print(
                f"ratio_vs_torchrun {out['ratio_vs_torchrun']} (baseline {out['torchrun_baseline_arm']}; target <= 0.3)"
            )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
