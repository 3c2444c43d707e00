"""The fleet store at fleet size: 2,000 simulated nodes x 8 GPUs writing verdict changes and
incident bursts (a rack failing at once) into a real PostgreSQL, and the fleet queries on top
of 1 million incident rows.

    python benchmarks/bench_fleet_store.py              # a table
    python benchmarks/bench_fleet_store.py --json       # the figures as JSON
    python benchmarks/bench_fleet_store.py --base-incidents 100000 --repeats 2   # quicker
    python benchmarks/bench_fleet_store.py --quick      # 20,000 base rows: that it runs

PostgreSQL is Debian's (postgresql-15), started in a temp dir on loopback with its defaults
(fsync on; verdict transactions commit without waiting for the WAL flush, incidents wait).
Setup bulk-loads the base rows (1 M incidents over 90 days, the nodes, the failure counters)
with COPY; the measured ingest goes through the real code path: one `IncidentStore` (with its
spool, as an agent opens it) per writer process, one `FleetWriter` per simulated node, each
verdict change and each incident its own transaction. A round: 5% of the nodes change a GPU's
verdict (and change it back the next round), and one rack of 20 nodes fails at once (8
incidents and a verdict change per node). Meanwhile every node's heartbeat runs (a node-row
write per node every --heartbeat-s of wall time, 33 a second for 2,000 nodes at 60 s: the fleet's
steady load), and an operator's dashboard runs `fleet_read.status`, a bare ``SELECT 1`` and
`fleet_read.lemons` in a loop (exactly as ``trainguard fleet status|lemons`` run them, a
--dashboard-pause-s pause between rounds): the query figures are its, timed during the ingest.
The same queries are timed again after the ingest, on a quiet database (``*_after_ingest``).
The base rows are VACUUM ANALYZEd once after the COPY (what autovacuum gives a running
database); the rows written during the run are not.

Baseline (same run, interleaved A B A B): one node's SQLite store (the embedded default) with
that node's share of the base rows (1 M / 2,000) and one node's writes through the same code,
with its heartbeat and the same dashboard.

Keys: ingest_rows_per_s (target >= 5,000 on 2 cores), status_query_p99_ms, lemons_query_p99_ms
(targets <= 100 ms with 1 M incident rows, timed during the ingest), their p50s, the same after
the ingest (``*_after_ingest``) and for sqlite_* (one node), with 95% CIs over the repeats;
ingest_rows_per_cpu_s (rows per CPU-second of writers, heartbeats and server together: what the
machine's load does not change), ingest_cores_busy (those CPU-seconds per second of ingest: 2 is
both cores; under other jobs' load it says what share they left) and
ingest_rows_per_s_2_free_cores_est (twice the rows per CPU-second); roundtrip_p50_ms /
roundtrip_p99_ms: a bare ``SELECT 1`` between the queries, the floor any query pays on this
machine at this moment; heartbeats_per_repeat, dashboard_rounds_per_repeat; load_average_1m
(min and max over the repeats).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from paired import mean_ci
from targets import Target, finish
from trainguard.incidents import IncidentStore, RootCause
from trainguard.incidents import fleet_read as fr
from trainguard.incidents.fleet import NODE, FleetWriter
from trainguard.incidents.identity import NodeIdentity, row_key
from trainguard.incidents.incident import Incident
from trainguard.incidents.store import HARDWARE_CAUSES

NODES, GPUS, RACK = 2000, 8, 20
DAY = 86400.0
CAUSES = [c.value for c in RootCause]
WEIGHTS = [6 if c in HARDWARE_CAUSES else 2 for c in CAUSES]
OK = ("ok", "none", "")


def identity(n: int) -> NodeIdentity:
    return NodeIdentity(
        f"gpu{n:05d}", rack=f"rack{n // RACK:03d}", group=f"pool{n % 4}",
        gpu_uuids=tuple(f"GPU-{n:05d}-{g}" for g in range(GPUS)),
    )  # fmt: skip


def bulk_load(store: IncidentStore, nodes: list[int], n_incidents: int, now: float, seed: int) -> None:
    """The base rows with COPY (PostgreSQL) or one executemany (SQLite): setup, not measured."""
    rng = random.Random(seed)
    cols = ("job", "time", "root_cause", "action", "summary", "evidence", "gpu", "rank", "resolved",
            "host", "rack", "node_group", "gpu_uuid", "key")  # fmt: skip
    ids = [identity(n) for n in nodes]

    def rows():  # type: ignore[no-untyped-def]
        for k in range(n_incidents):
            node = (
                ids[rng.randrange(len(ids))] if rng.random() > 0.2 else ids[k % min(20, len(ids))]
            )  # lemons
            gpu = rng.randrange(GPUS)
            cause = rng.choices(CAUSES, WEIGHTS)[0]
            t = now - rng.random() * 90 * DAY
            yield (f"job-{k % 500}", t, cause, "restart", f"base incident {k}", "[]", gpu, gpu, 0, node.host,
                   node.rack, node.group, node.uuid_of(gpu), row_key("base", k))  # fmt: skip

    store.backend.copy_rows("incidents", cols, rows())
    node_cols = (
        "host",
        "rack",
        "node_group",
        "gpu_uuids",
        "health",
        "action",
        "reason",
        "since",
        "last_seen",
    )
    store.backend.copy_rows(
        "nodes",
        node_cols,
        iter(
            [
                (i.host, i.rack, i.group, json.dumps(list(i.gpu_uuids)), "ok", "none", "", now, now)
                for i in ids
            ]
        ),
    )
    hw = ", ".join(f"'{c}'" for c in sorted(HARDWARE_CAUSES))
    with store.backend.transaction() as tx:
        tx.run(
            "INSERT INTO gpu_failures (host, gpu, gpu_uuid, rack, node_group, incidents, first_time, last_time) "
            "SELECT host, gpu, MAX(gpu_uuid), MAX(rack), MAX(node_group), COUNT(*), MIN(time), MAX(time) "
            f"FROM incidents WHERE root_cause IN ({hw}) GROUP BY host, gpu"
        )
    # What autovacuum gives a running database: statistics and the visibility map (index-only scans).
    store.backend.read("VACUUM ANALYZE" if store.backend.dialect == "postgresql" else "ANALYZE")


def ingest(
    target: str,
    nodes: list[int],
    rounds: int,
    writers: int,
    spool_dir: Path,
    seed: int,
    server_pid: int = 0,
    *,
    heartbeat_s: float = 60.0,
    dashboard_pause_s: float | None = None,
) -> dict[str, Any]:
    """The measured writes from ``writers`` processes (agents are processes: no shared GIL), while
    every node's heartbeat (one node-row write per node every ``heartbeat_s`` of wall time: the
    fleet's steady load) runs in its own process, and, with ``dashboard_pause_s``, an operator's
    dashboard runs the fleet queries in a loop (that pause between rounds): their milliseconds
    are timed during the ingest, as a dashboard sees them."""
    rng = random.Random(seed)
    racks = sorted({n // RACK for n in nodes})
    plan: list[list[tuple[str, int, int]]] = [[] for _ in range(writers)]  # per writer: (kind, node, arg)
    base_t = time.time()
    for r in range(rounds):
        changing = rng.sample(nodes, max(1, len(nodes) // 20))
        failing = [n for n in nodes if n // RACK == racks[r % len(racks)]]
        for n in changing:
            plan[n % writers].append(("flip", n, rng.randrange(GPUS)))
        for n in failing:
            plan[n % writers].append(("burst", n, r))
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Barrier(writers + 1)  # connected and migrated, as running agents are
    results = ctx.SimpleQueue()
    procs = [
        ctx.Process(
            target=_writer, args=(target, plan[w], spool_dir / f"spool-{w}.jsonl", base_t, ready, results)
        )
        for w in range(writers)
    ]
    done = ctx.Event()
    side = ctx.SimpleQueue()
    helpers = []
    if heartbeat_s > 0:
        helpers.append(ctx.Process(target=_heartbeats, args=(target, nodes, heartbeat_s, done, side)))
    if dashboard_pause_s is not None:
        helpers.append(ctx.Process(target=_dashboard, args=(target, dashboard_pause_s, done, side)))
    for p in [*helpers, *procs]:
        p.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait(timeout=300)
    t0 = time.perf_counter()
    server0 = server_cpu_s(server_pid) if server_pid else 0.0
    got = [results.get() for _ in procs]
    seconds = time.perf_counter() - t0
    server_s = server_cpu_s(server_pid) - server0 if server_pid else 0.0
    done.set()
    extra = dict(side.get() for _ in helpers)
    for p in [*procs, *helpers]:
        p.join()
    failed = [g for g in [*got, *extra.values()] if isinstance(g, str)]
    if failed:
        raise RuntimeError(f"a writer failed: {failed[0]}")
    rows = sum(g[0] for g in got)
    beats = extra.get("heartbeats", (0, 0.0))
    # The writers' own CPU after connecting, the heartbeats', and the server's (the dashboard's
    # queries run on the server too: its share is in server_s, its client's is left out)
    cpu = sum(g[1] for g in got) + beats[1] + server_s
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "rows_per_cpu_s": rows / cpu,
            "cores_busy": cpu / seconds, "heartbeats": beats[0], "queries": extra.get("dashboard")}  # fmt: skip


def _heartbeats(target: str, nodes: list[int], every_s: float, done: Any, out: Any) -> None:
    """Every node's heartbeat, paced over wall time: ``len(nodes)`` node-row writes every ``every_s``."""
    beats = 0
    try:
        with IncidentStore(target, identity=identity(nodes[0])) as store:
            cpu0, t0 = time.process_time(), time.monotonic()
            writers = {n: FleetWriter(store, identity(n), heartbeat_s=0.0) for n in nodes}
            for w in writers.values():
                w._last = dict.fromkeys([NODE, *range(GPUS)], OK)
            while not done.is_set():
                n = nodes[beats % len(nodes)]
                done.wait(max(0.0, t0 + beats * every_s / len(nodes) - time.monotonic()))
                writers[n].record({NODE: OK}, time.time(), OK)  # nothing changed: the node row's last_seen
                beats += 1
            out.put(("heartbeats", (beats, time.process_time() - cpu0)))
    except BaseException as exc:
        out.put(("heartbeats", f"{type(exc).__name__}: {exc}"))


