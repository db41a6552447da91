"""Checkpoint, route-state and operator-audit store on a shared PostgreSQL server (psycopg 3).

For Airflow workers on many machines that share one store. The tables, the
validation and the ordering rules are those of ``SQLiteCheckpointStore``; the
encoding and decoding helpers are the very same functions.

Payloads and records are TEXT holding the JSON the codec wrote, not JSONB.
TEXT gives back exactly the bytes that were written, so a payload round-trips
byte for byte, a corrupt value is detected by the same JSON check as in
SQLite, and nothing depends on how JSONB would re-order keys, rewrite numbers
or reject ``\\u0000``. No query looks inside a payload, so JSONB would buy nothing.

The schema (``dpone`` unless told otherwise) is created on first use, complete
or not at all, in one transaction that holds a transaction-level advisory
lock, so workers that start together cannot race. Its ``meta`` table holds the
schema version. A schema with our tables but no version, an unknown version, or
a table with unexpected columns is reported as corrupt, never silently reused.
Key columns use the ``"C"`` collation so that ordering is by code point, as in
SQLite and in Python, whatever the database's locale.

Each store object holds one connection, autocommit off, and runs every call in
its own explicit transaction. Every write also takes an advisory lock on its
route, so writes to one route are serialised as SQLite serialises all writes:
history order is commit order and evidence order is well defined. That orders
single writes only; it does not stop two workers running one route (see
``docs/compatibility.md``). A connection that breaks is not re-opened: the
call raises ``CheckpointStoreUnavailable`` and the caller opens a new store.
Like the SQLite store, one store object serves one thread at a time.

Errors raised here never carry the DSN, host, user, password or the driver's
message text; diagnostics hold at most the SQLSTATE, the driver's error class and the
class of failure (``drivers.ServerFailure``: a refused login, database or privilege is
``CheckpointStoreAccessRefused``, exit 2).
PostgreSQL text cannot hold NUL, so a route key or partition id containing one
is refused by the driver before anything is written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..checkpoints import PartitionCheckpoint, RouteKey
from ..drivers import ServerFailure, import_driver, postgres_connect, postgres_failure
from ..errors import (
    CheckpointStoreAccessRefused,
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ConfigInvalid,
    LeaseLost,
    NativeTransferError,
)
from ..lease import LeaseClaim, clock_epoch
from ._codec import (
    ROUTE_NAMES,
    check_run_id,
    encode_batch,
    encode_object,
    encode_resolution,
    route_params,
)
from ._records import (
    OwnConnection,
    RecordReads,
    adopted,
    check_expected,
    decode_checkpoint,
    load_object,
    stored_route,
)

__all__ = ["SCHEMA_VERSION", "PostgresCheckpointStore"]

SCHEMA_VERSION = 3

_T = TypeVar("_T")

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_KEY = 'TEXT COLLATE "C" NOT NULL'
_ROUTE_COLUMNS = f"source_table {_KEY}, target_table {_KEY}, strategy {_KEY}"
# Appended last, as ALTER TABLE ADD COLUMN leaves them in a migrated schema ("": unlocated).
_LOCATIONS = f"source_location {_KEY} DEFAULT '', target_location {_KEY} DEFAULT ''"
_ROUTE_KEY = ", ".join(ROUTE_NAMES)
_ROUTE = " AND ".join(f"{name} = %s" for name in ROUTE_NAMES)
_ROUTE_VALUES = ", ".join("%s" for _ in ROUTE_NAMES)
# Every checkpoint into one target table: located ones of its database, and, failing closed,
# unlocated ones whose name matches ignoring case. Parameters: location, table, table.
_TARGET_SCOPE = (
    "((target_location = %s AND target_table = %s)"
    " OR (target_location = '' AND lower(target_table) = lower(%s)))"
)
_INDEXES = (
    ("checkpoint_history_by_route", "checkpoint_history", f"{_ROUTE_KEY}, seq"),
    ("checkpoint_latest_by_target", "checkpoint_latest", "target_location, target_table"),
    ("evidence_by_route", "evidence", f"{_ROUTE_KEY}, seq"),
    ("audit_by_route", "audit", f"{_ROUTE_KEY}, audit_id"),
)
# Tables keyed by route (their primary keys gain the locations in version 2).
_KEYED = {"checkpoint_latest": ", partition_id", "source_state": "", "evidence": ", run_id"}


def _lease_table(s: str) -> str:
    return f"""CREATE TABLE {s}.lease (
        lease_key {_KEY} PRIMARY KEY, token TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL,
        record TEXT NOT NULL)"""


def _lease_epoch(s: str) -> str:
    """Version 2 to 3: an epoch per lease key that only grows (kept when a lease is released)."""
    return f"ALTER TABLE {s}.lease ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0"


def _indexes(s: str) -> tuple[str, ...]:
    return tuple(f"CREATE INDEX {name} ON {s}.{table} ({key})" for name, table, key in _INDEXES)


def _schema_statements(s: str) -> tuple[str, ...]:
    """DDL of schema version 3; ``s`` is the quoted schema name."""
    return (
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"CREATE TABLE {s}.meta (key {_KEY} PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE {s}.checkpoint_history (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {_ROUTE_COLUMNS},
            partition_id {_KEY}, payload TEXT NOT NULL, {_LOCATIONS})""",
        f"""CREATE TABLE {s}.checkpoint_latest (
            {_ROUTE_COLUMNS}, partition_id {_KEY}, seq BIGINT NOT NULL, payload TEXT NOT NULL,
            {_LOCATIONS}, PRIMARY KEY ({_ROUTE_KEY}, partition_id))""",
        f"""CREATE TABLE {s}.source_state (
            {_ROUTE_COLUMNS}, state TEXT NOT NULL, {_LOCATIONS}, PRIMARY KEY ({_ROUTE_KEY}))""",
        f"""CREATE TABLE {s}.evidence (
            {_ROUTE_COLUMNS}, run_id {_KEY}, seq BIGINT NOT NULL, record TEXT NOT NULL,
            {_LOCATIONS}, PRIMARY KEY ({_ROUTE_KEY}, run_id))""",
        f"""CREATE TABLE {s}.audit (
            audit_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {_ROUTE_COLUMNS},
            record TEXT NOT NULL, {_LOCATIONS})""",
        _lease_table(s),
        _lease_epoch(s),
        *_indexes(s),
    )


