"""The incident store's schema and its migrations, one list for both backends.

Migration N takes a store at version N-1 to N; they run in order inside one transaction that
holds the backend's migration lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock),
so two processes opening a fresh store at once cannot both apply them. The version is SQLite's
``PRAGMA user_version`` or PostgreSQL's ``trainguard_schema`` table. A store from a newer
trainguard is refused. Never edit a released migration: append one.

The SQL is written once; `render` adapts it: ``{serial}`` is the auto-numbered primary key,
PostgreSQL gets DOUBLE PRECISION for REAL (unix times need 53 bits) and BIGINT for INTEGER.

    jobs(job PK, name, command, started, ended, status, world_size, host, rack, node_group)
    incidents(id PK, job, time, started, root_cause, category, action, summary, evidence JSON,
              gpu, node, rank, attempt, detected_by, detection_delay_s, time_lost_s,
              resolved, resolution, host, rack, node_group, gpu_uuid, key UNIQUE)
    intervals(id PK, job, kind, start, "end", attempt, detail, host, rack, node_group, key UNIQUE)
    progress(job, time, step, loss, attempt, host, rack, node_group, key UNIQUE)
    -- 2: the fleet
    nodes(host PK, rack, node_group, gpu_uuids JSON, health, action, reason, since, last_seen)
    verdicts(id PK, key UNIQUE, host, rack, node_group, gpu (-1: the node), gpu_uuid, time,
             health, action, reason)                         changes only, not every tick
    gpu_failures(host, gpu (-1: the node), gpu_uuid, rack, node_group, incidents, first_time,
                 last_time; PK host, gpu)                    counters kept with each incident
    attempts(job, attempt, host PK; rack, node_group, started, ended, status)
    remediation_actions(id PK, key UNIQUE, time, host, rack, node_group, gpu, gpu_uuid, action,
                        target, outcome, detail, incident_key, source)
    breaker_events(id PK, key UNIQUE, time, host, rack, node_group, gpu, gpu_uuid, breaker,
                   state, reason, source)
    -- 3: the telemetry series the node agents keep (incidents/series.py)
    series(host, gpu (-1: the node), t, step_s, n, gpu_uuid, rack, node_group, data JSON;
           PK host, gpu, t)                                  one row per GPU and step

``key`` is the idempotency key of a written row (`incidents.fleet.row_key`): inserting a row
twice (a retry, a spool replay) keeps one. Rows from before migration 2 have no key.
"""

from __future__ import annotations

import re
from typing import Any

from trainguard.errors import StoreError, StoreUnavailable

