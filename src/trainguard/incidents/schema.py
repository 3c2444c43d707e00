"""The incident store's SQLite schema and its migrations.

The schema version is SQLite's ``PRAGMA user_version``. Migration N takes a database at version
N-1 to N; they run in order inside one ``BEGIN IMMEDIATE`` transaction, so two processes
opening a fresh file at once cannot both apply them. Never edit a released migration: append one.

    jobs(job PK, name, command, started, ended, status, world_size)
    incidents(id PK, job, time, started, root_cause, category, action, summary, evidence JSON,
              gpu, node, rank, attempt, detected_by, detection_delay_s, time_lost_s,
              resolved, resolution)
    intervals(id PK, job, kind, start, end, attempt, detail)      the goodput ledger
    progress(job, time, step, loss, attempt)                        sampled steps for the timeline
"""

from __future__ import annotations

import sqlite3

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
        id INTEGER PRIMARY KEY AUTOINCREMENT,
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
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job TEXT NOT NULL,
        kind TEXT NOT NULL,
        start REAL NOT NULL,
        end REAL NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        detail TEXT NOT NULL DEFAULT '',
        CHECK (end >= start)
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
)

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to SCHEMA_VERSION; returns the version found before.

    Raises ValueError if the file was written by a newer trainguard (the caller names the file).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if found > SCHEMA_VERSION:
            raise ValueError(
                f"schema version {found} is newer than this trainguard understands ({SCHEMA_VERSION}); "
                "upgrade trainguard to read it"
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in _statements(MIGRATIONS[version - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return found


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT our open transaction first; run statement by statement instead.
    return [s.strip() for s in script.split(";") if s.strip()]