def _migration_statements(s: str) -> tuple[str, ...]:
    """Version 1 to 2: locations on every record and in every key, the scope index, leases."""
    statements = [f"DROP INDEX {s}.{name}" for name, _, _ in _INDEXES if name != _INDEXES[1][0]]
    for table in ("checkpoint_history", "checkpoint_latest", "source_state", "evidence", "audit"):
        statements.append(
            f"ALTER TABLE {s}.{table} ADD COLUMN source_location {_KEY} DEFAULT '',"
            f" ADD COLUMN target_location {_KEY} DEFAULT ''"
        )
    for table, rest in _KEYED.items():
        statements.append(
            f"ALTER TABLE {s}.{table} DROP CONSTRAINT {table}_pkey,"
            f" ADD PRIMARY KEY ({_ROUTE_KEY}{rest})"
        )
    return (*statements, _lease_table(s), *_indexes(s))


# "name type[ collate C]" of every column, in order, as information_schema reports them.
_C_ROUTE = ("source_table text C", "target_table text C", "strategy text C")
_C_LOCATIONS = ("source_location text C", "target_location text C")
_TABLES = {
    "meta": ("key text C", "value text"),
    "checkpoint_history": (
        "seq bigint", *_C_ROUTE, "partition_id text C", "payload text", *_C_LOCATIONS
    ),
    "checkpoint_latest": (
        *_C_ROUTE, "partition_id text C", "seq bigint", "payload text", *_C_LOCATIONS
    ),
    "source_state": (*_C_ROUTE, "state text", *_C_LOCATIONS),
    "evidence": (*_C_ROUTE, "run_id text C", "seq bigint", "record text", *_C_LOCATIONS),
    "audit": ("audit_id bigint", *_C_ROUTE, "record text", *_C_LOCATIONS),
    "lease": (
        "lease_key text C", "token text", "expires_at double precision", "record text",
        "epoch bigint",
    ),
}  # fmt: skip
_V2_TABLES = {**_TABLES, "lease": _TABLES["lease"][:-1]}
_V1_TABLES = {
    table: tuple(column for column in columns if column not in _C_LOCATIONS)
    for table, columns in _TABLES.items()
    if table != "lease"
}
_COLUMNS = """SELECT table_name, concat_ws(' ', column_name, data_type, collation_name)
    FROM information_schema.columns WHERE table_schema = %s ORDER BY table_name, ordinal_position"""


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key; stable across processes, unlike ``hash``."""
    text = json.dumps(["dpone_native_transfer", *parts])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


def _store_failure(failure: ServerFailure, action: str) -> NativeTransferError:
    """``CheckpointStoreUnavailable`` (exit 1), or ``CheckpointStoreAccessRefused`` (exit 2)
    when the server refused the login, has no such database, or the login lacks a privilege.
    """
    error_type = "OperationalError" if failure.cause is None else type(failure.cause).__name__
    return failure.error(
        f"checkpoint store cannot be {action}",
        retry=CheckpointStoreUnavailable,
        refused=CheckpointStoreAccessRefused,
        diagnostics={"action": action, "error_type": error_type},
        fix="fix the store DSN (its user, password, database or options)"
        " or the login's privileges or settings",
        nothing_written=False,  # a failed commit may follow a target that was written
    )


def _store_error(driver: Any, exc: Any, action: str) -> NativeTransferError | None:
    """The store error for a driver error, built from its SQLSTATE and class name only
    (``drivers.postgres_failure``): unavailable or refused, else corrupt.

    None for a client-side misuse (no SQLSTATE), which propagates unchanged as it does in SQLite.
    """
    failure = postgres_failure(driver, exc)
    if failure is not None:
        return _store_failure(failure, action)
    sqlstate = exc.sqlstate
    diagnostics = {"action": action, "error_type": type(exc).__name__}
    if sqlstate:
        diagnostics["sqlstate"] = sqlstate
    if isinstance(exc, driver.OperationalError):  # a lock or statement timeout, a cancel
        return CheckpointStoreUnavailable(
            f"checkpoint store cannot be {action} now; a retry may succeed",
            diagnostics=diagnostics,
        )
    if sqlstate is None:
        return None
    return CheckpointStoreCorrupt(f"checkpoint store cannot be {action}", diagnostics=diagnostics)


def _attempt(driver: Any, action: str, work: Callable[[], _T]) -> _T:
    """``work()``, with driver errors translated; raised outside ``except`` so none is chained."""
    try:
        return work()
    except driver.Error as exc:
        error = _store_error(driver, exc, action)
        if error is None:
            raise
    raise error


def _in_transaction(driver: Any, action: str, conn: Any, work: Callable[[Any], _T]) -> _T:
    def run() -> _T:
        with conn.transaction():
            return work(conn)

    return _attempt(driver, action, run)


def _connect(driver: Any, dsn: str) -> Any:
    """A connection whose lock waits end after ``LOCK_WAIT_SECONDS``, as a SQLite store's busy
    timeout does: a writer stopped inside one of its transactions (SIGSTOP, a frozen VM)
    holds its route's lock, and every later write of that route, or a take of its lease,
    waited for as long as it was stopped. Past the wait, ``CheckpointStoreUnavailable``
    (exit 1), nothing written. The server ends such a writer's session once its transaction
    has been idle ``IDLE_SECONDS`` (every call is one short transaction),
    rolling it back, so the writers waiting then go on: before, each run failed until the
    stopped one resumed or died. The stopped one, resumed, finds its connection gone
    (``CheckpointStoreUnavailable``)."""
    if not isinstance(dsn, str):
        raise ConfigInvalid("the PostgreSQL DSN must be a string", diagnostics={"key": "dsn"})
    conn = postgres_connect(
        driver, dsn, what="PostgreSQL", failed=lambda failure: _store_failure(failure, "opened")
    )
    try:
        wait = f"SET lock_timeout = '{LOCK_WAIT_SECONDS * 1000:.0f}ms'"  # for the session
        idle = f"SET idle_in_transaction_session_timeout = '{IDLE_SECONDS * 1000:.0f}ms'"
        _in_transaction(driver, "opened", conn, lambda c: (c.execute(wait), c.execute(idle)))
    except BaseException:
        conn.close()
        raise
    return conn


LOCK_WAIT_SECONDS = 30.0
IDLE_SECONDS = 10.0  # idle in a transaction: well under the lock wait; a call's gaps are ms


def _table_corrupt(table: str) -> CheckpointStoreCorrupt:
    return CheckpointStoreCorrupt(
        f"checkpoint store table {table!r} is missing or has unexpected columns",
        diagnostics={"table": table},
    )


def _check_tables(found: dict[str, tuple[str, ...]], tables: dict[str, tuple[str, ...]]) -> None:
    for table, columns in tables.items():
        if found.get(table) != columns:
            raise _table_corrupt(table)


def _prepare_schema(conn: Any, schema: str, create: bool = True) -> None:
    """Create the schema if absent (unless not ``create``), migrate version 1, check it;
    caller commits."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("schema", schema),))
    found: dict[str, tuple[str, ...]] = {}
    for table, column in conn.execute(_COLUMNS, (schema,)):
        found[table] = (*found.get(table, ()), column)
    s = f'"{schema}"'
    if "meta" not in found:
        if found.keys() & _TABLES.keys():
            raise CheckpointStoreCorrupt("schema holds checkpoint tables but no schema version")
        if not create:  # an operator's command on the wrong database must not make a store
            raise ConfigInvalid(
                f"the database holds no checkpoint store (schema {schema!r} does not exist); "
                "check the DSN's database, or run a route first",
                diagnostics={"schema": schema},
            )
        for statement in _schema_statements(s):
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s)",
            (str(SCHEMA_VERSION),),
        )
        return
    if found["meta"] != _TABLES["meta"]:
        raise _table_corrupt("meta")
    row = conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise CheckpointStoreCorrupt("schema is not a checkpoint store (no schema version)")
    if row[0] in ("1", "2"):
        _check_tables(found, _V1_TABLES if row[0] == "1" else _V2_TABLES)
        steps = [*(_migration_statements(s) if row[0] == "1" else ()), _lease_epoch(s)]
        for statement in steps:
            conn.execute(statement)
        conn.execute(
            f"UPDATE {s}.meta SET value = %s WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
        )
        return
    if row[0] != str(SCHEMA_VERSION):
        version = int(row[0]) if row[0].isdigit() else None
        raise CheckpointStoreCorrupt(
            f"checkpoint store has an unknown schema version, expected {SCHEMA_VERSION}",
            diagnostics={"schema_version": version, "expected": SCHEMA_VERSION},
        )
    _check_tables(found, _TABLES)


