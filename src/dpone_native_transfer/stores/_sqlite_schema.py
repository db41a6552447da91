"""The SQLite store's schema (version 5), its checks, and the migrations from versions 1 to 4.

Version 1 has the tables; version 2 adds summary columns to
``checkpoint_latest`` (ADR-0023); version 3 keys every record by the route's
locations too (``source_location``, ``target_location``: ``""`` for a route
written without them), adds the ``ledger_batch`` summary, the route-scan index
over a target table, and the ``lease`` table; version 4 keeps the summary with
one trigger per event instead of two, which also finds a key given twice whose
second value is ``null``; version 5 gives each lease key an epoch that only grows
(ADR-0024: the target's fence), kept when the lease is released. Opening an older file migrates
it in one write transaction per version, re-reading the version inside it
(another process may have migrated first); payloads and history are never
rewritten. Older releases refuse a newer file ("unknown schema version").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from ..checkpoints import GUARD_DIAGNOSTICS_KEY, LEDGER_BATCH_KEY
from ..errors import CheckpointStoreCorrupt, ConfigInvalid
from ._codec import ROUTE_NAMES

__all__ = [
    "ROUTE",
    "ROUTE_KEY",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SUMMARY_NAMES",
    "TARGET_LOCATED",
    "TARGET_UNLOCATED",
    "check_schema",
    "immediate",
    "migrate",
]

SCHEMA_VERSION = 5

_NAMES = "source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL"
# Appended last, as ALTER TABLE ADD COLUMN leaves them in a migrated file.
_LOCATIONS = "source_location TEXT NOT NULL DEFAULT '', target_location TEXT NOT NULL DEFAULT ''"
ROUTE_KEY = ", ".join(ROUTE_NAMES)
ROUTE = " AND ".join(f"{name} = ?" for name in ROUTE_NAMES)
# Every checkpoint writing one target table, in two disjoint parts queried one after the
# other (an OR of them makes SQLite read every row instead of the covering index): located
# ones of its database (exact name; parameters location, table, table), and, failing closed,
# unlocated ones whose target name matches ignoring case (parameter: table).
TARGET_LOCATED = "target_location = ? AND target_table = ? COLLATE NOCASE AND target_table = ?"
TARGET_UNLOCATED = "target_location = '' AND target_table = ? COLLATE NOCASE"

# What the route scan and the planner read instead of payloads (``latest.py``): SQL over
# the payload, kept current by the writer and, for any other writer, by triggers.
_SUMMARY = (
    ("status", "{p} ->> '$.status'"),
    ("query_hash", "{p} ->> '$.query_hash'"),
    ("schema_hash", "{p} ->> '$.schema_hash'"),
    ("guard", "{p} -> '$.diagnostics." + GUARD_DIAGNOSTICS_KEY + "'"),
    ("ledger_batch", "{p} ->> '$.diagnostics." + LEDGER_BATCH_KEY + "'"),
)
SUMMARY_NAMES = tuple(name for name, _ in _SUMMARY)
_V2_SUMMARY = SUMMARY_NAMES[:4]


def _summary_of(payload: str, names: tuple[str, ...] = SUMMARY_NAMES) -> list[str]:
    return [sql.format(p=payload) for name, sql in _SUMMARY if name in names]


# Where the summary reads the payload (``_SUMMARY``), as JSON paths.
_SUMMARY_PATHS = (
    "$.status",
    "$.query_hash",
    "$.schema_hash",
    f"$.diagnostics.{GUARD_DIAGNOSTICS_KEY}",
    f"$.diagnostics.{LEDGER_BATCH_KEY}",
)


def _holds_a_key_twice(payload: str) -> str:
    """SQL: true when ``payload`` holds a key the summary reads twice, where it reads it.

    ``json_remove`` drops the first of equal keys, so a key still found after it
    (``json_type``: a second ``null`` too) was there twice. A ``diagnostics``
    object given twice is found the same way. Other duplicated keys are refused
    by the readers (``strict_json``).
    """
    paths = ", ".join(f"'{path}'" for path in _SUMMARY_PATHS)
    left = " OR ".join(f"json_type(x, '{path}') IS NOT NULL" for path in _SUMMARY_PATHS)
    return (
        f"(SELECT {left} OR json_type(json_remove(x, '$.diagnostics'), '$.diagnostics')"
        f" IS NOT NULL FROM (SELECT json_remove({payload}, {paths}) AS x))"
    )


def _upkeep_triggers() -> tuple[str, ...]:
    """Keep every row's summary what SQLite reads from its payload, whoever writes the row.

    The store's writer sets the summary from each checkpoint, and then these
    triggers find it right and do nothing. Any other write (a row inserted or
    restored by hand, an upsert with a new ``seq`` and a stale or no summary, a
    summary edited alone) is corrected at once: the route scan, which reads only
    the summary, can never see other than the payload. (The guard is compared as
    JSON, so the writer's spacing does not count as a difference.)

    A payload holding a key the summary reads twice is refused: SQLite's JSON
    reads the first of two equal keys and Python's the last, so such a payload
    could show the route scan one guard and the run another. One trigger per
    event does both, since each trigger a row fires costs about as much as its
    checks (schema version 4; version 3 had two).
    """
    payload = "NEW.payload"
    derived = dict(zip(SUMMARY_NAMES, _summary_of(payload), strict=True))

    def current(column: str) -> str:
        return f"json(NEW.{column})" if column == "guard" else f"NEW.{column}"

    differs = " OR ".join(f"{current(c)} IS NOT ({derived[c]})" for c in SUMMARY_NAMES)
    twice = _holds_a_key_twice(payload)
    assign = ", ".join(f"{column} = {sql}" for column, sql in derived.items())
    return tuple(
        f"""CREATE TRIGGER checkpoint_latest_upkeep_{name} AFTER {event} ON checkpoint_latest
        WHEN {differs} OR {twice}
        BEGIN SELECT RAISE(ABORT, 'checkpoint payload holds a key twice') WHERE {twice};
        UPDATE checkpoint_latest SET {assign} WHERE rowid = NEW.rowid; END"""
        for name, event in (("on_insert", "INSERT"), ("on_update", "UPDATE"))
    )


_LATEST_INDEXES = (
    "CREATE UNIQUE INDEX checkpoint_latest_by_partition"
    f" ON checkpoint_latest ({ROUTE_KEY}, partition_id)",
    # the route scan's index: guard groups of one target table, without the rows
    "CREATE INDEX checkpoint_latest_by_target ON checkpoint_latest"
    " (target_location, target_table COLLATE NOCASE, guard, status, partition_id)",
    # the store/target cross-check: the ledger batches of one target table, and their statuses
    "CREATE INDEX checkpoint_latest_by_batch ON checkpoint_latest"
    " (target_location, target_table COLLATE NOCASE, ledger_batch, status)",
)
_UPKEEP_TRIGGERS = _upkeep_triggers()
_V3_LEASE_TABLE = """CREATE TABLE lease (
    lease_key TEXT PRIMARY KEY, token TEXT NOT NULL, expires_at REAL NOT NULL,
    record TEXT NOT NULL) WITHOUT ROWID"""
_LEASE_EPOCH = "ALTER TABLE lease ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0"
_INDEXES = (
    f"CREATE INDEX checkpoint_history_by_route ON checkpoint_history ({ROUTE_KEY}, seq)",
    f"CREATE INDEX evidence_by_route ON evidence ({ROUTE_KEY}, seq)",
    f"CREATE INDEX audit_by_route ON audit ({ROUTE_KEY}, audit_id)",
)
_SOURCE_STATE = f"""CREATE TABLE source_state (
    {_NAMES}, state TEXT NOT NULL, {_LOCATIONS},
    PRIMARY KEY ({ROUTE_KEY})) WITHOUT ROWID"""
_EVIDENCE = f"""CREATE TABLE evidence (
    {_NAMES}, run_id TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL, {_LOCATIONS},
    PRIMARY KEY ({ROUTE_KEY}, run_id)) WITHOUT ROWID"""

SCHEMA = (
    f"""CREATE TABLE checkpoint_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, {_NAMES},
        partition_id TEXT NOT NULL, payload TEXT NOT NULL, {_LOCATIONS})""",
    # A rowid table: an upsert writes its row (about 1 KB) once and small index entries;
    # WITHOUT ROWID would keep whole rows in the key's B-tree and write about twice as much.
    f"""CREATE TABLE checkpoint_latest (
        {_NAMES}, partition_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
        status TEXT, query_hash TEXT, schema_hash TEXT, guard TEXT, {_LOCATIONS},
        ledger_batch TEXT)""",
    _SOURCE_STATE,
    _EVIDENCE,
    f"""CREATE TABLE audit (
        audit_id INTEGER PRIMARY KEY AUTOINCREMENT, {_NAMES}, record TEXT NOT NULL,
        {_LOCATIONS})""",
    _V3_LEASE_TABLE,
    _LEASE_EPOCH,
    *_INDEXES,
    *_LATEST_INDEXES,
    *_UPKEEP_TRIGGERS,
)

_V1_NAMES = ROUTE_NAMES[:3]
_V1_TABLES = {
    "checkpoint_history": ("seq", *_V1_NAMES, "partition_id", "payload"),
    "checkpoint_latest": (*_V1_NAMES, "partition_id", "seq", "payload"),
    "source_state": (*_V1_NAMES, "state"),
    "evidence": (*_V1_NAMES, "run_id", "seq", "record"),
}
_V1_AUDIT = ("audit_id", *_V1_NAMES, "record")
_V2_TABLES = {
    **_V1_TABLES,
    "checkpoint_latest": (*_V1_NAMES, "partition_id", "seq", "payload", *_V2_SUMMARY),
    "audit": _V1_AUDIT,
}
_LOCATION_NAMES = ROUTE_NAMES[3:]
TABLES = {
    "checkpoint_history": (*_V1_TABLES["checkpoint_history"], *_LOCATION_NAMES),
    "checkpoint_latest": (*_V2_TABLES["checkpoint_latest"], *_LOCATION_NAMES, "ledger_batch"),
    "source_state": (*_V1_TABLES["source_state"], *_LOCATION_NAMES),
    "evidence": (*_V1_TABLES["evidence"], *_LOCATION_NAMES),
    "audit": (*_V1_AUDIT, *_LOCATION_NAMES),
    "lease": ("lease_key", "token", "expires_at", "record", "epoch"),
}
_V4_TABLES = {**TABLES, "lease": TABLES["lease"][:-1]}


@contextmanager
def immediate(conn: sqlite3.Connection, *, synced: bool = True) -> Iterator[sqlite3.Connection]:
    """One write transaction, rolled back on any failure. ``synced``: its COMMIT fsyncs the
    WAL (``synchronous=FULL``); else it is durable from the next synced commit on, as the WAL
    is one file written in order (``SQLiteCheckpointStore`` says which writes may wait)."""
    conn.execute(f"PRAGMA synchronous={'FULL' if synced else 'NORMAL'}")  # not inside BEGIN
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))


def table_corrupt(table: str) -> CheckpointStoreCorrupt:
    return CheckpointStoreCorrupt(
        f"checkpoint store table {table!r} is missing or has unexpected columns",
        diagnostics={"table": table},
    )


def _check_tables(conn: sqlite3.Connection, tables: dict[str, tuple[str, ...]]) -> None:
    for table, columns in tables.items():
        if _columns(conn, table) != columns:
            raise table_corrupt(table)


def _version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def check_schema(conn: sqlite3.Connection) -> None:
    """The file is a version-5 store: its version, every table's columns, index and trigger."""
    version = _version(conn)
    if version == 0:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if names and not names & TABLES.keys():  # another application's database: a mistake
            raise ConfigInvalid(
                "the checkpoint store file is another SQLite database, not a checkpoint store; "
                "give the route's own store file (or a new path)",
                diagnostics={"key": "store.path"},
            )
        raise CheckpointStoreCorrupt("file is not a checkpoint store (no schema version)")
    if version != SCHEMA_VERSION:
        raise CheckpointStoreCorrupt(
            f"checkpoint store has unknown schema version {version}, expected {SCHEMA_VERSION}",
            diagnostics={"user_version": version, "expected": SCHEMA_VERSION},
        )
    _check_tables(conn, TABLES)
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    made = {_made_by(statement) for statement in (*_INDEXES, *_LATEST_INDEXES, *_UPKEEP_TRIGGERS)}
    if not made <= names:
        raise table_corrupt("checkpoint_latest")