MIGRATIONS: tuple[str, ...] = (
    # 1: initial schema
    """
    CREATE TABLE jobs (
        job TEXT PRIMARY KEY,
        name TEXT,
        command TEXT,
        started REAL,
        ended REAL,
        status TEXT,
        world_size INTEGER
    );
    CREATE TABLE incidents (
        id {serial},
        job TEXT NOT NULL,
        time REAL NOT NULL,
        started REAL,
        root_cause TEXT NOT NULL,
        category TEXT,
        action TEXT NOT NULL,
        summary TEXT NOT NULL DEFAULT '',
        evidence TEXT NOT NULL DEFAULT '[]',
        gpu INTEGER,
        node TEXT,
        rank INTEGER,
        attempt INTEGER,
        detected_by TEXT,
        detection_delay_s REAL,
        time_lost_s REAL,
        resolved INTEGER NOT NULL DEFAULT 0,
        resolution TEXT
    );
    CREATE INDEX incidents_job_time ON incidents (job, time);
    CREATE INDEX incidents_time ON incidents (time);
    CREATE TABLE intervals (
        id {serial},
        job TEXT NOT NULL,
        kind TEXT NOT NULL,
        start REAL NOT NULL,
        "end" REAL NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        detail TEXT NOT NULL DEFAULT '',
        CHECK ("end" >= start)
    );
    CREATE INDEX intervals_job_start ON intervals (job, start);
    CREATE TABLE progress (
        job TEXT NOT NULL,
        time REAL NOT NULL,
        step INTEGER NOT NULL,
        loss REAL,
        attempt INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX progress_job_time ON progress (job, time);
    """,
    # 2: the fleet: node identity on every row, idempotency keys, nodes, verdicts, breakers
    """
    ALTER TABLE incidents ADD COLUMN host TEXT;
    ALTER TABLE incidents ADD COLUMN rack TEXT;
    ALTER TABLE incidents ADD COLUMN node_group TEXT;
    ALTER TABLE incidents ADD COLUMN gpu_uuid TEXT;
    ALTER TABLE incidents ADD COLUMN key TEXT;
    CREATE UNIQUE INDEX incidents_key ON incidents (key);
    CREATE INDEX incidents_host_time ON incidents (host, time);
    CREATE INDEX incidents_group_time ON incidents (node_group, time);
    ALTER TABLE jobs ADD COLUMN host TEXT;
    ALTER TABLE jobs ADD COLUMN rack TEXT;
    ALTER TABLE jobs ADD COLUMN node_group TEXT;
    ALTER TABLE intervals ADD COLUMN host TEXT;
    ALTER TABLE intervals ADD COLUMN rack TEXT;
    ALTER TABLE intervals ADD COLUMN node_group TEXT;
    ALTER TABLE intervals ADD COLUMN key TEXT;
    CREATE UNIQUE INDEX intervals_key ON intervals (key);
    ALTER TABLE progress ADD COLUMN host TEXT;
    ALTER TABLE progress ADD COLUMN rack TEXT;
    ALTER TABLE progress ADD COLUMN node_group TEXT;
    ALTER TABLE progress ADD COLUMN key TEXT;
    CREATE UNIQUE INDEX progress_key ON progress (key);
    CREATE TABLE nodes (
        host TEXT PRIMARY KEY,
        rack TEXT,
        node_group TEXT,
        gpu_uuids TEXT NOT NULL DEFAULT '[]',
        health TEXT NOT NULL DEFAULT 'unknown',
        action TEXT NOT NULL DEFAULT 'none',
        reason TEXT NOT NULL DEFAULT '',
        since REAL,
        last_seen REAL
    );
    CREATE INDEX nodes_group ON nodes (node_group, rack);
    CREATE TABLE verdicts (
        id {serial},
        key TEXT NOT NULL UNIQUE,
        host TEXT NOT NULL,
        rack TEXT,
        node_group TEXT,
        gpu INTEGER NOT NULL,
        gpu_uuid TEXT,
        time REAL NOT NULL,
        health TEXT NOT NULL,
        action TEXT NOT NULL DEFAULT 'none',
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX verdicts_host_time ON verdicts (host, time);
    CREATE TABLE gpu_failures (
        host TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        gpu_uuid TEXT,
        rack TEXT,
        node_group TEXT,
        incidents INTEGER NOT NULL DEFAULT 0,
        first_time REAL,
        last_time REAL,
        PRIMARY KEY (host, gpu)
    );
    CREATE INDEX gpu_failures_count ON gpu_failures (incidents);
    CREATE TABLE attempts (
        job TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        host TEXT NOT NULL,
        rack TEXT,
        node_group TEXT,
        started REAL,
        ended REAL,
        status TEXT,
        PRIMARY KEY (job, attempt, host)
    );
    CREATE TABLE remediation_actions (
        id {serial},
        key TEXT NOT NULL UNIQUE,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        rack TEXT,
        node_group TEXT,
        gpu INTEGER,
        gpu_uuid TEXT,
        action TEXT NOT NULL,
        target TEXT,
        outcome TEXT,
        detail TEXT NOT NULL DEFAULT '',
        incident_key TEXT,
        source TEXT
    );
    CREATE INDEX remediation_actions_host_time ON remediation_actions (host, time);
    CREATE TABLE breaker_events (
        id {serial},
        key TEXT NOT NULL UNIQUE,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        rack TEXT,
        node_group TEXT,
        gpu INTEGER,
        gpu_uuid TEXT,
        breaker TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        source TEXT
    );
    CREATE INDEX breaker_events_time ON breaker_events (time);
    CREATE INDEX breaker_events_breaker ON breaker_events (breaker, time)
    """,
    # 3: the telemetry series: per GPU and step, down-sampled readings and event counts
    """
    CREATE TABLE series (
        host TEXT NOT NULL,
        gpu INTEGER NOT NULL,
        t REAL NOT NULL,
        step_s REAL NOT NULL,
        n INTEGER NOT NULL,
        gpu_uuid TEXT,
        rack TEXT,
        node_group TEXT,
        data TEXT NOT NULL,
        PRIMARY KEY (host, gpu, t)
    );
    CREATE INDEX series_t ON series (t)
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def render(script: str, dialect: str) -> list[str]:
    """The statements of a migration in one backend's SQL."""
    serial = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    if dialect == "sqlite":
        serial = "INTEGER PRIMARY KEY AUTOINCREMENT"
    else:
        script = re.sub(r"\bREAL\b", "DOUBLE PRECISION", script)
        script = re.sub(r"\bINTEGER\b", "BIGINT", script)
    script = script.replace("{serial}", serial)
    # executescript() would COMMIT our open transaction first: statement by statement instead.
    return [s.strip() for s in script.split(";") if s.strip()]


def migrate(backend: Any) -> int:
    """Bring the store to SCHEMA_VERSION; returns the version found before.

    Raises ValueError if the store was written by a newer trainguard (the caller names it).
    """
    found: int | None = None
    try:
        with backend.transaction() as tx:
            backend.migration_lock(tx)
            found = backend.schema_version(tx)
            if found > SCHEMA_VERSION:
                raise ValueError(
                    f"schema version {found} is newer than this trainguard understands ({SCHEMA_VERSION}); "
                    "upgrade trainguard to read it"
                )
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in render(MIGRATIONS[version - 1], backend.dialect):
                    tx.run(statement)
            if found != SCHEMA_VERSION:
                backend.set_schema_version(tx, SCHEMA_VERSION)
    except StoreError as exc:
        if isinstance(exc, StoreUnavailable) or found is None or found >= SCHEMA_VERSION:
            raise
        # A node's writer role may not change the schema (incidents/roles.py): say who may.
        raise StoreError(
            f"{exc} (migrating the schema from version {found} to {SCHEMA_VERSION}: run "
            "`trainguard fleet migrate` as the role that owns the store's tables)"
        ) from None
    return found