def _dashboard(target: str, pause_s: float, done: Any, out: Any) -> None:
    """An operator's dashboard during the ingest: status, a round trip and lemons, then a pause."""
    try:
        times: dict[str, list[float]] = {"status": [], "lemons": [], "roundtrip": []}
        with IncidentStore(target) as store:
            while not done.is_set():
                for name, fn in (("status", fr.status), ("roundtrip", _roundtrip), ("lemons", fr.lemons)):
                    t0 = time.perf_counter()
                    fn(store)
                    times[name].append((time.perf_counter() - t0) * 1000)
                done.wait(pause_s)
        out.put(("dashboard", times))
    except BaseException as exc:
        out.put(("dashboard", f"{type(exc).__name__}: {exc}"))


def _roundtrip(store: IncidentStore) -> None:
    store.read("SELECT 1 AS one")


def server_cpu_s(pid: int) -> float:
    """CPU seconds of the PostgreSQL server: the postmaster, its live children and reaped ones."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ppid, utime, stime, cutime, cstime = int(fields[1]), *(int(f) for f in fields[11:15])
        if int(entry.name) == pid:
            total += (utime + stime + cutime + cstime) / tick
        elif ppid == pid:
            total += (utime + stime) / tick
    return total


def _writer(
    target: str, plan: list[tuple[str, int, int]], spool: Path, base_t: float, ready: Any, out: Any
) -> None:
    """One writer process: the agents of its nodes, each with its own FleetWriter."""
    count = 0
    try:
        with IncidentStore(target, spool=spool, identity=identity(plan[0][1] if plan else 0)) as store:
            store.read("SELECT 1 AS one")
            ready.wait(timeout=300)
            cpu0 = time.process_time()
            writers: dict[int, FleetWriter] = {}
            bad: dict[int, set[int]] = {}
            for step, (kind, n, arg) in enumerate(plan):
                w = writers.get(n)
                if w is None:
                    w = writers[n] = FleetWriter(store, identity(n), heartbeat_s=1e12)
                    w._last = dict.fromkeys([NODE, *range(GPUS)], OK)  # as after its first tick
                    w._last_write = base_t
                now = base_t + step * 1e-3
                failed = bad.setdefault(n, set())
                if kind == "flip":
                    failed ^= {arg}
                    states = {g: ("degraded", "none", "ecc") if g in failed else OK for g in range(GPUS)}
                else:
                    burst = [
                        Incident(f"job-r{arg}", now, RootCause.FAULTY_GPU, "exclude_gpu",
                                 f"rack burst {arg}: GPU {g} fell off the bus", gpu=g, rank=g)
                        for g in range(GPUS)
                    ]  # fmt: skip
                    store.add_many(burst, identity(n))  # one agent tick: its incidents at once
                    count += len(burst)
                    failed |= set(range(GPUS))
                    states = {g: ("failed", "exclude_gpu", "Xid 79") for g in range(GPUS)}
                node_state = ("failed", "exclude_gpu", "x") if failed else OK
                states[NODE] = node_state
                count += w.record(states, now, node_state)
            if store.spool_depth:
                raise RuntimeError(f"{store.spool_depth} writes left in the spool")
            out.put((count, time.process_time() - cpu0))
    except BaseException as exc:
        ready.abort()
        out.put(f"{type(exc).__name__}: {exc}")


def query_ms(target: str, repeats: int) -> dict[str, list[float]]:
    """Each query's milliseconds, interleaved with the baseline: one bare ``SELECT 1`` round trip."""
    out: dict[str, list[float]] = {"status": [], "lemons": [], "roundtrip": []}

    with IncidentStore(target) as store:
        fr.status(store)
        fr.lemons(store)  # warm the connection and the caches, as a running service has them
        for _ in range(repeats):
            for name, fn in (("status", fr.status), ("roundtrip", _roundtrip), ("lemons", fr.lemons)):
                t0 = time.perf_counter()
                fn(store)
                out[name].append((time.perf_counter() - t0) * 1000)
    return out


