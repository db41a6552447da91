"""Checkpoints, routes and raw SQL for the store tests (tests/stores/), and release 0.1's
store schema (test_stores_sqlite.py, test_latest_checkpoints.py)."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from dpone_native_transfer.checkpoints import PartitionCheckpoint, RouteKey, Strategy

from .postgres_server import PostgresLocation

ROUTE = RouteKey("src.orders", "dst.orders", Strategy.INCREMENTAL_APPEND)
OTHER_ROUTE = RouteKey("src.orders", "dst.orders", Strategy.FULL_REFRESH)
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def make_checkpoint(
    partition_id: str = "p-1", route: RouteKey = ROUTE, **changes: Any
) -> PartitionCheckpoint:
    fields: dict[str, Any] = {
        "partition_id": partition_id,
        "route": route,
        "status": "exported",
        "run_id": "run-1",
        "query_hash": "sha256:" + "a" * 64,
        "schema_hash": "sha256:" + "b" * 64,
        "partition_bounds": {"id": [0, 100]},
        "started_at": T0,
        "completed_at": None,
        "rows_exported": 10,
        "diagnostics": {},
    }
    fields.update(changes)
    return PartitionCheckpoint(**fields)


def sqlite_raw(path: Path, *statements: tuple[str, tuple[Any, ...]] | str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql, params)
    finally:
        conn.close()


def postgres_raw(
    location: PostgresLocation, *statements: tuple[str, tuple[Any, ...]] | str
) -> None:
    """``sqlite_raw`` for PostgreSQL: "?" placeholders, the test's schema first on the
    search path."""
    with psycopg.connect(location.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{location.schema}"')
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql.replace("?", "%s"), params)


# What release 0.1 wrote as schema version 1 (its summary-less ``checkpoint_latest``).
VERSION_1_SCHEMA = (
    """CREATE TABLE checkpoint_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, source_table TEXT NOT NULL,
        target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        partition_id TEXT NOT NULL, payload TEXT NOT NULL)""",
    "CREATE INDEX checkpoint_history_by_route"
    " ON checkpoint_history (source_table, target_table, strategy, seq)",
    """CREATE TABLE checkpoint_latest (
        source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        partition_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
        PRIMARY KEY (source_table, target_table, strategy, partition_id)) WITHOUT ROWID""",
    """CREATE TABLE source_state (
        source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        state TEXT NOT NULL, PRIMARY KEY (source_table, target_table, strategy)) WITHOUT ROWID""",
    """CREATE TABLE evidence (
        source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL,
        PRIMARY KEY (source_table, target_table, strategy, run_id)) WITHOUT ROWID""",
    "CREATE INDEX evidence_by_route ON evidence (source_table, target_table, strategy, seq)",
    """CREATE TABLE audit (
        audit_id INTEGER PRIMARY KEY AUTOINCREMENT, source_table TEXT NOT NULL,
        target_table TEXT NOT NULL, strategy TEXT NOT NULL, record TEXT NOT NULL)""",
)
_V1_COLUMNS = {
    "checkpoint_history": "seq, source_table, target_table, strategy, partition_id, payload",
    "checkpoint_latest": "source_table, target_table, strategy, partition_id, seq, payload",
    "source_state": "source_table, target_table, strategy, state",
    "evidence": "source_table, target_table, strategy, run_id, seq, record",
    "audit": "audit_id, source_table, target_table, strategy, record",
}


def make_version_1(path: Path) -> None:
    """Rewrite a store file (of unlocated routes) as release 0.1 wrote it: schema version 1."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = {
            table: db.execute(f"SELECT {columns} FROM {table}").fetchall()
            for table, columns in _V1_COLUMNS.items()
        }
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN")
        for statement in VERSION_1_SCHEMA:
            db.execute(statement)
        for table, columns in _V1_COLUMNS.items():
            marks = ", ".join("?" * len(columns.split(",")))
            db.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows[table])
        db.execute("PRAGMA user_version = 1")
        db.execute("COMMIT")