def _made_by(statement: str) -> str:
    """The object a CREATE INDEX or CREATE TRIGGER statement makes."""
    words = statement.split()
    return words[words.index("INDEX" if "INDEX" in words[:3] else "TRIGGER") + 1]


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a file of version 1 to 4 to version 5; newer or foreign files are left alone."""
    steps = ((1, _version_1_to_2), (2, _version_2_to_3), (3, _version_3_to_4), (4, _version_4_to_5))
    for version, step in steps:
        if _version(conn) != version:
            continue
        with immediate(conn):
            if _version(conn) == version:
                step(conn)
                conn.execute(f"PRAGMA user_version = {version + 1}")


def _version_1_to_2(conn: sqlite3.Connection) -> None:
    """Rebuild ``checkpoint_latest`` with its summary; give a v1 file without one an audit table.

    A payload SQLite cannot read as JSON fails the whole migration.
    """
    _check_tables(conn, _V1_TABLES)
    if not _columns(conn, "audit"):
        conn.execute(
            f"CREATE TABLE audit (audit_id INTEGER PRIMARY KEY AUTOINCREMENT, {_NAMES},"
            " record TEXT NOT NULL)"
        )
    v1_key = ", ".join(_V1_NAMES)
    conn.execute("ALTER TABLE checkpoint_latest RENAME TO checkpoint_latest_v1")
    conn.execute(
        f"""CREATE TABLE checkpoint_latest (
        {_NAMES}, partition_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
        status TEXT, query_hash TEXT, schema_hash TEXT, guard TEXT)"""
    )
    conn.execute(
        f"INSERT INTO checkpoint_latest ({v1_key}, partition_id, seq, payload,"
        f" {', '.join(_V2_SUMMARY)}) SELECT {v1_key}, partition_id, seq, payload,"
        f" {', '.join(_summary_of('payload', _V2_SUMMARY))} FROM checkpoint_latest_v1"
    )
    conn.execute("DROP TABLE checkpoint_latest_v1")


def _version_2_to_3(conn: sqlite3.Connection) -> None:
    """Locations on every record (``""``: unlocated), the ledger summary, new indexes, leases."""
    _check_tables(conn, _V2_TABLES)
    for row in conn.execute(
        "SELECT type, name FROM sqlite_master WHERE type IN ('index', 'trigger')"
        " AND sql IS NOT NULL"
    ).fetchall():
        conn.execute(f"DROP {row[0].upper()} {row[1]}")
    for table in ("checkpoint_history", "checkpoint_latest", "audit"):
        for name in _LOCATION_NAMES:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE checkpoint_latest ADD COLUMN ledger_batch TEXT")
    # every summary from its payload (an older writer's could be stale)
    summary = zip(SUMMARY_NAMES, _summary_of("payload"), strict=True)
    conn.execute("UPDATE checkpoint_latest SET " + ", ".join(f"{c} = {sql}" for c, sql in summary))
    _block_keys_twice(conn)
    for table, create in (("source_state", _SOURCE_STATE), ("evidence", _EVIDENCE)):
        names = ", ".join(_V2_TABLES[table])
        conn.execute(f"ALTER TABLE {table} RENAME TO {table}_v2")
        conn.execute(create)
        conn.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {table}_v2")
        conn.execute(f"DROP TABLE {table}_v2")
    conn.execute(_V3_LEASE_TABLE)
    for statement in (*_INDEXES, *_LATEST_INDEXES, *_UPKEEP_TRIGGERS):
        conn.execute(statement)


def _version_3_to_4(conn: sqlite3.Connection) -> None:
    """One upkeep trigger per event; a payload with a key twice, even a ``null``, now blocks."""
    _check_tables(conn, _V4_TABLES)
    for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'checkpoint_latest'"
    ).fetchall():
        conn.execute(f'DROP TRIGGER "{name}"')
    _block_keys_twice(conn)
    for statement in _UPKEEP_TRIGGERS:
        conn.execute(statement)


def _version_4_to_5(conn: sqlite3.Connection) -> None:
    """Lease epochs: every key's next take gets epoch 1 or more."""
    _check_tables(conn, _V4_TABLES)
    conn.execute(_LEASE_EPOCH)


def _block_keys_twice(conn: sqlite3.Connection) -> None:
    """Give a payload holding a key twice a guard no reader accepts: its route blocks.

    Run with no upkeep trigger in place, which would refuse the update.
    """
    conn.execute(
        "UPDATE checkpoint_latest SET guard = '\"payload holds a key twice\"'"
        f" WHERE {_holds_a_key_twice('payload')}"
    )