def _add_queries(into: dict[str, list[float]], times: dict[str, list[float]] | None, when: str) -> None:
    """Each query kind's p99 (``status``...) and p50 (``status_p50``...) of one repeat, ``when`` appended."""
    for k, v in (times or {}).items():
        if v:
            into[k + when].append(p99(v))
            into[k + "_p50" + when].append(statistics.median(v))
    if times and when == "":
        into["dashboard_rounds"].append(float(len(times["status"])))


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


def ci95(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): paired.mean_ci's t-interval; one repeat is its own interval."""
    est = mean_ci(values)
    low, high = est.ci95 or (est.value, est.value)
    return est.value, low, high


TARGETS = (
    Target("ingest_rows_per_s", ">=", 5000),
    Target("status_query_p99_ms", "<=", 100),
    Target("lemons_query_p99_ms", "<=", 100),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--base-incidents", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=10, help="ingest rounds per repeat (default 10)")
    ap.add_argument("--writers", type=int, default=8, help="writer processes (default 8)")
    ap.add_argument(
        "--repeats", type=int, default=3, help="interleaved PostgreSQL/SQLite repeats (default 3)"
    )
    ap.add_argument("--queries", type=int, default=100, help="timed queries of each kind after the ingest")
    ap.add_argument(
        "--heartbeat-s", type=float, default=60.0, help="each node's heartbeat (default 60 s; 0: off)"
    )
    ap.add_argument(
        "--dashboard-pause-s", type=float, default=0.2, help="the dashboard's pause between query rounds"
    )
    ap.add_argument(
        "--quick", action="store_true", help="20,000 base rows, 2 repeats of 3 rounds: that it runs"
    )
    args = ap.parse_args()
    if args.quick:
        args.base_incidents, args.repeats, args.rounds, args.queries = 20_000, 2, 3, 20
    from pgserver import running_server

    now = time.time()
    result: dict[str, Any] = {"nodes": NODES, "gpus_per_node": GPUS, "base_incidents": args.base_incidents,
                              "writer_processes": args.writers}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, running_server() as pg:
        url = pg.url(pg.create_db())
        sqlite = str(Path(tmp) / "node.db")
        t0 = time.perf_counter()
        with IncidentStore(url) as store:
            bulk_load(store, list(range(NODES)), args.base_incidents, now, seed=1)
        result["setup_copy_s"] = time.perf_counter() - t0
        with IncidentStore(sqlite) as store:
            bulk_load(store, [0], args.base_incidents // NODES, now, seed=1)
        pg_cpu: list[float] = []
        sq_cpu: list[float] = []
        pg_ingest, sq_ingest, pg_q, sq_q = [], [], defaultdict(list), defaultdict(list)
        pg_busy, beats, loads = [], [], [os.getloadavg()[0]]
        side = {"heartbeat_s": args.heartbeat_s, "dashboard_pause_s": args.dashboard_pause_s}
        for rep in range(args.repeats):  # A B A B
            assert pg.proc is not None
            r = ingest(
                url, list(range(NODES)), args.rounds, args.writers, Path(tmp), 10 + rep, pg.proc.pid, **side
            )
            pg_ingest.append(r["rows_per_s"])
            pg_cpu.append(r["rows_per_cpu_s"])
            pg_busy.append(r["cores_busy"])
            beats.append(r["heartbeats"])
            _add_queries(pg_q, r["queries"], "")
            _add_queries(pg_q, query_ms(url, args.queries), "_after_ingest")
            r = ingest(sqlite, [0], args.rounds * 20, 1, Path(tmp), seed=10 + rep, **side)
            sq_ingest.append(r["rows_per_s"])
            sq_cpu.append(r["rows_per_cpu_s"])
            _add_queries(sq_q, r["queries"], "")
            _add_queries(sq_q, query_ms(sqlite, args.queries), "_after_ingest")
            loads.append(os.getloadavg()[0])
        with IncidentStore(url) as store:
            result["incident_rows"] = store.read("SELECT COUNT(*) AS n FROM incidents")[0]["n"]
            result["verdict_rows"] = store.read("SELECT COUNT(*) AS n FROM verdicts")[0]["n"]
    figures = [("ingest_rows_per_s", pg_ingest), ("ingest_rows_per_cpu_s", pg_cpu), ("ingest_cores_busy", pg_busy),
               ("sqlite_ingest_rows_per_s", sq_ingest), ("sqlite_ingest_rows_per_cpu_s", sq_cpu)]  # fmt: skip
    for when in ("", "_after_ingest"):  # during the ingest (the dashboard's view), then after it
        for prefix, q in (("", pg_q), ("sqlite_", sq_q)):
            figures += [(f"{prefix}status_query_p99_ms{when}", q[f"status{when}"]),
                        (f"{prefix}lemons_query_p99_ms{when}", q[f"lemons{when}"]),
                        (f"{prefix}status_query_p50_ms{when}", q[f"status_p50{when}"]),
                        (f"{prefix}lemons_query_p50_ms{when}", q[f"lemons_p50{when}"]),
                        (f"{prefix}roundtrip_p50_ms{when}", q[f"roundtrip_p50{when}"]),
                        (f"{prefix}roundtrip_p99_ms{when}", q[f"roundtrip{when}"])]  # fmt: skip
    result["dashboard_rounds_per_repeat"] = [int(x) for x in pg_q["dashboard_rounds"]]
    result["heartbeats_per_repeat"] = beats
    for name, values in figures:
        m, lo, hi = ci95(values)
        result[name] = round(m, 2)
        result[name + "_ci95"] = [round(lo, 2), round(hi, 2)]
        result[name + "_repeats"] = [round(v, 2) for v in values]
    result["ingest_vs_sqlite_one_node"] = round(
        result["ingest_rows_per_s"] / result["sqlite_ingest_rows_per_s"], 2
    )
    # CPU-bound on a shared machine: what 2 cores free for the writers and the server would carry.
    result["ingest_rows_per_s_2_free_cores_est"] = round(2 * result["ingest_rows_per_cpu_s"], 1)
    result["load_average_1m"] = [round(min(loads), 1), round(max(loads), 1)]
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k:<34} {v}")
    return finish("bench_fleet_store", TARGETS, result, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())