class PostgresCheckpointStore(OwnConnection, RecordReads):
    """Checkpoints (latest and history), source state, evidence, audit and leases in one schema.

    Behaves like ``SQLiteCheckpointStore``: ``upsert_many`` is one transaction,
    ``list_latest`` is one primary-key range read, and re-recording evidence for
    a run id replaces the record but keeps its place.
    """

    _route_filter = _ROUTE

    def __init__(self, dsn: str, *, schema: str = "dpone", create: bool = True) -> None:
        self._conn: Any = None
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigInvalid(
                "schema must be a lowercase PostgreSQL identifier (a-z, 0-9, _)",
                diagnostics={"key": "schema"},
            )
        self._driver = import_driver("psycopg", needed_by="PostgresCheckpointStore")
        self._dsn = dsn
        self._schema = schema
        self._s = f'"{schema}"'
        conn = _connect(self._driver, dsn)
        try:
            _in_transaction(
                self._driver, "opened", conn, lambda c: _prepare_schema(c, schema, create)
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _transaction(
        self,
        action: str,
        work: Callable[[Any], _T],
        holding: LeaseClaim | None = None,
        route: RouteKey | None = None,
    ) -> _T:
        """``work(conn)`` in one transaction, committed or rolled back as a whole; with
        ``holding``, only while that lease is held (its row read ``FOR SHARE``, so a take
        waits for the write to commit)."""

        def held(conn: Any) -> _T:
            if holding is not None and route is not None:
                found = conn.execute(
                    f"SELECT 1 FROM {self._s}.lease WHERE lease_key = %s AND token = %s"
                    " AND expires_at > %s FOR SHARE",
                    (holding.key, holding.token, time.time()),
                ).fetchone()
                if found is None:
                    raise LeaseLost.lost(route)
            return work(conn)

        return _in_transaction(self._driver, action, self._connection(), held)

    def _table(self, name: str) -> str:
        return f"{self._s}.{name}"

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._transaction("read", lambda conn: conn.execute(sql, params).fetchall())

    def _lock_routes(self, conn: Any, routes: Iterable[tuple[str, ...]]) -> None:
        """Serialise writes per route; keys in sorted order, so two batches cannot deadlock."""
        for key in sorted({_lock_key("route", self._schema, *route) for route in routes}):
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def _insert_checkpoints(self, conn: Any, rows: list[tuple[str, ...]]) -> None:
        """History rows, then the latest pointers, in order; the caller commits.

        One ``executemany`` appends the history rows (pipelined, returning each
        ``seq``); one statement then upserts the latest pointers. Where the batch
        holds a partition more than once, only its last row is upserted (one
        statement may not update a row twice), so the later item wins as before.
        """
        if not rows:
            return
        width = len(ROUTE_NAMES)
        self._lock_routes(conn, (row[:width] for row in rows))
        s = self._s
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {s}.checkpoint_history ({_ROUTE_KEY}, partition_id, payload)"
                f" VALUES ({_ROUTE_VALUES}, %s, %s) RETURNING seq",
                rows,
                returning=True,
            )
            seqs = []
            while True:
                seqs.append(cursor.fetchone()[0])
                if not cursor.nextset():
                    break
            latest = {
                row[: width + 1]: (*row[: width + 1], seq, row[width + 1])
                for row, seq in zip(rows, seqs, strict=True)
            }
            columns = list(zip(*latest.values(), strict=True))
            arrays = ", ".join(["%s::text[]"] * (width + 1) + ["%s::bigint[]", "%s::text[]"])
            cursor.execute(
                f"INSERT INTO {s}.checkpoint_latest ({_ROUTE_KEY}, partition_id, seq, payload)"
                f" SELECT * FROM unnest({arrays})"
                f" ON CONFLICT ({_ROUTE_KEY}, partition_id)"
                " DO UPDATE SET seq = excluded.seq, payload = excluded.payload",
                [list(column) for column in columns],
            )

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(
        self, checkpoints: Iterable[PartitionCheckpoint], *, holding: LeaseClaim | None = None
    ) -> None:
        """One transaction; with ``holding``, only while that lease is held (``LeaseStore``)."""
        items = list(checkpoints)
        rows = encode_batch(items)
        if not rows:
            return
        write = functools.partial(self._insert_checkpoints, rows=rows)
        self._transaction("written", write, holding, items[0].route)

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        return self._checkpoints("checkpoint_latest", "partition_id", route)

    def list_target_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every route's latest checkpoints into ``route``'s target table (``TargetScopeStore``)."""
        rows = self._read(
            f"SELECT {_ROUTE_KEY}, partition_id, seq, payload FROM {self._s}.checkpoint_latest"
            f" WHERE {_TARGET_SCOPE} ORDER BY {_ROUTE_KEY}, partition_id",
            (route.target_location or "", route.target_table, route.target_table),
        )
        width = len(ROUTE_NAMES)
        return [decode_checkpoint(stored_route(row[:width]), *row[width:]) for row in rows]

    def adopt_unlocated(self, route: RouteKey) -> int:
        """Move the unlocated twin's latest checkpoints and source state to ``route``, at once."""
        if not route.located:
            return 0
        twin = route.unlocated()
        s = self._s

        def adopt(conn: Any) -> int:
            self._lock_routes(conn, [route_params(route), route_params(twin)])
            found, moved = adopted(conn.execute, f"{s}.checkpoint_latest", _ROUTE, route)
            if found:
                self._insert_checkpoints(conn, encode_batch(moved))
                conn.execute(
                    f"DELETE FROM {s}.checkpoint_latest WHERE {_ROUTE}", route_params(twin)
                )
            conn.execute(
                f"INSERT INTO {s}.source_state ({_ROUTE_KEY}, state)"
                f" SELECT %s, %s, %s, %s, %s, state FROM {s}.source_state WHERE {_ROUTE}"
                " ON CONFLICT DO NOTHING",
                (*route_params(route), *route_params(twin)),
            )
            conn.execute(f"DELETE FROM {s}.source_state WHERE {_ROUTE}", route_params(twin))
            return found

        return self._transaction("written", adopt)

    def history(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every checkpoint written for ``route``, oldest first."""
        return self._checkpoints("checkpoint_history", "seq", route)

    def _checkpoints(self, table: str, order: str, route: RouteKey) -> list[PartitionCheckpoint]:
        """One range read of ``route`` on the table's (route, ``order``) index, decoded."""
        rows = self._read(
            f"SELECT partition_id, seq, payload FROM {self._s}.{table} WHERE {_ROUTE}"
            f" ORDER BY {order}",
            route_params(route),
        )
        return [decode_checkpoint(route, *row) for row in rows]

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        rows = self._read(
            f"SELECT state FROM {self._s}.source_state WHERE {_ROUTE}", route_params(route)
        )
        if not rows:
            return None
        return load_object(rows[0][0], "stored source state", {"route": route.as_dict()})

    def save_source_state(
        self, route: RouteKey, state: dict[str, Any], *, holding: LeaseClaim | None = None
    ) -> None:
        text = encode_object(state, "source state")
        save = functools.partial(self._save_state, route=route, text=text)
        self._transaction("written", save, holding, route)

    def _save_state(self, conn: Any, route: RouteKey, text: str) -> None:
        params = route_params(route)
        self._lock_routes(conn, [params])
        conn.execute(
            f"INSERT INTO {self._s}.source_state ({_ROUTE_KEY}, state)"
            f" VALUES ({_ROUTE_VALUES}, %s)"
            f" ON CONFLICT ({_ROUTE_KEY}) DO UPDATE SET state = excluded.state",
            (*params, text),
        )

    def record_evidence(
        self,
        route: RouteKey,
        run_id: str,
        record: dict[str, Any],
        *,
        holding: LeaseClaim | None = None,
    ) -> None:
        check_run_id(run_id)
        text = encode_object(record, "evidence record")
        params = route_params(route)
        s = self._s

        def write(conn: Any) -> None:
            self._lock_routes(conn, [params])
            conn.execute(
                f"INSERT INTO {s}.evidence ({_ROUTE_KEY}, run_id, seq, record)"
                f" VALUES ({_ROUTE_VALUES}, %s,"
                f" (SELECT COALESCE(MAX(seq), 0) + 1 FROM {s}.evidence WHERE {_ROUTE}), %s)"
                f" ON CONFLICT ({_ROUTE_KEY}, run_id) DO UPDATE SET record = excluded.record",
                (*params, run_id, *params, text),
            )

        self._transaction("written", write, holding, route)

    def apply_resolution(
        self,
        route: RouteKey,
        checkpoints: Sequence[PartitionCheckpoint],
        audit: dict[str, Any],
        *,
        expected: Sequence[PartitionCheckpoint] = (),
        source_state: dict[str, Any] | None = None,
        holding: LeaseClaim | None = None,
    ) -> int:
        """One transaction: the checkpoints, the audit record (and a source state), or nothing.

        ``expected`` makes it a compare-and-set, as in ``SQLiteCheckpointStore``.
        """
        rows, record = encode_resolution(
            route, checkpoints, audit, with_state=source_state is not None
        )
        state = None if source_state is None else encode_object(source_state, "source state")

        def write(conn: Any) -> int:
            self._lock_routes(conn, [route_params(cp.route) for cp in checkpoints])
            check_expected(expected, lambda cp: self._latest_of(conn, cp))
            self._insert_checkpoints(conn, rows)
            if state is not None:
                self._save_state(conn, route, state)
            return conn.execute(
                f"INSERT INTO {self._s}.audit ({_ROUTE_KEY}, record)"
                f" VALUES ({_ROUTE_VALUES}, %s) RETURNING audit_id",
                (*route_params(route), record),
            ).fetchone()[0]

        return self._transaction("written", write, holding, route)

    def _latest_of(self, conn: Any, checkpoint: PartitionCheckpoint) -> PartitionCheckpoint | None:
        row = conn.execute(
            f"SELECT seq, payload FROM {self._s}.checkpoint_latest"
            f" WHERE {_ROUTE} AND partition_id = %s",
            (*route_params(checkpoint.route), checkpoint.partition_id),
        ).fetchone()
        if row is None:
            return None
        return decode_checkpoint(checkpoint.route, checkpoint.partition_id, *row)

    def lease_table(self) -> _LeaseTable:
        """Lease operations on a connection of their own (the heartbeat runs in a thread)."""
        self._connection()  # a closed store leases nothing
        return _LeaseTable(self._driver, _connect(self._driver, self._dsn), self._s)


class _LeaseTable:
    """``LeaseTable`` on its own connection; one call at a time."""

    def __init__(self, driver: Any, conn: Any, schema: str) -> None:
        self._driver = driver
        self._conn = conn
        self._s = schema
        self._lock = threading.Lock()

    def _run(self, sql: str, params: tuple[Any, ...]) -> tuple[int, Any]:
        """(rows affected, first row or None) of one statement in its own transaction."""

        def run(conn: Any) -> tuple[int, Any]:
            cursor = conn.execute(sql, params)
            return cursor.rowcount, cursor.fetchone() if cursor.description else None

        with self._lock:
            return _in_transaction(self._driver, "written", self._conn, run)

    def take(
        self,
        key: str,
        token: str,
        expires_at: float,
        record: str,
        now: float,
        *,
        replacing: str | None = None,
    ) -> int | None:
        row = self._run(
            f"INSERT INTO {self._s}.lease AS held (lease_key, token, expires_at, record, epoch)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (lease_key) DO UPDATE SET"
            " token = excluded.token, expires_at = excluded.expires_at,"
            " record = excluded.record, epoch = greatest(held.epoch + 1, excluded.epoch)"
            " WHERE held.expires_at <= %s OR held.token = excluded.token OR held.record = %s"
            " RETURNING token, epoch",
            (key, token, expires_at, record, clock_epoch(now), now, replacing),
        )[1]
        return row[1] if row is not None and row[0] == token else None

    def raise_epoch(self, key: str, token: str, epoch: int) -> int | None:
        row = self._run(
            f"UPDATE {self._s}.lease SET epoch = greatest(epoch, %s)"
            " WHERE lease_key = %s AND token = %s RETURNING epoch",
            (epoch, key, token),
        )[1]
        return None if row is None else row[0]

    def renew(self, key: str, token: str, expires_at: float, record: str) -> bool:
        changed, _ = self._run(
            f"UPDATE {self._s}.lease SET expires_at = %s, record = %s"
            " WHERE lease_key = %s AND token = %s",
            (expires_at, record, key, token),
        )
        return changed == 1

    def release(self, key: str, token: str) -> None:
        self._run(
            f"UPDATE {self._s}.lease SET token = '', expires_at = 0"
            " WHERE lease_key = %s AND token = %s",
            (key, token),
        )

    def holder(self, key: str, now: float) -> str | None:
        row = self._run(
            f"SELECT record FROM {self._s}.lease WHERE lease_key = %s AND expires_at > %s",
            (key, now),
        )[1]
        return None if row is None else row[0]

    def holders(self, now: float) -> list[str]:
        def read(conn: Any) -> list[str]:
            rows = conn.execute(
                f"SELECT record FROM {self._s}.lease WHERE expires_at > %s ORDER BY lease_key",
                (now,),
            ).fetchall()
            return [row[0] for row in rows]

        with self._lock:
            return _in_transaction(self._driver, "read", self._conn, read)

    def close(self) -> None:
        self._conn.close()