# The four triggers of schema version 3 (releases before version 4), verbatim: one summary
# trigger and one key-twice trigger for each of INSERT and UPDATE.
_V3_SUMMARY = (
    "CREATE TRIGGER checkpoint_latest_summary_on_{name} AFTER {event} ON checkpoint_latest WHEN "
    "NEW.status IS NOT (NEW.payload ->> '$.status') OR NEW.query_hash IS NOT (NEW.payload ->> "
    "'$.query_hash') OR NEW.schema_hash IS NOT (NEW.payload ->> '$.schema_hash') OR "
    "json(NEW.guard) IS NOT (NEW.payload -> '$.diagnostics.target_commit_guard') OR "
    "NEW.ledger_batch IS NOT (NEW.payload ->> '$.diagnostics.ledger_batch_id') BEGIN UPDATE "
    "checkpoint_latest SET status = NEW.payload ->> '$.status', query_hash = NEW.payload ->> "
    "'$.query_hash', schema_hash = NEW.payload ->> '$.schema_hash', guard = NEW.payload -> "
    "'$.diagnostics.target_commit_guard', ledger_batch = NEW.payload ->> "
    "'$.diagnostics.ledger_batch_id' WHERE rowid = NEW.rowid; END"
)
_V3_UNIQUE_KEYS = (
    "CREATE TRIGGER checkpoint_latest_unique_keys_on_{name} BEFORE {event} ON checkpoint_latest "
    "WHEN (json_extract(json_remove(NEW.payload, '$.status', '$.query_hash', '$.schema_hash', "
    "'$.diagnostics.target_commit_guard', '$.diagnostics.ledger_batch_id'), '$.status', "
    "'$.query_hash', '$.schema_hash', '$.diagnostics.target_commit_guard', "
    "'$.diagnostics.ledger_batch_id') IS NOT '[null,null,null,null,null]' OR "
    "json_type(json_remove(NEW.payload, '$.diagnostics'), '$.diagnostics') IS NOT NULL) BEGIN "
    "SELECT RAISE(ABORT, 'checkpoint payload holds a key twice'); END"
)
VERSION_3_TRIGGERS = (
    _V3_SUMMARY.format(name="insert", event="INSERT"),
    _V3_SUMMARY.format(name="update", event="UPDATE"),
    _V3_UNIQUE_KEYS.format(name="insert", event="INSERT"),
    _V3_UNIQUE_KEYS.format(name="update", event="UPDATE OF payload"),
)


def make_version_4(path: Path) -> None:
    """Rewrite a store file as the releases of schema version 4 left it: leases without epochs."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN")
        db.execute("ALTER TABLE lease DROP COLUMN epoch")
        db.execute("PRAGMA user_version = 4")
        db.execute("COMMIT")


def make_version_3(path: Path) -> None:
    """Rewrite a store file as the releases of schema version 3 left it: their four triggers."""
    make_version_4(path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN")
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall():
            db.execute(f'DROP TRIGGER "{name}"')
        for statement in VERSION_3_TRIGGERS:
            db.execute(statement)
        db.execute("PRAGMA user_version = 3")
        db.execute("COMMIT")


def sqlite_lock_free(path: Path, *, begin: str = "EXCLUSIVE", timeout: float = 0) -> bool:
    """Whether ``BEGIN {begin}`` on the SQLite file ``path`` succeeds within ``timeout``
    seconds: EXCLUSIVE, no connection reads or writes it; IMMEDIATE, none writes it. The lock
    is given back at once."""
    with contextlib.closing(sqlite3.connect(path, timeout=timeout, isolation_level=None)) as db:
        try:
            db.execute(f"BEGIN {begin}")
        except sqlite3.OperationalError:
            return False
        db.execute("ROLLBACK")
        return True
